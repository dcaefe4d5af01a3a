// One end-to-end test over real gRPC on 127.0.0.1:0: CoordinatorServer and
// GrpcCoordinationClient (Join from 2 threads, KeySet/KeyGet, ListRanks,
// GetReports),
// plus the error paths that only exist on the wire.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "control/grpc_coordination_client.h"
#include "control/process_group.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "plan/planner.h"
#include "server/coordinator_server.h"
#include "server/local_coordination_client.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::MakeSpec;
using ::muon::testing::Manifests;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<CoordinatorServer> StartServer() {
  CoordinatorServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.service.job_id = "it";
  options.service.default_join_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<GrpcCoordinationClient> Connect(
    const CoordinatorServer& server) {
  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> client =
      GrpcCoordinationClient::Create(server.address(), "it", absl::Seconds(2));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

v1::JobSpec TwoRankSpec() {
  return MakeSpec({{"dp_shard", 2}}, {{"fc1.weight", 16, 8, {"Shard(0)"}},
                                      {"fc2.weight", 8, 16, {"Shard(1)"}},
                                      {"fc3.weight", 4, 4, {"Replicate()"}}});
}

// Joins both ranks of TwoRankSpec (incarnations base, base + 1) over gRPC,
// each from its own thread.
void JoinTwoRanks(const CoordinatorServer& server, uint64_t base) {
  std::vector<v1::RankManifest> manifests = Manifests(TwoRankSpec());
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GrpcCoordinationClient> client = Connect(server);
      if (client == nullptr) return;
      v1::JoinRequest request;
      *request.mutable_manifest() = manifests[r];
      request.set_incarnation(base + r);
      request.set_timeout_ms(3000);
      EXPECT_THAT(client->Join(request), IsOk());
    });
  }
  for (std::thread& t : threads) t.join();
}

// Host "h0"'s heartbeat for both ranks joined by JoinTwoRanks(base).
v1::HostHeartbeatRequest HostBeat(uint64_t base) {
  v1::HostHeartbeatRequest beat;
  beat.set_job_id("it");
  beat.set_host("h0");
  for (int r = 0; r < 2; ++r) {
    v1::HeartbeatRequest* entry = beat.add_ranks();
    entry->set_rank(r);
    entry->set_incarnation(base + r);
  }
  return beat;
}

// A trainer that does not insist on a job id (empty, the default of
// ProcessGroupOptions and MUON_JOB_ID) joins whatever job the daemon serves; an
// explicit, different id is still rejected naming both.
TEST(GrpcIntegrationTest, Join_EmptyJobId_JoinsDaemonsJobOtherIdRejected) {
  EXPECT_TRUE(ProcessGroupOptions().job_id.empty());
  CoordinatorServerOptions options;
  options.service.job_id = "demo";
  options.service.world_size = 1;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_THAT(server, IsOk());
  const v1::RankManifest manifest =
      Manifests(MakeSpec({{"dp_shard", 1}}, {{"w", 4, 4, {"Replicate()"}}}))[0];

  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> other =
      GrpcCoordinationClient::Create((*server)->address(), "fashion-mnist",
                                     absl::Seconds(2));
  ASSERT_THAT(other, IsOk());
  v1::JoinRequest request;
  *request.mutable_manifest() = manifest;
  request.set_incarnation(1);
  request.set_timeout_ms(2000);
  EXPECT_THAT((*other)->Join(request),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"fashion-mnist\""),
                             HasSubstr("serves job \"demo\""))));

  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> any =
      GrpcCoordinationClient::Create((*server)->address(), /*job_id=*/"",
                                     absl::Seconds(2));
  ASSERT_THAT(any, IsOk());
  absl::StatusOr<v1::JoinResponse> joined = (*any)->Join(request);
  ASSERT_THAT(joined, IsOk());
  EXPECT_EQ(joined->plan().job_id(), "demo");
  absl::StatusOr<v1::JobInfo> job = (*any)->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->job_id(), "demo");
}

TEST(GrpcIntegrationTest, JoinKeyValueListRanks_OverLoopback_Work) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));

  std::vector<v1::RankManifest> manifests = Manifests(TwoRankSpec());
  std::vector<absl::StatusOr<v1::JoinResponse>> results(
      2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<GrpcCoordinationClient> client = Connect(*server);
      if (client == nullptr) return;
      v1::JoinRequest request;  // job id stamped by the client
      *request.mutable_manifest() = manifests[r];
      request.set_incarnation(1000 + r);
      request.set_timeout_ms(3000);
      results[r] = client->Join(request);
      if (!results[r].ok()) return;
      // Rendezvous: each rank publishes its address and reads the other's.
      EXPECT_THAT(client->KeySet("addr/" + std::to_string(r),
                                 "host" + std::to_string(r)),
                  IsOk());
      absl::StatusOr<std::string> peer =
          client->KeyGet("addr/" + std::to_string(1 - r), absl::Seconds(2));
      ASSERT_THAT(peer, IsOk());
      EXPECT_EQ(*peer, "host" + std::to_string(1 - r));
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_THAT(results[0], IsOk());
  ASSERT_THAT(results[1], IsOk());
  // Same plan for both ranks (each derives its own schedule).
  EXPECT_EQ(results[0]->plan().hash(), results[1]->plan().hash());
  EXPECT_EQ(PlanForRank(results[0]->plan(), -1).SerializeAsString(),
            PlanForRank(results[1]->plan(), -1).SerializeAsString());
  EXPECT_EQ(results[0]->plan().job_id(), "it");
  EXPECT_EQ(results[0]->plan().matrices_size(), 3);

  std::unique_ptr<GrpcCoordinationClient> ctl = Connect(*server);
  ASSERT_NE(ctl, nullptr);
  v1::StepReport report;
  report.set_rank(1);
  report.set_incarnation(1001);
  report.set_step(3);
  ASSERT_THAT(ctl->ReportStep(report), IsOk());
  absl::StatusOr<v1::ListRanksResponse> ranks = ctl->ListRanks();
  ASSERT_THAT(ranks, IsOk());
  ASSERT_EQ(ranks->ranks_size(), 2);
  EXPECT_EQ(ranks->ranks(0).state(), v1::RANK_STATE_READY);
  EXPECT_EQ(ranks->ranks(1).state(), v1::RANK_STATE_RUNNING);
  EXPECT_EQ(ranks->ranks(1).last_step(), 3);
  absl::StatusOr<v1::JobInfo> job = ctl->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);  // a rank has reported a step
  EXPECT_EQ(job->plan_hash(), results[0]->plan().hash());
  absl::StatusOr<v1::GetAssignmentsResponse> assignments =
      ctl->GetAssignments();
  ASSERT_THAT(assignments, IsOk());
  EXPECT_EQ(assignments->ranks_size(), 2);
  absl::StatusOr<v1::Plan> plan = ctl->GetPlan();
  ASSERT_THAT(plan, IsOk());
  EXPECT_EQ(plan->hash(), results[0]->plan().hash());

  // GetReports: whole reports (timings included) across the wire, by rank
  // then step; the same answer from the in-process client.
  v1::StepReport report0;
  report0.set_rank(0);
  report0.set_incarnation(1000);
  report0.set_reports_dropped(2);
  for (int64_t step : {1, 2}) {
    report0.set_step(step);
    report0.clear_ops();
    v1::OpTiming* op = report0.add_ops();
    op->set_op(v1::OP_KIND_ORTHOGONALIZE);
    op->set_bucket(0);
    op->set_stream(v1::STREAM_KIND_COMPUTE);
    op->set_start_s(10.0 * step);
    op->set_end_s(10.0 * step + 0.25);
    op->set_flops(1e6);
    ASSERT_THAT(ctl->ReportStep(report0), IsOk());
  }
  absl::StatusOr<v1::GetReportsResponse> reports = ctl->GetReports(-1, 0);
  ASSERT_THAT(reports, IsOk());
  ASSERT_EQ(reports->reports_size(), 3);
  EXPECT_EQ(reports->reports(0).rank(), 0);
  EXPECT_EQ(reports->reports(0).step(), 1);
  EXPECT_EQ(reports->reports(1).step(), 2);
  EXPECT_EQ(reports->reports(2).rank(), 1);
  ASSERT_EQ(reports->reports(1).ops_size(), 1);
  EXPECT_EQ(reports->reports(1).ops(0).stream(), v1::STREAM_KIND_COMPUTE);
  EXPECT_DOUBLE_EQ(reports->reports(1).ops(0).end_s(), 20.25);
  absl::StatusOr<v1::GetReportsResponse> last = ctl->GetReports(0, 1);
  ASSERT_THAT(last, IsOk());
  ASSERT_EQ(last->reports_size(), 1);
  EXPECT_EQ(last->reports(0).step(), 2);
  EXPECT_THAT(ctl->GetReports(5, 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("rank 5")));
  LocalCoordinationClient local_reports(server->service(), "it");
  absl::StatusOr<v1::GetReportsResponse> local_answer =
      local_reports.GetReports(-1, 0);
  ASSERT_THAT(local_answer, IsOk());
  EXPECT_EQ(local_answer->SerializeAsString(), reports->SerializeAsString());
  ranks = ctl->ListRanks();
  ASSERT_THAT(ranks, IsOk());
  EXPECT_EQ(ranks->ranks(0).reports_dropped(), 2);
  EXPECT_FALSE(ranks->ranks(0).straggler());  // one other rank: no verdict

  // Errors keep their code and message across the wire.
  EXPECT_THAT(
      ctl->KeyGet("never", absl::Milliseconds(100)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("\"never\"")));
  v1::HeartbeatRequest hb;
  hb.set_rank(0);
  hb.set_incarnation(1);
  EXPECT_THAT(ctl->Heartbeat(hb),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("incarnation 1")));
  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> other_job =
      GrpcCoordinationClient::Create(server->address(), "other");
  ASSERT_THAT(other_job, IsOk());
  EXPECT_THAT(
      (*other_job)->GetJob(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"other\"")));

  // The in-process client sees the same service.
  LocalCoordinationClient local(server->service(), "it");
  absl::StatusOr<std::string> v = local.KeyGet("addr/0", absl::ZeroDuration());
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, "host0");

  server->Stop();
  EXPECT_THAT(ctl->GetJob(), StatusIs(absl::StatusCode::kUnavailable,
                                      HasSubstr(server->address())));
}

// A host's heartbeat stream: each message answered in order with the job
// state; an entry the coordinator does not know ends the stream with its
// error, naming the host.
TEST(GrpcIntegrationTest, HostHeartbeatStream_AnswersEachInOrderErrorEndsIt) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  JoinTwoRanks(*server, 2000);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeCoordinatorChannel(server->address(), GrpcClientSecurity());
  ASSERT_THAT(channel, IsOk());
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto stream = stub->HostHeartbeatStream(&context);
  v1::HostHeartbeatRequest beat = HostBeat(2000);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(stream->Write(beat)) << "message " << i;
    v1::HeartbeatResponse answer;
    ASSERT_TRUE(stream->Read(&answer)) << "message " << i;
    EXPECT_TRUE(answer.job_error().empty()) << answer.job_error();
    EXPECT_EQ(answer.job_state(), v1::JOB_STATE_PLANNED);
  }
  beat.mutable_ranks(1)->set_incarnation(9);  // not the one that joined
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse answer;
  EXPECT_FALSE(stream->Read(&answer));
  const grpc::Status status = stream->Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.error_message(), HasSubstr("HostHeartbeat from host"));
}

// Many streams open at once: every one is answered, and Stop with them
// still open returns at once (bounded), each stream then failing instead of
// hanging.
TEST(GrpcIntegrationTest,
     HostHeartbeatStream_TenStreams_EachAnsweredStopEndsThem) {
  std::unique_ptr<CoordinatorServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  JoinTwoRanks(*server, 3000);
  constexpr int kStreams = 10;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::HostHeartbeatRequest,
                                                       v1::HeartbeatResponse>>>
      streams;
  const v1::HostHeartbeatRequest beat = HostBeat(3000);
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeCoordinatorChannel(server->address(), GrpcClientSecurity());
    ASSERT_THAT(channel, IsOk());
    stubs.push_back(v1::Coordinator::NewStub(*channel));
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  std::chrono::seconds(20));
    streams.push_back(stubs.back()->HostHeartbeatStream(contexts.back().get()));
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kStreams; ++i) {
      ASSERT_TRUE(streams[i]->Write(beat)) << "stream " << i;
    }
    for (int i = 0; i < kStreams; ++i) {
      v1::HeartbeatResponse answer;
      ASSERT_TRUE(streams[i]->Read(&answer)) << "stream " << i;
      EXPECT_EQ(answer.job_state(), v1::JOB_STATE_PLANNED) << "stream " << i;
    }
  }
  const absl::Time stop = absl::Now();
  server->Stop();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(5));
  for (int i = 0; i < kStreams; ++i) {
    v1::HeartbeatResponse answer;
    EXPECT_FALSE(streams[i]->Read(&answer)) << "stream " << i;
    EXPECT_FALSE(streams[i]->Finish().ok()) << "stream " << i;
  }
}

TEST(GrpcIntegrationTest, Start_PortInUse_ReturnsUnavailable) {
  std::unique_ptr<CoordinatorServer> first = StartServer();
  ASSERT_NE(first, nullptr);
  CoordinatorServerOptions options;
  options.port = first->port();
  EXPECT_THAT(
      CoordinatorServer::Start(options),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr(first->address())));
}

TEST(GrpcIntegrationTest, Join_NoServer_ReturnsDeadlineExceededAfterWaiting) {
  // A port that was just free (the server is gone).
  std::string address;
  {
    std::unique_ptr<CoordinatorServer> gone = StartServer();
    ASSERT_NE(gone, nullptr);
    address = gone->address();
  }
  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> client =
      GrpcCoordinationClient::Create(address, "it", absl::Milliseconds(100));
  ASSERT_THAT(client, IsOk());
  v1::JoinRequest request;
  *request.mutable_manifest() = Manifests(TwoRankSpec())[0];
  request.set_timeout_ms(100);
  const absl::Time start = absl::Now();
  // Join waits for the coordinator to come up (wait_for_ready) until
  // timeout_ms + rpc_timeout.
  EXPECT_THAT((*client)->Join(request),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("Join"), HasSubstr(address))));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  // Other RPCs fail fast.
  EXPECT_THAT((*client)->GetJob(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(address)));
}

TEST(GrpcIntegrationTest, Create_EmptyAddress_ReturnsInvalidArgument) {
  EXPECT_THAT(GrpcCoordinationClient::Create("", "job"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
}

}  // namespace
}  // namespace muon
