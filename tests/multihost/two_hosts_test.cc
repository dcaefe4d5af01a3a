// Two "hosts" on one machine: two network namespaces joined by a veth pair
// (192.0.2.1/24 and 192.0.2.2/24, TEST-NET-1), one muonrun per namespace
// (--nnodes 2, --nproc-per-node 2, --master-addr 192.0.2.1), each rank
// running Muon steps on a 2 x 2 (dp_replicate x dp_shard) job spec with the
// process group from torchrun's environment. The assembled parameters must
// equal a single-device run bitwise, and Gloo must have bound each host's
// own address (127.0.0.1 cannot reach the other namespace: pinning Gloo to
// loopback makes the job fail, with both muonruns reporting the first
// failed rank).
//
// Needs root and iproute2; skips (saying why) only when the namespaces
// cannot be created. Everything is bounded; the namespaces and every
// process in them are removed on every path (a scope guard; a SIGTERM from
// Bazel's timeout ends the waits so the guard runs; namespaces left by a
// test process that died are removed by the next run).
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command_util.h"
#include "tests/job_secret_env.h"
#include "tools/npy.h"

namespace muon {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr char kSpec[] = "tests/multihost/specs/two_hosts.json";
constexpr char kMuonrun[] = "tools/muonrun";
constexpr char kRank[] = "tests/multihost/muon_rank";
constexpr int kSteps = 3;
constexpr int kSeed = 5;

volatile sig_atomic_t g_terminated = 0;
extern "C" void OnTerm(int) { g_terminated = 1; }

std::string Absolute(const std::string& path) {
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Shell = ::muon::testing::CommandResult;

// Runs `command` under /bin/sh, bounded by coreutils timeout.
Shell RunShell(const std::string& command, int timeout_s = 20) {
  return ::muon::testing::RunCommand(command, timeout_s, /*kill_after_s=*/2);
}

std::string FindIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Starts argv with stdout and stderr to `log`, `set_env` ("NAME=value")
// added and `unset_env` removed.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log,
            const std::vector<std::string>& set_env,
            const std::vector<std::string>& unset_env) {
  std::vector<char*> cargv;
  for (const std::string& a : argv)
    cargv.push_back(const_cast<char*>(a.data()));
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    for (const std::string& name : unset_env) unsetenv(name.c_str());
    for (const std::string& e : set_env) putenv(const_cast<char*>(e.c_str()));
    execv(cargv[0], cargv.data());
    _exit(126);
  }
  return pid;
}

// Waits for `pid` until `deadline` (or a SIGTERM to this test), then kills
// it. Returns its exit code (128+signal), or -1 when it had to be killed.
int WaitUntil(pid_t pid, absl::Time deadline) {
  int status = 0;
  while (true) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (r < 0) return -1;
    if (absl::Now() > deadline || g_terminated) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// Two network namespaces joined by a veth pair. Create() builds them;
// the destructor kills every process in them and deletes them.
class TwoHosts {
 public:
  TwoHosts() : ip_(FindIp()) {
    // The pid (for RemoveStale) and a random tag: unique also across PID
    // namespaces.
    std::random_device random;
    const std::string tag = absl::StrFormat("%08x", random());
    ns_ = {absl::StrCat("muon-a-", getpid(), "-", tag),
           absl::StrCat("muon-b-", getpid(), "-", tag)};
    veth_ = {"mva" + tag, "mvb" + tag};  // <= 15 characters
  }
  ~TwoHosts() { Cleanup(); }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  // Empty when the namespaces were made; else why they cannot be (a
  // reason to skip). Failures after the first namespace exists are test
  // failures (`error`).
  std::string Create(std::string* error) {
    if (geteuid() != 0) return "needs root to create network namespaces";
    if (ip_.empty()) return "no `ip` (iproute2) found";
    RemoveStale();
    Shell first = RunShell(absl::StrCat(ip_, " netns add ", ns_[0]));
    if (first.exit_code != 0) {
      return absl::StrCat("cannot create a network namespace (`ip netns add` ",
                          "exited ", first.exit_code, ": ",
                          absl::StripAsciiWhitespace(first.output), ")");
    }
    created_ = true;
    const std::string a = absl::StrCat(ip_, " -n ", ns_[0], " ");
    const std::string b = absl::StrCat(ip_, " -n ", ns_[1], " ");
    for (const std::string& cmd : {
             absl::StrCat(ip_, " netns add ", ns_[1]),
             absl::StrCat(a, "link add ", veth_[0], " type veth peer name ",
                          veth_[1], " netns ", ns_[1]),
             absl::StrCat(a, "addr add 192.0.2.1/24 dev ", veth_[0]),
             absl::StrCat(b, "addr add 192.0.2.2/24 dev ", veth_[1]),
             absl::StrCat(a, "link set ", veth_[0], " up"),
             absl::StrCat(b, "link set ", veth_[1], " up"),
             absl::StrCat(a, "link set lo up"),
             absl::StrCat(b, "link set lo up"),
         }) {
      Shell r = RunShell(cmd);
      if (r.exit_code != 0) {
        *error =
            absl::StrCat("`", cmd, "` exited ", r.exit_code, ": ", r.output);
        return "";
      }
    }
    return "";
  }

  const std::string& ip() const { return ip_; }
  const std::string& ns(int i) const { return ns_[i]; }
  // Processes started by the test, killed (with their ranks, which die
  // with muonrun) by Cleanup if still running.
  void Track(pid_t pid) { pids_.push_back(pid); }

  void Cleanup() {
    for (pid_t pid : pids_) {
      if (kill(pid, 0) == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    pids_.clear();
    if (!created_) return;
    for (const std::string& ns : ns_) {
      RunShell(absl::StrCat(ip_, " netns pids ", ns,
                            " | xargs -r kill -9 2>/dev/null; ", ip_,
                            " netns del ", ns, " 2>/dev/null"));
    }
    created_ = false;
  }

 private:
  // Deletes namespaces of earlier runs whose test process is gone (killed
  // before its guard ran).
  void RemoveStale() {
    Shell list = RunShell(ip_ + " netns list");
    for (absl::string_view line : absl::StrSplit(list.output, '\n')) {
      const std::string name(line.substr(0, line.find(' ')));
      int pid = 0;
      for (const char* prefix : {"muon-a-", "muon-b-"}) {
        if (absl::StartsWith(name, prefix) &&
            absl::SimpleAtoi(name.substr(std::strlen(prefix),
                                         name.rfind('-') - std::strlen(prefix)),
                             &pid) &&
            pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH) {
          RunShell(absl::StrCat(ip_, " netns pids ", name,
                                " | xargs -r kill -9 2>/dev/null; ", ip_,
                                " netns del ", name));
        }
      }
    }
  }

  const std::string ip_;
  std::vector<std::string> ns_;
  std::vector<std::string> veth_;
  std::vector<pid_t> pids_;
  bool created_ = false;
};

class TwoHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = OnTerm;
    sigaction(SIGTERM, &sa, nullptr);
    hosts_ = std::make_unique<TwoHosts>();
    std::string error;
    const std::string skip = hosts_->Create(&error);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_EQ(error, "");
    const char* tmp = getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(tmp ? tmp : "/tmp", "/two_hostsXXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }

  void TearDown() override {
    hosts_->Cleanup();
    // Nothing of this test is left: no namespace, no process in it.
    Shell list = RunShell(hosts_->ip() + " netns list");
    EXPECT_THAT(list.output, ::testing::Not(HasSubstr(hosts_->ns(0))));
    EXPECT_THAT(list.output, ::testing::Not(HasSubstr(hosts_->ns(1))));
  }

  struct Node {
    int exit_code = -1;
    std::string log;
  };

  // Runs node 0 in namespace A and node 1 in namespace B (node 1 first:
  // its ranks wait for rank 0's coordinator), each `muonrun --nnodes 2
  // --nproc-per-node 2 --master-addr 192.0.2.1 muon_rank ...`, bounded.
  std::vector<Node> RunJob(const std::vector<std::string>& set_env,
                           int rank_timeout_s) {
    std::vector<pid_t> pids(2);
    for (int node : {1, 0}) {
      std::vector<std::string> argv = {hosts_->ip(),
                                       "netns",
                                       "exec",
                                       hosts_->ns(node),
                                       Absolute(kMuonrun),
                                       "--nnodes",
                                       "2",
                                       "--node-rank",
                                       absl::StrCat(node),
                                       "--nproc-per-node",
                                       "2",
                                       "--master-addr",
                                       "192.0.2.1",
                                       "--master-port",
                                       "29500",
                                       "--timeout_s",
                                       "120",
                                       "--grace_s",
                                       "2",
                                       Absolute(kRank),
                                       "--spec",
                                       Absolute(kSpec),
                                       "--steps",
                                       absl::StrCat(kSteps),
                                       "--seed",
                                       absl::StrCat(kSeed),
                                       "--out_dir",
                                       dir_,
                                       "--timeout_s",
                                       absl::StrCat(rank_timeout_s)};
      pids[node] = Spawn(argv, absl::StrCat(dir_, "/node", node, ".log"),
                         set_env, {"GLOO_SOCKET_IFNAME"});
      hosts_->Track(pids[node]);
      if (node == 1) absl::SleepFor(absl::Milliseconds(300));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(150);
    std::vector<Node> nodes(2);
    for (int node : {0, 1}) {
      nodes[node].exit_code = WaitUntil(pids[node], deadline);
      if (nodes[node].exit_code == -1) {
        ADD_FAILURE() << "node " << node << "'s muonrun killed: "
                      << (g_terminated ? "this test got SIGTERM"
                                       : "still running after 150s");
      }
      nodes[node].log = ReadFile(absl::StrCat(dir_, "/node", node, ".log"));
    }
    return nodes;
  }

  std::unique_ptr<TwoHosts> hosts_;
  std::string dir_;
};

TEST_F(TwoHostsTest, MuonrunOnTwoHosts_BitwiseEqualToSingleDevice) {
  std::vector<Node> nodes = RunJob({}, /*rank_timeout_s=*/60);
  ASSERT_EQ(nodes[0].exit_code, 0) << "node 0:\n" << nodes[0].log;
  ASSERT_EQ(nodes[1].exit_code, 0) << "node 1:\n" << nodes[1].log;

  // Gloo bound each host's own address, the one on the route to 192.0.2.1.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(ReadFile(absl::StrCat(dir_, "/rank", rank, ".gloo_host")),
              rank < 2 ? "192.0.2.1\n" : "192.0.2.2\n")
        << "rank " << rank;
  }

  // The same steps on one device, in this namespace.
  const pid_t single = Spawn(
      {Absolute(kRank), "--single", "--spec", Absolute(kSpec), "--steps",
       absl::StrCat(kSteps), "--seed", absl::StrCat(kSeed), "--out_dir", dir_},
      dir_ + "/single.log", {}, {});
  hosts_->Track(single);
  ASSERT_EQ(WaitUntil(single, absl::Now() + absl::Seconds(60)), 0)
      << ReadFile(dir_ + "/single.log");

  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Mesh mesh = MeshFromProto(spec->mesh());
  int64_t compared = 0;
  for (int i = 0; i < spec->params_size(); ++i) {
    const v1::ParamSpec& p = spec->params(i);
    const int64_t rows = p.shape(0), cols = p.shape(1);
    absl::StatusOr<NpyArray> want =
        ReadNpy(absl::StrCat(dir_, "/single_", i, ".npy"));
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<Placement>> pl =
        ParsePlacements(p.placements(), p.name());
    ASSERT_TRUE(pl.ok()) << pl.status();
    // Every rank's shard must hold exactly the single-device values of its
    // box (replicas included).
    std::vector<bool> covered(rows * cols, false);
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      absl::StatusOr<Box> box =
          LocalBox(rows, cols, *pl, mesh, mesh.Coord(rank));
      ASSERT_TRUE(box.ok()) << box.status();
      absl::StatusOr<NpyArray> shard =
          ReadNpy(absl::StrCat(dir_, "/rank", rank, "_", i, ".npy"));
      ASSERT_TRUE(shard.ok()) << shard.status();
      ASSERT_EQ(static_cast<int64_t>(shard->data.size()), box->numel());
      int64_t k = 0;
      for (int64_t r = box->rows.begin; r < box->rows.end; ++r) {
        for (int64_t c = box->cols.begin; c < box->cols.end; ++c, ++k) {
          const float got = shard->data[k];
          const float expected = want->data[r * cols + c];
          ASSERT_EQ(std::memcmp(&got, &expected, sizeof(float)), 0)
              << p.name() << "[" << r << ", " << c << "] on rank " << rank
              << ": " << got << " vs single-device " << expected;
          covered[r * cols + c] = true;
          ++compared;
        }
      }
    }
    for (int64_t e = 0; e < rows * cols; ++e) {
      ASSERT_TRUE(covered[e]) << p.name() << " element " << e << " on no rank";
    }
  }
  EXPECT_GT(compared, 0);
  std::cout << "two hosts (" << hosts_->ns(0) << ", " << hosts_->ns(1)
            << "): " << compared
            << " parameter values on 4 ranks bitwise equal to one device\n";
}

TEST_F(TwoHostsTest, GlooPinnedToLoopback_BothNodesReportFirstFailure) {
  // 127.0.0.1 is not reachable from the other namespace: the job must fail
  // (so the test above really depends on Gloo binding the right address),
  // quickly, and each muonrun names the rank that failed first.
  const absl::Time start = absl::Now();
  std::vector<Node> nodes = RunJob({"GLOO_SOCKET_IFNAME=lo"},
                                   /*rank_timeout_s=*/10);
  for (int node : {0, 1}) {
    EXPECT_EQ(nodes[node].exit_code, 1) << nodes[node].log;
    EXPECT_THAT(nodes[node].log,
                MatchesRegex("(.|\n)*muonrun: rank [0-9] \\(local rank [01], "
                             "pid [0-9]+\\) failed first: exited with code "
                             "1\n(.|\n)*"))
        << "node " << node;
  }
  // Gloo's connect error names the loopback address a peer advertised.
  EXPECT_THAT(nodes[0].log + nodes[1].log, HasSubstr("[127.0.0.1]"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
}

}  // namespace
}  // namespace muon
