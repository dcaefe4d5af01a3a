// muonrun: argument parsing, the environment each rank sees, and the
// supervisor (first-failure report, exit codes, stopping the other ranks
// with a bound), driven through the library and the built binary with
// /bin/sh rank programs. Every process started here is reaped here.
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/job_secret_env.h"
#include "tests/status_matchers.h"
#include "tools/muonrun_lib.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::Pair;

constexpr char kMuonrun[] = "tools/muonrun";

std::string TempDir() {
  const char* d = getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(d != nullptr ? d : "/tmp", "/muonrunXXXXXX");
  return mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct RunResult {
  int exit_code = -1;  // 128+signal when muonrun itself died of a signal
  std::string out;
  std::string err;
  absl::Duration elapsed;
};

// Runs the muonrun binary with `args` (and `env` added), killing it after
// `bound`; `on_start` runs with its pid and the path of the file its stdout
// goes to once started. With `ignore_sigchld`, muonrun starts with SIGCHLD
// set to SIG_IGN, as a parent that ignores it would leave it across exec.
RunResult RunMuonrun(
    const std::vector<std::string>& args,
    const std::vector<std::string>& env = {},
    absl::Duration bound = absl::Seconds(60),
    std::function<void(pid_t, const std::string&)> on_start = nullptr,
    bool ignore_sigchld = false) {
  RunResult r;
  const std::string dir = TempDir();
  const std::string out_path = dir + "/stdout";
  const std::string err_path = dir + "/stderr";
  std::vector<std::string> argv = {kMuonrun};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const absl::Time start = absl::Now();
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    if (ignore_sigchld) signal(SIGCHLD, SIG_IGN);
    execv(cargv[0], cargv.data());
    _exit(126);
  }
  if (on_start) on_start(pid, out_path);
  int status = 0;
  const absl::Time deadline = start + bound;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "muonrun still running after "
                    << absl::FormatDuration(bound);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  r.elapsed = absl::Now() - start;
  r.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

// Whether process `pid` is gone (or a zombie waiting for its parent to
// reap it) within `bound`.
bool GoneWithin(int pid, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (true) {
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    if (stat.empty() || absl::StrContains(stat, ") Z ")) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::vector<std::string> Sh(const std::string& script) {
  return {"/bin/sh", "-c", script};
}

std::vector<std::string> Concat(std::vector<std::string> a,
                                const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// --- Parsing -------------------------------------------------------------

TEST(ParseMuonrunArgsTest, Defaults_AsTorchrun) {
  absl::StatusOr<MuonrunOptions> o = ParseMuonrunArgs({"prog"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->nproc_per_node, 1);
  EXPECT_EQ(o->nnodes, 1);
  EXPECT_EQ(o->node_rank, 0);
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_EQ(o->master_port, 29500);
  EXPECT_EQ(o->timeout, absl::InfiniteDuration());
  EXPECT_THAT(o->program, ElementsAre("prog"));
}

TEST(ParseMuonrunArgsTest, DashAndUnderscoreSpellings_SameOptions) {
  absl::StatusOr<MuonrunOptions> a =
      ParseMuonrunArgs({"--nproc-per-node", "4", "--nnodes", "2", "--node-rank",
                        "1", "--master-addr", "10.1.2.3", "--master-port",
                        "1234", "--max-restarts", "0", "prog", "x"});
  absl::StatusOr<MuonrunOptions> b =
      ParseMuonrunArgs({"--nproc_per_node=4", "--nnodes=2", "--node_rank=1",
                        "--master_addr=10.1.2.3", "--master_port=1234",
                        "--max_restarts=0", "prog", "x"});
  for (const auto* o : {&a, &b}) {
    ASSERT_THAT(*o, IsOk());
    EXPECT_EQ((*o)->nproc_per_node, 4);
    EXPECT_EQ((*o)->nnodes, 2);
    EXPECT_EQ((*o)->node_rank, 1);
    EXPECT_EQ((*o)->master_addr, "10.1.2.3");
    EXPECT_EQ((*o)->master_port, 1234);
    EXPECT_THAT((*o)->program, ElementsAre("prog", "x"));
  }
}

TEST(ParseMuonrunArgsTest, FlagsAfterProgram_BelongToProgram) {
  absl::StatusOr<MuonrunOptions> o =
      ParseMuonrunArgs({"--nnodes", "1", "prog", "--nnodes", "3", "--bogus"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->nnodes, 1);
  EXPECT_THAT(o->program, ElementsAre("prog", "--nnodes", "3", "--bogus"));
  absl::StatusOr<MuonrunOptions> dashdash =
      ParseMuonrunArgs({"--", "-prog", "a"});
  ASSERT_THAT(dashdash, IsOk());
  EXPECT_THAT(dashdash->program, ElementsAre("-prog", "a"));
}

TEST(ParseMuonrunArgsTest, Standalone_PicksLoopbackAndFreePort) {
  absl::StatusOr<MuonrunOptions> o =
      ParseMuonrunArgs({"--standalone", "--nproc-per-node", "2", "prog"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->master_addr, "127.0.0.1");
  EXPECT_GT(o->master_port, 0);
  EXPECT_NE(o->master_port, 29500);
}

TEST(ParseMuonrunArgsTest, TimeoutAndGrace_Parsed) {
  absl::StatusOr<MuonrunOptions> o =
      ParseMuonrunArgs({"--timeout_s", "2.5", "--grace-s=0", "prog"});
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->timeout, absl::Milliseconds(2500));
  EXPECT_EQ(o->grace, absl::ZeroDuration());
}

TEST(ParseMuonrunArgsTest, Help_SetsHelp) {
  absl::StatusOr<MuonrunOptions> o = ParseMuonrunArgs({"--help"});
  ASSERT_THAT(o, IsOk());
  EXPECT_TRUE(o->help);
}

TEST(ParseMuonrunArgsTest, BadArguments_ReturnInvalidArgumentNamingThem) {
  const std::map<std::vector<std::string>, std::string> cases = {
      {{}, "no program"},
      {{"--nnodes", "2"}, "no program"},
      {{"--bogus", "prog"}, "unknown flag --bogus"},
      {{"-x", "prog"}, "unknown flag -x"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"--nproc-per-node", "two", "prog"}, "\"two\" is not an integer"},
      {{"--nproc-per-node", "0", "prog"}, "--nproc-per-node 0 is out of range"},
      {{"--nnodes", "1:4", "prog"}, "elastic ranges"},
      {{"--nnodes", "2", "--node-rank", "2", "prog"},
       "--node-rank 2 is out of range for --nnodes 2"},
      {{"--master-port", "70000", "prog"},
       "--master-port 70000 is out of range"},
      {{"--max-restarts", "3", "prog"}, "restarts are not supported"},
      {{"--standalone", "--nnodes", "2", "prog"}, "--standalone is one node"},
      {{"--standalone", "--master-port", "5", "prog"}, "drop --master-addr"},
      {{"--standalone=1", "prog"}, "--standalone takes no value"},
      {{"--timeout_s", "-1", "prog"}, "--timeout_s: \"-1\""},
      {{"--timeout_s", "0", "prog"}, "> 0"},
  };
  for (const auto& [args, message] : cases) {
    EXPECT_THAT(
        ParseMuonrunArgs(args),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << absl::StrJoin(args, " ");
  }
}

// nnodes * nproc_per_node is computed in int64 (65536 x 65536 overflows
// int) and bounded by kMaxWorldSize, naming both flags.
TEST(ParseMuonrunArgsTest, WorldAboveMaxWorldSize_InvalidArgumentNamingFlags) {
  for (const auto& [nnodes, nproc] :
       std::vector<std::pair<std::string, std::string>>{{"65536", "65536"},
                                                        {"513", "512"}}) {
    EXPECT_THAT(ParseMuonrunArgs(
                    {"--nnodes", nnodes, "--nproc-per-node", nproc, "prog"}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("--nnodes " + nnodes),
                               HasSubstr("--nproc-per-node " + nproc),
                               HasSubstr("at most 262144"))))
        << nnodes << " x " << nproc;
  }
  absl::StatusOr<MuonrunOptions> most = ParseMuonrunArgs(
      {"--nnodes", "512", "--nproc-per-node", "512", "prog"});  // 262144
  ASSERT_THAT(most, IsOk());
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : RankEnvironment(*most, 511, {})) env[k] = v;
  EXPECT_EQ(env["WORLD_SIZE"], "262144");
}

// On several nodes rank 0's coordinator listens on --master-port + 1:
// 65535 is refused naming both flags, unless the environment names the
// coordinator or there is one node (a port the kernel picks).
TEST(CheckCoordinatorPortTest, MasterPort65535OnSeveralNodes_Refused) {
  MuonrunOptions o;
  o.nnodes = 2;
  o.master_port = 65535;
  EXPECT_THAT(CheckCoordinatorPort(o, {"A=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--master-port 65535"),
                             HasSubstr("--nnodes 2"))));
  EXPECT_THAT(CheckCoordinatorPort(o, {"MUON_COORDINATOR_PORT=29501"}), IsOk());
  o.master_port = 65534;
  EXPECT_THAT(CheckCoordinatorPort(o, {}), IsOk());
  o.nnodes = 1;
  o.master_port = 65535;
  EXPECT_THAT(CheckCoordinatorPort(o, {}), IsOk());
}

// A set but blank MUON_JOB_SECRET (or MUON_JOB_SECRET_FILE) would turn
// authentication off on every rank: refused naming it, on one node or
// several (where it passed the "a secret is required" check before).
TEST(WithJobSecretTest, BlankSecret_InvalidArgumentNamingVariable) {
  for (int nnodes : {1, 2}) {
    MuonrunOptions o;
    o.nnodes = nnodes;
    for (const char* blank : {"MUON_JOB_SECRET=", "MUON_JOB_SECRET=  \t"}) {
      EXPECT_THAT(WithJobSecret(o, {"A=1", blank}),
                  StatusIs(absl::StatusCode::kInvalidArgument,
                           HasSubstr("MUON_JOB_SECRET is")))
          << nnodes << " nodes, " << blank;
    }
    EXPECT_THAT(WithJobSecret(o, {"MUON_JOB_SECRET_FILE="}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("MUON_JOB_SECRET_FILE is set but empty")));
    absl::StatusOr<std::vector<std::string>> kept =
        WithJobSecret(o, {"MUON_JOB_SECRET=abc"});
    ASSERT_THAT(kept, IsOk());
    EXPECT_THAT(*kept, ElementsAre("MUON_JOB_SECRET=abc"));
    // Blank next to a usable other one: unset, as the ranks read it.
    EXPECT_THAT(WithJobSecret(o, {"MUON_JOB_SECRET=",
                                  "MUON_JOB_SECRET_FILE=/run/job.secret"}),
                IsOk());
    EXPECT_THAT(
        WithJobSecret(o, {"MUON_JOB_SECRET=abc", "MUON_JOB_SECRET_FILE="}),
        IsOk());
  }
}

// --- Environment ---------------------------------------------------------

TEST(RankEnvironmentTest, SecondNode_TorchrunValues) {
  MuonrunOptions o;
  o.nproc_per_node = 2;
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "192.0.2.1";
  o.master_port = 4000;
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : RankEnvironment(o, 1, {})) env[k] = v;
  EXPECT_EQ(env["RANK"], "3");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(env["GROUP_RANK"], "1");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(env["MASTER_ADDR"], "192.0.2.1");
  EXPECT_EQ(env["MASTER_PORT"], "4000");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
}

TEST(RankEnvironmentTest, OmpNumThreadsAlreadySet_Kept) {
  MuonrunOptions o;
  o.nproc_per_node = 2;
  for (const auto& [k, v] : RankEnvironment(o, 0, {"OMP_NUM_THREADS=8"})) {
    EXPECT_NE(k, "OMP_NUM_THREADS");
  }
}

// On one node muonrun hands the coordinator's address over in its private
// directory, unless the environment names the coordinator already or the
// job spans several nodes.
TEST(WithCoordinatorFileTest, OneNode_AddsFileUnlessCoordinatorNamed) {
  MuonrunOptions o;
  o.nnodes = 1;
  EXPECT_THAT(WithCoordinatorFile(o, {"A=1"}, "/tmp/muonrun.x"),
              ::testing::ElementsAre(
                  "A=1", "MUON_COORDINATOR_FILE=/tmp/muonrun.x/coordinator"));
  for (const char* named :
       {"MUON_COORDINATOR=127.0.0.1:29400", "MUON_COORDINATOR_PORT=29501",
        "MUON_COORDINATOR_FILE=/elsewhere/c"}) {
    EXPECT_TRUE(NamesCoordinator({named}));
    EXPECT_THAT(WithCoordinatorFile(o, {named}, "/tmp/muonrun.x"),
                ::testing::ElementsAre(named));
  }
  EXPECT_FALSE(NamesCoordinator({"MUON_COORDINATOR="}));
  o.nnodes = 2;
  EXPECT_THAT(WithCoordinatorFile(o, {"A=1"}, "/tmp/muonrun.x"),
              ::testing::ElementsAre("A=1"));
}

// A daemon named by MUON_COORDINATOR gets a host agent unless
// --no-host-agent; a Unix socket (already an agent) or none does not.
TEST(HostAgentTargetTest, DaemonNamed_AgentUnlessDisabledOrAlreadyOne) {
  MuonrunOptions o;
  EXPECT_EQ(HostAgentTarget(o, {"A=1", "MUON_COORDINATOR=10.0.0.1:29400"}),
            "10.0.0.1:29400");
  EXPECT_EQ(HostAgentTarget(o, {"MUON_COORDINATOR_PORT=29401"}), "");
  EXPECT_EQ(HostAgentTarget(o, {"MUON_COORDINATOR=unix:/tmp/x.sock"}), "");
  absl::StatusOr<MuonrunOptions> parsed =
      ParseMuonrunArgs({"--no-host-agent", "prog"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->host_agent);
  EXPECT_EQ(HostAgentTarget(*parsed, {"MUON_COORDINATOR=10.0.0.1:29400"}), "");
}

// The ranks reach the agent in plaintext on its socket: the coordinator's
// TLS client settings go to the agent, not to them.
TEST(WithHostAgentTest, CoordinatorReplacedAndTlsClientSettingsRemoved) {
  EXPECT_THAT(
      WithHostAgent(
          {"A=1", "MUON_COORDINATOR=10.0.0.1:29400", "MUON_TLS_CA_FILE=/ca.pem",
           "MUON_TLS_SERVER_NAME=coord", "MUON_TLS_CERT_FILE=/c.pem"},
          "unix:/tmp/muonrun.x/host-agent.sock"),
      ElementsAre("A=1", "MUON_TLS_CERT_FILE=/c.pem",
                  "MUON_COORDINATOR=unix:/tmp/muonrun.x/host-agent.sock"));
}

TEST(MergeEnvironmentTest, SameName_Replaced) {
  EXPECT_THAT(MergeEnvironment({"PATH=/bin", "RANK=7", "RANKX=1"},
                               {{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
              ElementsAre("PATH=/bin", "RANKX=1", "RANK=0", "WORLD_SIZE=2"));
}

// --- The binary ----------------------------------------------------------

TEST(MuonrunTest, TwoOfFourRanks_ChildrenSeeTorchrunEnvironment) {
  const std::string dir = TempDir();
  // An outer launcher's RANK must not leak into the ranks.
  RunResult r = RunMuonrun(
      Concat({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
              "--master-addr", "192.0.2.1", "--master-port", "4242"},
             Sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE "
                "$GROUP_RANK $MASTER_ADDR $MASTER_PORT $KEPT\" > " +
                dir + "/env.$RANK")),
      {"RANK=99", "KEPT=yes"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFile(dir + "/env.2"), "2 4 0 2 1 192.0.2.1 4242 yes\n");
  EXPECT_EQ(ReadFile(dir + "/env.3"), "3 4 1 2 1 192.0.2.1 4242 yes\n");
  EXPECT_EQ(ReadFile(dir + "/env.99"), "");
}

TEST(MuonrunTest, AllRanksSucceed_ExitZeroAndQuiet) {
  RunResult r = RunMuonrun(Concat({"--nproc-per-node", "3"}, Sh("exit 0")));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, "");
}

TEST(MuonrunTest, OneRankExitsNonZero_ReportsFirstAndStopsOthersQuickly) {
  RunResult r =
      RunMuonrun(Concat({"--nproc-per-node", "4", "--timeout_s", "50"},
                        Sh("if [ \"$RANK\" = 2 ]; then sleep 0.2; exit 3; fi; "
                           "exec sleep 40")));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, MatchesRegex("muonrun: rank 2 \\(local rank 2, pid "
                                  "[0-9]+\\) failed first: exited with code "
                                  "3\n(.|\n)*"));
  EXPECT_THAT(r.err, HasSubstr("muonrun: stopping 3 local ranks (SIGTERM"));
  EXPECT_THAT(r.err, HasSubstr("muonrun: stopped 3 local ranks\n"));
  EXPECT_LT(r.elapsed, absl::Seconds(8));
}

TEST(MuonrunTest, RankKillsItselfWithSigkill_ReportsSignalExit137) {
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "3", "--timeout_s", "50"},
             Sh("if [ \"$LOCAL_RANK\" = 1 ]; then sleep 0.2; kill -9 $$; fi; "
                "exec sleep 40")));
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_THAT(r.err, MatchesRegex("muonrun: rank 1 \\(local rank 1, pid "
                                  "[0-9]+\\) failed first: killed by signal 9 "
                                  "\\(SIGKILL\\)\n(.|\n)*"));
  EXPECT_LT(r.elapsed, absl::Seconds(8));
}

TEST(MuonrunTest, FailureOrder_FirstReapedIsReported) {
  // Rank 0 fails late, rank 1 early: rank 1 is reported.
  RunResult r =
      RunMuonrun(Concat({"--nproc-per-node", "2", "--timeout_s", "50"},
                        Sh("if [ \"$RANK\" = 0 ]; then sleep 3; exit 5; fi; "
                           "sleep 0.2; exit 6")));
  EXPECT_EQ(r.exit_code, 6) << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 1 (local rank 1, pid "));
  EXPECT_THAT(r.err, Not(HasSubstr("rank 0 (local rank 0")));
}

TEST(MuonrunTest, RanksIgnoringSigterm_KilledAfterGrace) {
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "3", "--grace_s", "0.5", "--timeout_s", "50"},
             Sh("trap '' TERM; if [ \"$RANK\" = 0 ]; then sleep 0.2; exit 1; "
                "fi; sleep 40")));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("stopped 2 local ranks (2 needed SIGKILL)"));
  EXPECT_LT(r.elapsed, absl::Seconds(8));
}

TEST(MuonrunTest, RankLeavesBackgroundChild_ChildKilledWithItsRank) {
  const std::string dir = TempDir();
  RunResult r = RunMuonrun(Concat(
      {"--nproc-per-node", "2", "--timeout_s", "50"},
      Sh("sleep 60 & echo $! > " + dir +
         "/bg.$RANK; if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 2; fi; wait")));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(
        absl::StripAsciiWhitespace(ReadFile(absl::StrCat(dir, "/bg.", rank))),
        &pid));
    EXPECT_TRUE(GoneWithin(pid, absl::Seconds(5)))
        << "background child " << pid << " of rank " << rank;
  }
}

// A rank that exits 0 while another runs stays muonrun's zombie until the
// job ends, so its pid, the number of its process group, cannot be given
// to another process whose group muonrun's last SIGKILL would then hit;
// and that group (the background child the rank left) is still killed
// when the other rank fails.
TEST(MuonrunTest, RankExitsEarly_PidHeldUntilJobEndsAndItsGroupKilled) {
  const std::string dir = TempDir();
  bool held = false;
  std::string stat;
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "2", "--timeout_s", "50"},
             Sh("if [ \"$RANK\" = 0 ]; then sleep 60 & echo $! > " + dir +
                "/bg; echo $$ > " + dir + "/pid.0; exit 0; fi; i=0; " +
                "while [ ! -e " + dir + "/go ] && [ $i -lt 400 ]; do " +
                "sleep 0.05; i=$((i+1)); done; exit 2")),
      {}, absl::Seconds(60), [&](pid_t muonrun, const std::string&) {
        // Rank 1 waits (at most 20 s) for "go" while this looks at rank 0.
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (!held && absl::Now() < deadline) {
          int pid = 0;
          if (absl::SimpleAtoi(
                  absl::StripAsciiWhitespace(ReadFile(dir + "/pid.0")), &pid) &&
              pid > 0) {
            // "pid (sh) Z ppid ...": exited, not reaped, muonrun's child.
            stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
            held = absl::StrContains(stat, absl::StrCat(") Z ", muonrun, " "));
          }
          if (!held) absl::SleepFor(absl::Milliseconds(20));
        }
        std::ofstream(dir + "/go") << "go\n";
      });
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(held) << "rank 0 after its exit, /proc/PID/stat: " << stat;
  int bg = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(dir + "/bg")), &bg));
  EXPECT_TRUE(GoneWithin(bg, absl::Seconds(5)))
      << "background child " << bg << " of rank 0";
}

// A rank that exits 0 leaving a process that writes to its stdout every
// 100 ms: muonrun still exits, after forwarding for the grace period, and
// says whose output it stopped forwarding (it drained until 200 ms of
// silence before, i.e. forever).
TEST(MuonrunTest, LeftoverProcessKeepsWriting_ExitsAfterGrace) {
  const std::string dir = TempDir();
  RunResult r = RunMuonrun(
      Concat({"--grace_s", "0.5"},
             Sh("(while :; do echo tick; sleep 0.1; done) & echo $! > " + dir +
                "/writer; exit 0")),
      {}, /*bound=*/absl::Seconds(30));
  int writer = 0;
  if (absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(dir + "/writer")),
                       &writer) &&
      writer > 0) {
    kill(writer, SIGKILL);  // usually gone already (SIGPIPE)
  }
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("[rank 0] tick\n"));
  EXPECT_THAT(r.err, HasSubstr("muonrun: rank 0's output was still being "
                               "written 500ms after the ranks ended"));
}

TEST(MuonrunTest, Timeout_StopsRanksExit124) {
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "2", "--timeout_s", "0.5", "--grace_s", "1"},
             Sh("exec sleep 40")));
  EXPECT_EQ(r.exit_code, kMuonrunTimeoutExitCode) << r.err;
  EXPECT_THAT(r.err, HasSubstr("muonrun: timed out"));
  EXPECT_LT(r.elapsed, absl::Seconds(8));
}

TEST(MuonrunTest, MuonrunGetsSigterm_ForwardsAndExits143) {
  const std::string dir = TempDir();
  RunResult r =
      RunMuonrun(Concat({"--nproc-per-node", "2", "--timeout_s", "50"},
                        Sh("trap 'echo term > " + dir +
                           "/term.$RANK; exit 0' TERM; touch " + dir +
                           "/up.$RANK; while :; do sleep 0.05; done")),
                 {}, absl::Seconds(60), [&](pid_t pid, const std::string&) {
                   const absl::Time deadline = absl::Now() + absl::Seconds(20);
                   while (absl::Now() < deadline &&
                          (access((dir + "/up.0").c_str(), F_OK) != 0 ||
                           access((dir + "/up.1").c_str(), F_OK) != 0)) {
                     absl::SleepFor(absl::Milliseconds(10));
                   }
                   kill(pid, SIGTERM);
                 });
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_THAT(r.err, HasSubstr("muonrun: received SIGTERM"));
  EXPECT_EQ(ReadFile(dir + "/term.0"), "term\n");
  EXPECT_EQ(ReadFile(dir + "/term.1"), "term\n");
}

// Each rank's lines come out whole, prefixed with "[rank N]", on the
// stream the rank wrote them to; two ranks writing long lines at once never
// interleave inside a line.
TEST(MuonrunTest, Output_WholeLinesPrefixedWithRank) {
  RunResult r = RunMuonrun(Concat(
      {"--nproc-per-node", "2"},
      Sh("i=0; while [ $i -lt 200 ]; do printf '%0800d\\n' $RANK; "
         "i=$((i+1)); done; echo to-stderr-$RANK >&2; printf tail-$RANK")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  int lines[2] = {0, 0};
  for (absl::string_view line : absl::StrSplit(r.out, '\n')) {
    if (line.empty()) continue;
    ASSERT_TRUE(absl::StartsWith(line, "[rank ")) << line.substr(0, 40);
    const int rank = line[6] - '0';
    ASSERT_TRUE(rank == 0 || rank == 1) << line.substr(0, 40);
    absl::string_view body = line.substr(9);
    if (absl::StartsWith(body, "tail-")) continue;
    ASSERT_EQ(body, std::string(799, '0') + std::string(1, '0' + rank))
        << "a line was cut or mixed: " << line.substr(0, 60);
    ++lines[rank];
  }
  EXPECT_EQ(lines[0], 200);
  EXPECT_EQ(lines[1], 200);
  EXPECT_THAT(r.out, HasSubstr("[rank 0] tail-0\n"));
  EXPECT_THAT(r.err, HasSubstr("[rank 1] to-stderr-1\n"));
}

// 4 MiB without a newline (as a progress bar rewriting one line with '\r'
// writes for hours): forwarded while the rank still runs, in pieces of
// 1 MiB, each a "[rank 0]" line, every byte once. Before, muonrun held
// the whole unfinished line until the rank ended.
TEST(MuonrunTest,
     MebibytesWithoutNewline_ForwardedInMebibytePiecesWhileRunning) {
  constexpr size_t kBytes = 4 << 20;
  constexpr size_t kPiece = 1 << 20;
  const std::string dir = TempDir();
  bool forwarded_while_running = false;
  RunResult r = RunMuonrun(
      Concat({"--timeout_s", "50"},
             Sh(absl::StrCat("head -c ", kBytes,
                             " /dev/zero | tr '\\0' x; i=0; while [ ! -e ", dir,
                             "/seen ] && [ $i -lt 400 ]; do sleep 0.05; ",
                             "i=$((i+1)); done"))),
      {}, absl::Seconds(60), [&](pid_t, const std::string& out_path) {
        // The rank waits (at most 20 s) for "seen": all but the last piece
        // must come out meanwhile.
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (!forwarded_while_running && absl::Now() < deadline) {
          const std::string out = ReadFile(out_path);
          forwarded_while_running =
              static_cast<size_t>(std::count(out.begin(), out.end(), 'x')) >=
              kBytes - kPiece;
          if (!forwarded_while_running) absl::SleepFor(absl::Milliseconds(20));
        }
        std::ofstream(dir + "/seen") << "seen\n";
      });
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(forwarded_while_running)
      << "muonrun held the unfinished line while the rank ran";
  size_t total = 0;
  int pieces = 0;
  for (absl::string_view line :
       absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
    ASSERT_TRUE(absl::ConsumePrefix(&line, "[rank 0] ")) << line.substr(0, 40);
    ASSERT_EQ(line.size(), kPiece);
    ASSERT_EQ(line.find_first_not_of('x'), absl::string_view::npos);
    total += line.size();
    ++pieces;
  }
  EXPECT_EQ(total, kBytes);
  EXPECT_EQ(pieces, 4);
}

TEST(MuonrunTest, NoRankPrefix_OutputPassesThrough) {
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "2", "--no-rank-prefix"}, Sh("echo $RANK")));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("[rank")));
  EXPECT_THAT(r.out, HasSubstr("0\n"));
  EXPECT_THAT(r.out, HasSubstr("1\n"));
}

TEST(MuonrunTest, ProgramNotFound_Exit127NamingIt) {
  RunResult r = RunMuonrun({"/nonexistent/program"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.err, HasSubstr("cannot execute \"/nonexistent/program\""));
  EXPECT_THAT(r.err, HasSubstr("rank 0 (local rank 0, pid "));
}

TEST(MuonrunTest, ProgramOnPath_Found) {
  RunResult r = RunMuonrun({"sh", "-c", "exit 0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A parent that ignores SIGCHLD leaves it ignored across exec: the kernel
// would reap the ranks itself and lose their exit codes (a failed job
// exiting 0, after waiting for the rank that sleeps). muonrun resets it
// and reports the rank's code.
TEST(MuonrunTest, StartedWithSigchldIgnored_ExitsWithRankCode) {
  RunResult r = RunMuonrun(
      Concat({"--nproc-per-node", "2", "--timeout_s", "50"},
             Sh("if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 40")),
      {}, absl::Seconds(60), nullptr, /*ignore_sigchld=*/true);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("failed first: exited with code 3"));
  EXPECT_LT(r.elapsed, absl::Seconds(8));
}

TEST(MuonrunTest, UsageError_Exit2WithMessageAndUsage) {
  RunResult r = RunMuonrun({"--nnodes", "2", "--node-rank", "5", "prog"});
  EXPECT_EQ(r.exit_code, kMuonrunUsageExitCode);
  EXPECT_THAT(r.err, HasSubstr("muonrun: --node-rank 5 is out of range"));
  EXPECT_THAT(r.err, HasSubstr("usage: muonrun"));
  RunResult none = RunMuonrun({});
  EXPECT_EQ(none.exit_code, kMuonrunUsageExitCode);
  EXPECT_THAT(none.err, HasSubstr("no program given"));
}

TEST(MuonrunTest, Help_UsageOnStdoutExit0) {
  RunResult r = RunMuonrun({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("usage: muonrun"));
  EXPECT_THAT(r.out, HasSubstr("--nproc-per-node"));
  // The coordinator is on MASTER_PORT + 1, as the docs say.
  EXPECT_THAT(r.out, HasSubstr("rank 0's embedded coordinator listens"));
  EXPECT_THAT(r.out, HasSubstr("on PORT + 1"));
}

// --- The library in-process ----------------------------------------------

TEST(RunRanksTest, OneRankFails_ResultListsEveryExit) {
  MuonrunOptions o;
  o.nproc_per_node = 3;
  o.grace = absl::Seconds(5);
  o.timeout = absl::Seconds(50);
  o.program = Sh("if [ \"$RANK\" = 0 ]; then exit 4; fi; exec sleep 40");
  std::ostringstream err;
  absl::StatusOr<RunRanksResult> r = RunRanks(o, err);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, 4);
  ASSERT_TRUE(r->first_failure.has_value());
  EXPECT_EQ(r->first_failure->rank, 0);
  EXPECT_EQ(r->first_failure->Describe(), "exited with code 4");
  EXPECT_EQ(r->stopped, 2);
  EXPECT_EQ(r->killed, 0);
  ASSERT_EQ(r->exits.size(), 3u);
  EXPECT_EQ(r->exits[1].signal, SIGTERM);
  EXPECT_EQ(r->exits[2].signal, SIGTERM);
}

// RunRanks in a process that ignores SIGCHLD (the library, without
// InstallMuonrunSignalHandlers): the kernel reaps the rank that exits 3,
// its status is lost, and that is a failure with an unknown status, not
// a success.
TEST(RunRanksTest, SigchldIgnored_LostExitStatusIsFailure) {
  MuonrunOptions o;
  o.grace = absl::Seconds(5);
  o.timeout = absl::Seconds(50);
  o.program = Sh("exit 3");
  struct sigaction ignore, old;
  std::memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGCHLD, &ignore, &old), 0);
  std::ostringstream err;
  const absl::Time start = absl::Now();
  absl::StatusOr<RunRanksResult> r = RunRanks(o, err);
  const absl::Duration elapsed = absl::Now() - start;
  sigaction(SIGCHLD, &old, nullptr);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->exit_code, kMuonrunUnknownStatusExitCode) << err.str();
  ASSERT_TRUE(r->first_failure.has_value());
  EXPECT_TRUE(r->first_failure->status_unknown);
  EXPECT_THAT(err.str(), HasSubstr("failed first: exit status unknown"));
  EXPECT_LT(elapsed, absl::Seconds(8));
}

TEST(RankExitTest, StatusUnknown_FailureWithUnknownStatusCode) {
  RankExit e{2, 2, 10, 0, 0, /*status_unknown=*/true};
  EXPECT_TRUE(e.failed());
  EXPECT_EQ(e.status_code(), kMuonrunUnknownStatusExitCode);
  EXPECT_THAT(e.Describe(), HasSubstr("exit status unknown"));
}

TEST(RankExitTest, Describe_ExitAndSignal) {
  EXPECT_EQ((RankExit{2, 2, 10, 1, 0}).Describe(), "exited with code 1");
  EXPECT_EQ((RankExit{2, 2, 10, 0, 9}).Describe(),
            "killed by signal 9 (SIGKILL)");
  EXPECT_EQ((RankExit{2, 2, 10, 0, 9}).status_code(), 137);
}

}  // namespace
}  // namespace muon
