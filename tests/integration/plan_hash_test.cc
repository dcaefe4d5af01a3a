// One job, one plan, whoever plans it: for the same job spec, `muonctl plan`
// (PlanJobSpec and the `plan --json` command), the coordinator embedded in
// rank 0 (StartEmbeddedCoordinator: rank 0 joins in process, the other ranks
// over gRPC) and the muon-coordinator daemon (a child process on 127.0.0.1,
// port 0) report the same plan: same owners, loads and hash, with the
// optimizer's ns_steps at torch's default and at 3 (before PlanJob, the
// coordinator always costed 5 iterations).
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "control/grpc_coordination_client.h"
#include "coordination/coordination_client.h"
#include "coordination/embedded_coordinator.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "plan/plan_job.h"
#include "plan/planner.h"
#include "server/embedded_coordinator.h"
#include "tests/job_secret_env.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"
#include "tools/muonctl_lib.h"

namespace muon {
namespace {

constexpr char kJobId[] = "plan-hash";
constexpr int kWorld = 4;
constexpr int64_t kJoinTimeoutMs = 20000;

// dp_shard=2 x tp=2 with uneven shards and matrices of different costs, so
// that the owners and loads depend on the cost model.
v1::JobSpec HashSpec(int ns_steps) {
  v1::JobSpec spec =
      testing::MakeSpec({{"dp_shard", 2}, {"tp", 2}},
                        {{"embed", 96, 40, {"Shard(0)", "Shard(1)"}},
                         {"attn.wq", 40, 40, {"Shard(0)", "Shard(0)"}},
                         {"attn.wo", 40, 40, {"Shard(0)", "Shard(1)"}},
                         {"mlp.up", 40, 160, {"Shard(0)", "Shard(1)"}},
                         {"mlp.down", 160, 40, {"Shard(0)", "Shard(0)"}},
                         {"head", 7, 40, {"Replicate()", "Shard(1)"}},
                         {"proj", 33, 17, {"Shard(1)", "Replicate()"}}});
  spec.set_job_id(kJobId);
  if (ns_steps > 0) spec.mutable_optimizer()->set_ns_steps(ns_steps);
  return spec;
}

// Joins every rank of `spec` concurrently, rank r through clients[r]
// (manifests from ManifestsFromSpec, as trainers of that spec send them),
// and returns each rank's plan.
std::vector<absl::StatusOr<v1::Plan>> JoinAll(
    const v1::JobSpec& spec, const std::vector<CoordinationClient*>& clients) {
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(spec);
  EXPECT_THAT(manifests, IsOk());
  std::vector<absl::StatusOr<v1::Plan>> plans(
      clients.size(), absl::UnknownError("did not join"));
  if (!manifests.ok()) return plans;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < clients.size(); ++r) {
    threads.emplace_back([&, r] {
      v1::JoinRequest request;
      request.set_job_id(kJobId);
      *request.mutable_manifest() = (*manifests)[r];
      request.set_incarnation(r + 1);
      request.set_timeout_ms(kJoinTimeoutMs);
      absl::StatusOr<v1::JoinResponse> response = clients[r]->Join(request);
      if (response.ok()) {
        plans[r] = response->plan();
      } else {
        plans[r] = response.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return plans;
}

// `actual` (what `who` reports) is `expected`: hash, loads, then the whole
// message.
void ExpectSamePlan(const v1::Plan& expected, const v1::Plan& actual,
                    const std::string& who) {
  SCOPED_TRACE(who);
  EXPECT_EQ(actual.hash(), expected.hash());
  ASSERT_EQ(actual.loads_size(), expected.loads_size());
  for (int r = 0; r < expected.loads_size(); ++r) {
    EXPECT_EQ(actual.loads(r).rank(), expected.loads(r).rank());
    EXPECT_EQ(actual.loads(r).matrices(), expected.loads(r).matrices());
    EXPECT_DOUBLE_EQ(actual.loads(r).ns_flops(), expected.loads(r).ns_flops())
        << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(actual.max_load_flops(), expected.max_load_flops());
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(actual, expected))
      << "expected:\n"
      << expected.DebugString() << "actual:\n"
      << actual.DebugString();
}

// The muon-coordinator daemon as a child process: started on 127.0.0.1 with
// --port=0, its port read back from --port_file within a bounded wait;
// SIGTERM (then SIGKILL) on destruction.
class Daemon {
 public:
  static std::unique_ptr<Daemon> Start(const std::vector<std::string>& flags) {
    static int started = 0;
    const std::string port_file =
        absl::StrCat(::testing::TempDir(), "/plan_hash_daemon_", getpid(), "_",
                     started++, ".port");
    std::remove(port_file.c_str());
    std::vector<std::string> argv = {"server/muon-coordinator",
                                     "--host=127.0.0.1", "--port=0",
                                     "--port_file=" + port_file};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      execv(args[0], args.data());
      _exit(127);
    }
    auto daemon = std::unique_ptr<Daemon>(new Daemon(pid));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) {
        daemon->port_ = port;
        return daemon;
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        daemon->pid_ = -1;  // exited early
        return nullptr;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return nullptr;  // the destructor kills it
  }

  ~Daemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    if (WaitFor(absl::Seconds(10))) return;
    kill(pid_, SIGKILL);
    WaitFor(absl::Seconds(5));
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  explicit Daemon(pid_t pid) : pid_(pid) {}

  // Reaps the child within `timeout`; false if it is still running.
  bool WaitFor(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  pid_t pid_;
  int port_ = 0;
};

// gRPC clients for every rank of the coordinator at `address`.
std::vector<std::unique_ptr<CoordinationClient>> GrpcClients(
    const std::string& address, int count) {
  std::vector<std::unique_ptr<CoordinationClient>> clients;
  for (int r = 0; r < count; ++r) {
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
        GrpcCoordinationClient::Create(
            address, kJobId, absl::Seconds(10),
            GrpcClientSecurity{::muon::testing::TestJobSecret(), "", ""});
    EXPECT_THAT(c, IsOk());
    if (!c.ok()) return {};
    clients.push_back(*std::move(c));
  }
  return clients;
}

std::vector<CoordinationClient*> Raw(
    const std::vector<std::unique_ptr<CoordinationClient>>& clients) {
  std::vector<CoordinationClient*> raw;
  for (const auto& c : clients) raw.push_back(c.get());
  return raw;
}

// Parameter: the optimizer's ns_steps in the spec (0 = unset, torch's 5).
class PlanHashTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    spec_ = HashSpec(GetParam());
    absl::StatusOr<JobPlan> offline = PlanJobSpec(spec_);
    ASSERT_THAT(offline, IsOk());
    offline_ = offline->plan;
    ASSERT_FALSE(offline_.hash().empty());
  }

  v1::JobSpec spec_;
  v1::Plan offline_;  // muonctl's: PlanJobSpec
};

TEST_P(PlanHashTest, MuonctlPlanCommand_Json_PrintsPlanJobSpecsPlan) {
  const std::string path = absl::StrCat(
      ::testing::TempDir(), "/plan_hash_spec_", GetParam(), ".json");
  {
    std::ofstream f(path);
    f << JobSpecToJson(spec_);
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunMuonctl({"plan", "--spec", path, "--json"}, out, err), 0)
      << err.str();
  v1::Plan printed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(out.str(), &printed).ok())
      << out.str();
  ExpectSamePlan(offline_, printed, "muonctl plan --json");
}

TEST_P(PlanHashTest, EmbeddedCoordinator_JoinPath_SamePlanAsMuonctl) {
  EmbeddedCoordinatorOptions options;
  options.job_id = kJobId;
  options.world_size = kWorld;
  absl::StatusOr<std::unique_ptr<EmbeddedCoordinator>> embedded =
      StartEmbeddedCoordinator(options);
  ASSERT_THAT(embedded, IsOk());
  // Rank 0 in process (as InitProcessGroup wires it), the others over gRPC.
  std::vector<std::unique_ptr<CoordinationClient>> clients =
      GrpcClients((*embedded)->address(), kWorld);
  ASSERT_EQ(clients.size(), static_cast<size_t>(kWorld));
  clients[0] = (*embedded)->NewLocalClient();
  std::vector<absl::StatusOr<v1::Plan>> plans = JoinAll(spec_, Raw(clients));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(plans[r], IsOk()) << "rank " << r;
    // A Join response is the plan as that rank needs it (PlanForRank).
    ExpectSamePlan(PlanForRank(offline_, r), *plans[r],
                   absl::StrCat("embedded coordinator, rank ", r));
  }
  absl::StatusOr<v1::JobInfo> job = clients[1]->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->plan_hash(), offline_.hash());
  clients.clear();  // before the coordinator they talk to
}

TEST_P(PlanHashTest, Daemon_JoinOverGrpc_SamePlanAsMuonctl) {
  std::unique_ptr<Daemon> daemon =
      Daemon::Start({absl::StrCat("--job_id=", kJobId),
                     absl::StrCat("--world_size=", kWorld)});
  ASSERT_NE(daemon, nullptr) << "muon-coordinator did not start";
  std::vector<std::unique_ptr<CoordinationClient>> clients =
      GrpcClients(daemon->address(), kWorld);
  ASSERT_EQ(clients.size(), static_cast<size_t>(kWorld));
  std::vector<absl::StatusOr<v1::Plan>> plans = JoinAll(spec_, Raw(clients));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(plans[r], IsOk()) << "rank " << r;
    ExpectSamePlan(PlanForRank(offline_, r), *plans[r],
                   absl::StrCat("daemon, rank ", r));
  }
  // What `muonctl assignments` reads: the same loads.
  absl::StatusOr<v1::GetAssignmentsResponse> assignments =
      clients[0]->GetAssignments();
  ASSERT_THAT(assignments, IsOk());
  ASSERT_EQ(assignments->ranks_size(), kWorld);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_DOUBLE_EQ(assignments->ranks(r).ns_flops(),
                     offline_.loads(r).ns_flops())
        << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(NsSteps, PlanHashTest, ::testing::Values(0, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0
                                      ? std::string("Default")
                                      : absl::StrCat("NsSteps", info.param);
                         });

// The test is sensitive to ns_steps: 3 iterations give other loads and
// another hash than the default 5 (which an explicit 5 reproduces).
TEST(PlanHashNsStepsTest, PlanJobSpec_NsSteps3_OtherHashAndLoadsThan5) {
  absl::StatusOr<JobPlan> five = PlanJobSpec(HashSpec(0));
  absl::StatusOr<JobPlan> explicit_five = PlanJobSpec(HashSpec(5));
  absl::StatusOr<JobPlan> three = PlanJobSpec(HashSpec(3));
  ASSERT_THAT(five, IsOk());
  ASSERT_THAT(explicit_five, IsOk());
  ASSERT_THAT(three, IsOk());
  EXPECT_EQ(five->plan.hash(), explicit_five->plan.hash());
  EXPECT_NE(five->plan.hash(), three->plan.hash());
  EXPECT_DOUBLE_EQ(three->plan.max_load_flops() * 5,
                   five->plan.max_load_flops() * 3);
}

}  // namespace
}  // namespace muon
