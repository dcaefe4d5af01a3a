// Failure propagation end to end in one process: 4 ranks as threads, each with
// a Gloo process group over loopback and a Muon optimizer whose agent talks to
// ONE in-process CoordinatorService with a short heartbeat timeout. One rank
// stops: its heartbeats stop (its coordination client is "frozen", as a
// SIGSTOPped or unreachable process) and it stops taking part in steps. Every
// other rank's Step must return Aborted naming that rank (the coordinator's
// "rank 3 lost") within 2x the heartbeat timeout, well before the Gloo timeout:
// the job error aborts their pending collectives.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "comm/gloo_communicator.h"
#include "common/status_macros.h"
#include "coordination/coordination_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"
#include "tests/client/rank_threads.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::RunOnRanks;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr int kStopped = 3;
constexpr absl::Duration kHeartbeatTimeout = absl::Milliseconds(400);
// Longer than the bound checked, so only an abort can meet it.
constexpr absl::Duration kGlooTimeout = absl::Seconds(20);

// Forwards to another client; once frozen, Heartbeat and ReportStep fail as
// an unreachable (or stopped) process's would: the coordinator hears
// nothing more from this rank.
class FreezableClient final : public CoordinationClient {
 public:
  explicit FreezableClient(CoordinationClient* inner) : inner_(inner) {}
  void Freeze() { frozen_.store(true); }

  absl::StatusOr<v1::JoinResponse> Join(
      const v1::JoinRequest& request) override {
    return inner_->Join(request);
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request) override {
    if (frozen_.load()) return absl::UnavailableError("frozen");
    return inner_->Heartbeat(request);
  }
  absl::Status ReportStep(const v1::StepReport& report) override {
    if (frozen_.load()) return absl::UnavailableError("frozen");
    return inner_->ReportStep(report);
  }
  absl::Status KeySet(const std::string& key,
                      const std::string& value) override {
    return inner_->KeySet(key, value);
  }
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override {
    return inner_->KeyGet(key, timeout);
  }
  absl::StatusOr<v1::JobInfo> GetJob() override { return inner_->GetJob(); }
  absl::StatusOr<v1::Plan> GetPlan() override { return inner_->GetPlan(); }
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override {
    return inner_->GetAssignments();
  }
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override {
    return inner_->ListRanks();
  }

 private:
  CoordinationClient* const inner_;  // Not owned.
  std::atomic<bool> frozen_{false};
};

// Four replicated 16x16 matrices (DDP): every rank owns one, so every rank
// takes part in every step's collectives.
std::vector<Parameter> MakeParams() {
  std::vector<Parameter> params;
  for (int i = 0; i < 4; ++i) {
    Parameter p;
    p.name = absl::StrCat("layers.", i, ".weight");
    p.local_shape = {16, 16};
    p.data.resize(256);
    p.grad.resize(256);
    for (int j = 0; j < 256; ++j) {
      p.data[j] = 0.01f * ((j * 7 + i) % 13);
      p.grad[j] = 0.02f * ((j * 5 + 3 * i) % 11) - 0.1f;
    }
    params.push_back(std::move(p));
  }
  return params;
}

// An in-process coordinator for kWorld ranks and one freezable client per
// rank.
struct World {
  explicit World(absl::Duration heartbeat_timeout) {
    CoordinatorService::Options options;
    options.job_id = "test";
    options.world_size = kWorld;
    options.default_join_timeout = absl::Seconds(10);
    options.heartbeat_timeout = heartbeat_timeout;
    service = std::make_unique<CoordinatorService>(options);
    for (int r = 0; r < kWorld; ++r) {
      locals.push_back(
          std::make_unique<LocalCoordinationClient>(service.get()));
      clients.push_back(std::make_unique<FreezableClient>(locals.back().get()));
    }
  }
  std::unique_ptr<CoordinatorService> service;
  std::vector<std::unique_ptr<LocalCoordinationClient>> locals;
  std::vector<std::unique_ptr<FreezableClient>> clients;
};

// Muon over `params` (DDP over `comm`, joining through `client`).
absl::StatusOr<std::unique_ptr<Muon>> CreateMuon(std::vector<Parameter>* params,
                                                 Communicator* comm,
                                                 CoordinationClient* client,
                                                 uint64_t incarnation) {
  std::vector<Parameter*> ptrs;
  for (Parameter& p : *params) ptrs.push_back(&p);
  AutoConfigOptions o;
  o.ddp = comm;
  o.coordinator = client;
  absl::StatusOr<DistributedConfig> config = CreateAutoConfig(ptrs, o);
  if (!config.ok()) return config.status();
  config->state.join_timeout_ms = 10000;
  config->state.incarnation = incarnation;
  return Muon::Create(ptrs, MuonOptions(), *std::move(config));
}

// Gloo groups of kWorld thread ranks over `clients`' store; empty when one
// failed (the test then fails on the size).
std::vector<std::unique_ptr<GlooCommunicator>> MakeComms(
    const std::vector<std::unique_ptr<FreezableClient>>& clients,
    absl::Duration timeout, const std::string& prefix) {
  std::vector<std::unique_ptr<GlooCommunicator>> comms(kWorld);
  std::vector<absl::Status> created =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        GlooOptions options;
        options.timeout = timeout;
        options.prefix = prefix;
        absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
            GlooCommunicator::Create(rank, kWorld, clients[rank].get(),
                                     options);
        if (!comm.ok()) return comm.status();
        comms[rank] = *std::move(comm);
        return absl::OkStatus();
      });
  for (const absl::Status& s : created) {
    if (!s.ok()) return {};
  }
  return comms;
}

TEST(FailurePropagationTest,
     Step_RankStopsHeartbeating_OthersAbortNamingItWithinTwiceTimeout) {
  World world(kHeartbeatTimeout);
  CoordinatorService& service = *world.service;
  std::vector<std::unique_ptr<FreezableClient>>& clients = world.clients;
  std::vector<std::unique_ptr<GlooCommunicator>> comms =
      MakeComms(clients, kGlooTimeout, "gloo/failure");
  ASSERT_EQ(comms.size(), static_cast<size_t>(kWorld));

  absl::Barrier* first_step_done = new absl::Barrier(kWorld);
  absl::Notification frozen;
  absl::Notification others_done;
  std::atomic<int> others_left{kWorld - 1};
  absl::Time frozen_at;
  std::vector<absl::Status> second_step(kWorld);
  std::vector<absl::Duration> took(kWorld);
  std::vector<absl::Status> statuses =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        std::vector<Parameter> params = MakeParams();
        absl::StatusOr<std::unique_ptr<Muon>> muon = CreateMuon(
            &params, comms[rank].get(), clients[rank].get(), 100 + rank);
        if (!muon.ok()) return muon.status();
        absl::Status first = (*muon)->Step();
        if (first_step_done->Block()) delete first_step_done;
        if (!first.ok()) return first;
        if (rank == kStopped) {
          clients[rank]->Freeze();
          frozen_at = absl::Now();
          frozen.Notify();
          others_done.WaitForNotificationWithTimeout(absl::Seconds(30));
          return absl::OkStatus();
        }
        frozen.WaitForNotification();
        second_step[rank] = (*muon)->Step();
        took[rank] = absl::Now() - frozen_at;
        if (others_left.fetch_sub(1) == 1) others_done.Notify();
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(statuses[r], IsOk()) << r;
  for (int r = 0; r < kWorld; ++r) {
    if (r == kStopped) continue;
    EXPECT_THAT(
        second_step[r],
        StatusIs(absl::StatusCode::kAborted,
                 AllOf(HasSubstr(absl::StrCat("rank ", r, ": step failed")),
                       HasSubstr("rank 3 lost"), HasSubstr("no heartbeat"))))
        << r;
    EXPECT_LT(took[r], 2 * kHeartbeatTimeout) << "rank " << r;
  }
  absl::StatusOr<v1::JobInfo> job = service.GetJob(v1::GetJobRequest());
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->failed_rank(), kStopped);
  comms.clear();
}

// Ranks that call Step a different number of times: rank 3 ends its
// optimizer (leaving the job) after step 1 while the others take step 2.
// Their step fails once their collective gives up, saying which rank
// finished and after which step, without waiting for the coordinator's
// lost-rank timeout.
TEST(FailurePropagationTest,
     Step_PeerFinishedEarlier_ErrorNamesItAndTheStepCountRule) {
  World world(absl::Seconds(30));
  std::vector<std::unique_ptr<FreezableClient>>& clients = world.clients;
  std::vector<std::unique_ptr<GlooCommunicator>> comms =
      MakeComms(clients, absl::Seconds(2), "gloo/finished");
  ASSERT_EQ(comms.size(), static_cast<size_t>(kWorld));
  absl::Notification left;
  std::vector<absl::Status> second_step(kWorld);
  std::vector<absl::Duration> took(kWorld);
  std::vector<absl::Status> statuses =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        std::vector<Parameter> params = MakeParams();
        absl::StatusOr<std::unique_ptr<Muon>> muon = CreateMuon(
            &params, comms[rank].get(), clients[rank].get(), 200 + rank);
        if (!muon.ok()) return muon.status();
        MUON_RETURN_IF_ERROR((*muon)->Step());
        if (rank == kStopped) {
          muon->reset();  // leaves the job (the agent's last heartbeat)
          left.Notify();
          return absl::OkStatus();
        }
        left.WaitForNotificationWithTimeout(absl::Seconds(30));
        const absl::Time start = absl::Now();
        second_step[rank] = (*muon)->Step();
        took[rank] = absl::Now() - start;
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r) ASSERT_THAT(statuses[r], IsOk()) << r;
  for (int r = 0; r < kWorld; ++r) {
    if (r == kStopped) continue;
    EXPECT_THAT(second_step[r],
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("rank 3 finished (left the job after "
                                         "step 1)"),
                               HasSubstr(absl::StrCat("while rank ", r,
                                                      " is still stepping")),
                               HasSubstr("every rank must call step() the "
                                         "same number of times"))))
        << r;
    // The collective's own timeout (2 s) and no lost-rank wait on top.
    EXPECT_LT(took[r], absl::Seconds(8)) << r;
  }
  comms.clear();
}

// A rank whose own checks fail before it can join (here a parameter that
// holds fewer values than its shape needs) still tells the coordinator:
// every other rank's Create fails at once naming it and its error, instead
// of waiting out the 10 s join timeout.
TEST(FailurePropagationTest,
     Create_OneRankFailsItsChecks_OthersFailAtOnceNamingIt) {
  World world(absl::Seconds(30));
  std::vector<std::unique_ptr<GlooCommunicator>> comms =
      MakeComms(world.clients, kGlooTimeout, "gloo/create");
  ASSERT_EQ(comms.size(), static_cast<size_t>(kWorld));
  std::vector<absl::Status> created(kWorld);
  std::vector<absl::Duration> took(kWorld);
  std::vector<absl::Status> statuses =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        std::vector<Parameter> params = MakeParams();
        if (rank == 2) params[0].data.pop_back();
        const absl::Time start = absl::Now();
        created[rank] = CreateMuon(&params, comms[rank].get(),
                                   world.clients[rank].get(), 100 + rank)
                            .status();
        took[rank] = absl::Now() - start;
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ASSERT_THAT(statuses[r], IsOk());
    EXPECT_LT(took[r], absl::Seconds(5));
    if (r == 2) {
      EXPECT_THAT(created[r], StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("rank 2: parameter")));
    } else {
      EXPECT_THAT(
          created[r],
          StatusIs(absl::StatusCode::kInvalidArgument,
                   AllOf(HasSubstr("rank 2 could not create its optimizer: "
                                   "rank 2: parameter"),
                         HasSubstr("values but its local shape"))));
    }
  }
  comms.clear();
}

}  // namespace
}  // namespace muon
