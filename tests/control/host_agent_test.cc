// Tests of control/host_agent.h: ranks that reach a gRPC coordinator
// through their host's agent (a Unix socket each) join, stay alive on the
// agent's one heartbeat per host, and have their step reports delivered;
// a rank whose process ends is named at once with how it ended; a silent
// rank is named lost within twice the heartbeat timeout; a silent host has
// all its ranks named.
#include "control/host_agent.h"

#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/wire_names.h"
#include "control/agent.h"
#include "control/grpc_coordination_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "tests/control/agent_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Milliseconds(400);

// A private directory for the agents' sockets, under /tmp (a socket path
// is at most 107 bytes; bazel's test directory can be longer); removed with
// its sockets.
class SocketDir {
 public:
  SocketDir() {
    char path[] = "/tmp/muon-host-agent.XXXXXX";
    EXPECT_NE(mkdtemp(path), nullptr);
    path_ = path;
  }
  ~SocketDir() {
    for (const std::string& s : sockets_) unlink(s.c_str());
    rmdir(path_.c_str());
  }
  std::string Socket(const std::string& name) {
    sockets_.push_back(absl::StrCat(path_, "/", name, ".sock"));
    return absl::StrCat("unix:", sockets_.back());
  }

 private:
  std::string path_;
  std::vector<std::string> sockets_;
};

// A 4-rank job (dp_shard=4) on a gRPC coordinator with heartbeat timeout
// kTimeout, its ranks on two hosts: "A" runs ranks 0 and 1, "B" ranks 2
// and 3, each host through its agent.
class TwoHostJob {
 public:
  TwoHostJob() {
    CoordinatorServerOptions server_options;
    server_options.service.job_id = "agent";
    server_options.service.heartbeat_timeout = kTimeout;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(server_options);
    EXPECT_THAT(server, IsOk());
    server_ = *std::move(server);
    for (const auto& [name, ranks] :
         std::vector<std::pair<std::string, std::vector<int>>>{{"A", {0, 1}},
                                                               {"B", {2, 3}}}) {
      HostAgent::Options o;
      o.coordinator = server_->address();
      o.listen = dir_.Socket(name);
      o.host = name;
      o.ranks = ranks;
      o.rpc_timeout = absl::Seconds(1);
      absl::StatusOr<std::unique_ptr<HostAgent>> host = HostAgent::Start(o);
      EXPECT_THAT(host, IsOk());
      hosts.push_back(*std::move(host));
    }
    Agent::Options options;
    options.leave_on_stop = false;  // a stopped agent stands for a crash
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
          GrpcCoordinationClient::Create(hosts[r / 2]->address(), "agent",
                                         absl::Seconds(1));
      EXPECT_THAT(c, IsOk());
      clients_.push_back(*std::move(c));
      agents.push_back(
          std::make_unique<Agent>(clients_.back().get(), r, 700 + r, options));
    }
    JoinAll(agents, RankManifests(4));
    for (auto& a : agents) a->Start();
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> direct =
        GrpcCoordinationClient::Create(server_->address(), "agent");
    EXPECT_THAT(direct, IsOk());
    direct_ = *std::move(direct);
  }
  ~TwoHostJob() {
    for (auto& a : agents) a->Stop(absl::ZeroDuration());
    for (auto& h : hosts) h->Shutdown();
  }

  // Each rank's state as the coordinator lists it.
  std::vector<std::string> States() {
    std::vector<std::string> out;
    absl::StatusOr<v1::ListRanksResponse> ranks = direct_->ListRanks();
    if (ranks.ok()) {
      for (const v1::RankStatus& s : ranks->ranks()) {
        out.push_back(WireName(s.state()));
      }
    }
    return out;
  }
  CoordinationClient& direct() { return *direct_; }
  // Rank r's connection to its host's agent.
  CoordinationClient* client(int r) { return clients_[r].get(); }

  std::vector<std::unique_ptr<HostAgent>> hosts;
  std::vector<std::unique_ptr<Agent>> agents;

 private:
  SocketDir dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::vector<std::unique_ptr<GrpcCoordinationClient>> clients_;
  std::unique_ptr<GrpcCoordinationClient> direct_;
};

// A coordinator over gRPC and one host agent "A" for ranks 0 and 1, with a
// client of the agent's socket.
struct OneHost {
  OneHost() {
    CoordinatorServerOptions server_options;
    server_options.service.job_id = "agent";
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> s =
        CoordinatorServer::Start(server_options);
    EXPECT_THAT(s, IsOk());
    if (!s.ok()) return;
    server = *std::move(s);
    HostAgent::Options o;
    o.coordinator = server->address();
    o.listen = dir.Socket("A");
    o.host = "A";
    o.ranks = {0, 1};
    absl::StatusOr<std::unique_ptr<HostAgent>> h = HostAgent::Start(o);
    EXPECT_THAT(h, IsOk());
    if (!h.ok()) return;
    host = *std::move(h);
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
        GrpcCoordinationClient::Create(host->address(), "agent",
                                       absl::Seconds(1));
    EXPECT_THAT(c, IsOk());
    if (c.ok()) client = *std::move(c);
  }
  bool ok() const { return client != nullptr; }

  SocketDir dir;
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<HostAgent> host;
  std::unique_ptr<GrpcCoordinationClient> client;
};

TEST(HostAgentTest, TwoHosts_RanksJoinAndStayReadyOnOneHeartbeatPerHost) {
  TwoHostJob job;
  EXPECT_EQ(job.agents[0]->heartbeat_timeout(), kTimeout);
  // Three heartbeat timeouts: every rank stays ready on its host's beats.
  absl::SleepFor(3 * kTimeout);
  EXPECT_THAT(job.States(),
              ::testing::ElementsAre("ready", "ready", "ready", "ready"));
  for (auto& a : job.agents) EXPECT_THAT(a->job_error(), IsOk());
  // One beat per host and interval (kTimeout / 5): about 15 in 1.2 s, not
  // one per rank and interval (30) plus the ranks' own.
  for (auto& h : job.hosts) {
    EXPECT_GE(h->heartbeats_sent(), 5);
    EXPECT_LE(h->heartbeats_sent(), 25);
    // All but the ranks' first beats (answered before the first period) go
    // as messages on the host's stream.
    EXPECT_GE(h->heartbeats_streamed(), h->heartbeats_sent() - 2);
  }
}

TEST(HostAgentTest, Reports_BatchedPerHost_EveryOneReachesTheCoordinator) {
  TwoHostJob job;
  for (int step = 1; step <= 5; ++step) {
    for (auto& a : job.agents) a->Report(StepReportFor(step));
  }
  ASSERT_TRUE(WaitFor([&] {
    return job.hosts[0]->reports_sent() == 10 &&
           job.hosts[1]->reports_sent() == 10;
  }));
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<v1::GetReportsResponse> got = job.direct().GetReports(r, 10);
    ASSERT_THAT(got, IsOk());
    EXPECT_EQ(got->reports_size(), 5) << "rank " << r;
  }
  EXPECT_EQ(job.hosts[0]->reports_dropped(), 0);
}

TEST(HostAgentTest, RankExited_Failed_EveryRankNamesItAndHowAtOnce) {
  TwoHostJob job;
  const absl::Time exited = absl::Now();
  job.hosts[1]->RankExited(3, 4242, /*failed=*/true,
                           "killed by signal 9 (SIGKILL)");
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(WaitFor([&] { return !job.agents[r]->job_error().ok(); },
                        absl::Seconds(2)))
        << "rank " << r;
    EXPECT_THAT(job.agents[r]->job_error(),
                StatusIs(absl::StatusCode::kAborted,
                         HasSubstr("rank 3 failed: its process (pid 4242) on B "
                                   "ended: killed by signal 9 (SIGKILL)")));
    EXPECT_EQ(job.agents[r]->failed_rank(), 3);
  }
  // Named at once: the next heartbeat of each rank, not a timeout later.
  EXPECT_LT(absl::Now() - exited, kTimeout);
}

TEST(HostAgentTest, RankSilent_NamedLostWithinTwiceTheTimeout) {
  TwoHostJob job;
  absl::SleepFor(kTimeout);
  job.agents[2]->Stop(absl::ZeroDuration());  // hung: no more heartbeats
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(
      WaitFor([&] { return !job.agents[0]->job_error().ok(); }, 3 * kTimeout));
  EXPECT_LT(absl::Now() - stopped, 2 * kTimeout);
  EXPECT_THAT(job.agents[0]->job_error(),
              StatusIs(absl::StatusCode::kAborted,
                       AllOf(HasSubstr("rank 2 lost: no heartbeat"),
                             ::testing::Not(HasSubstr("ranks")))));
}

TEST(HostAgentTest, HostSilent_EveryRankOfTheHostNamed) {
  TwoHostJob job;
  absl::SleepFor(kTimeout);
  // Host B dies: its agent and both its ranks.
  job.agents[2]->Stop(absl::ZeroDuration());
  job.agents[3]->Stop(absl::ZeroDuration());
  job.hosts[1]->Shutdown();
  const absl::Time died = absl::Now();
  ASSERT_TRUE(
      WaitFor([&] { return !job.agents[0]->job_error().ok(); }, 3 * kTimeout));
  EXPECT_LT(absl::Now() - died, 2 * kTimeout);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor([&] { return !job.agents[r]->job_error().ok(); }));
    EXPECT_THAT(job.agents[r]->job_error(),
                StatusIs(absl::StatusCode::kAborted,
                         HasSubstr("ranks 2, 3 of host \"B\" lost: no "
                                   "heartbeat")));
  }
}

// A rank that leaves (its optimizer ends) and joins again with a new
// optimizer (same process, same incarnation) is answered alone at once, and its
// host heartbeats it again: it stays ready.
TEST(HostAgentTest, RankRejoinsAfterLeaving_AnsweredAloneAndHeartbeatedAgain) {
  TwoHostJob job;
  job.agents[1]->Stop(absl::ZeroDuration());
  v1::HeartbeatRequest leave;  // rank 1's optimizer ends cleanly
  leave.set_rank(1);
  leave.set_incarnation(701);
  leave.set_leaving(true);
  ASSERT_THAT(job.client(1)->Heartbeat(leave), IsOk());
  ASSERT_TRUE(WaitFor([&] { return job.States()[1] == "finished"; }));
  // A new optimizer in the same process: the same incarnation.
  Agent again(job.client(1), 1, 701, Agent::Options());
  const absl::Time start = absl::Now();
  ASSERT_THAT(again.Join(RankManifests(4)[1], 3000), IsOk());
  EXPECT_LT(absl::Now() - start, kTimeout);  // not waiting for rank 0
  again.Start();
  absl::SleepFor(3 * kTimeout);
  EXPECT_THAT(job.States(),
              ::testing::ElementsAre("ready", "ready", "ready", "ready"));
  EXPECT_THAT(job.agents[0]->job_error(), IsOk());
  again.Stop(absl::ZeroDuration());
}

// A rank whose process ends before its host's ranks have all joined: the
// Joins waiting on the host agent fail at once, naming it and how.
TEST(HostAgentTest, RankExitsBeforeHostJoined_WaitingJoinsFailNamingIt) {
  OneHost one;
  ASSERT_TRUE(one.ok());
  std::unique_ptr<HostAgent>& host = one.host;
  std::unique_ptr<GrpcCoordinationClient>& client = one.client;
  Agent agent(client.get(), 0, 1, Agent::Options());
  absl::StatusOr<v1::Plan> plan;
  const absl::Time start = absl::Now();
  std::thread join([&] { plan = agent.Join(RankManifests(2)[0], 30000); });
  absl::SleepFor(absl::Milliseconds(200));
  host->RankExited(1, 4243, /*failed=*/true, "exited with code 3");
  join.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(plan.status(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("rank 1 failed before this host's ranks "
                                 "joined: its process (pid 4243) on A ended: "
                                 "exited with code 3")));
}

// A coordinator without HostHeartbeatStream (here another host agent in
// front of the coordinator, which answers the stream Unimplemented and
// forwards the calls): the host agent falls back to one HostHeartbeat call
// per period, and its ranks stay ready.
TEST(HostAgentTest, CoordinatorWithoutStreams_FallsBackToCalls) {
  CoordinatorServerOptions server_options;
  server_options.service.job_id = "agent";
  server_options.service.heartbeat_timeout = kTimeout;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(server_options);
  ASSERT_THAT(server, IsOk());
  SocketDir dir;
  HostAgent::Options front;
  front.coordinator = (*server)->address();
  front.listen = dir.Socket("old");
  front.host = "old";
  front.ranks = {0, 1};
  absl::StatusOr<std::unique_ptr<HostAgent>> old = HostAgent::Start(front);
  ASSERT_THAT(old, IsOk());
  HostAgent::Options o = front;
  o.coordinator = (*old)->address();
  o.listen = dir.Socket("A");
  o.host = "A";
  o.rpc_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<HostAgent>> host = HostAgent::Start(o);
  ASSERT_THAT(host, IsOk());
  std::vector<std::unique_ptr<GrpcCoordinationClient>> clients;
  std::vector<std::unique_ptr<Agent>> agents;
  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> c =
        GrpcCoordinationClient::Create((*host)->address(), "agent",
                                       absl::Seconds(1));
    ASSERT_THAT(c, IsOk());
    clients.push_back(*std::move(c));
    agents.push_back(std::make_unique<Agent>(clients.back().get(), r, 900 + r,
                                             Agent::Options()));
  }
  JoinAll(agents, RankManifests(2));
  for (auto& a : agents) a->Start();
  absl::SleepFor(3 * kTimeout);
  for (auto& a : agents) EXPECT_THAT(a->job_error(), IsOk());
  EXPECT_GE((*host)->heartbeats_sent(), 5);
  EXPECT_EQ((*host)->heartbeats_streamed(), 0);
  for (auto& a : agents) a->Stop(absl::ZeroDuration());
}

TEST(HostAgentTest, Join_LocalRankMissing_DeadlineNamesIt) {
  OneHost one;
  ASSERT_TRUE(one.ok());
  std::unique_ptr<GrpcCoordinationClient>& client = one.client;
  Agent agent(client.get(), 0, 1, Agent::Options());
  EXPECT_THAT(agent.Join(RankManifests(2)[0], 300),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("host agent of A"),
                             HasSubstr("this host's ranks 1 to join"))));
  // A rank of another host is refused by name.
  Agent stranger(client.get(), 3, 1, Agent::Options());
  EXPECT_THAT(stranger.Join(RankManifests(4)[3], 300),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 3 joined, but this host runs ranks "
                                 "0, 1")));
}

TEST(HostAgentTest, Start_BadRanks_InvalidArgumentNamingThem) {
  HostAgent::Options o;
  o.coordinator = "127.0.0.1:1";
  o.listen = "127.0.0.1:0";
  o.host = "A";
  EXPECT_THAT(HostAgent::Start(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("0 ranks; must be in [1, 1024]")));
  o.ranks = {1, 2, 1};
  EXPECT_THAT(HostAgent::Start(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 1 is listed twice")));
  o.ranks = {-1};
  EXPECT_THAT(HostAgent::Start(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("rank -1 is negative")));
}

}  // namespace
}  // namespace muon
