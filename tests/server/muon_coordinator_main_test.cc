// Tests of the muon-coordinator daemon binary: it starts on a free port,
// writes --port_file, answers RPCs and exits 0 on SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "control/grpc_coordination_client.h"
#include "coordination/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "tests/http_get.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::HttpGet;
using ::testing::HasSubstr;

// Polls `pid` for up to `timeout`; returns its wait status or -1.
int WaitFor(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return -1;
}

TEST(MuonCoordinatorMainTest,
     Daemon_PortFileAndSigterm_ServesThenExitsCleanly) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string port_file =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/coordinator.port");
  std::remove(port_file.c_str());
  const std::string binary = "server/muon-coordinator";
  const std::string port_flag = "--port_file=" + port_file;
  // The daemon takes the job secret from the environment it inherits.
  const std::string secret = "daemon-test-secret";
  ASSERT_EQ(setenv("MUON_JOB_SECRET", secret.c_str(), 1), 0);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(binary.c_str(), binary.c_str(), "--job_id=daemon", "--world_size=2",
          "--policy=round_robin", port_flag.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }

  int port = 0;
  for (int i = 0; i < 250 && port == 0; ++i) {  // up to ~5 s
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  if (port == 0) {
    kill(pid, SIGKILL);
    WaitFor(pid, absl::Seconds(5));
    FAIL() << "daemon wrote no port to " << port_file;
  }

  absl::StatusOr<std::unique_ptr<GrpcCoordinationClient>> client =
      GrpcCoordinationClient::Create(absl::StrCat("127.0.0.1:", port), "daemon",
                                     absl::Seconds(2),
                                     GrpcClientSecurity{secret, "", ""});
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<v1::JobInfo> job = (*client)->GetJob();
  EXPECT_THAT(job, IsOk());
  if (job.ok()) {
    EXPECT_EQ(job->job_id(), "daemon");
    EXPECT_EQ(job->world_size(), 2);
    EXPECT_EQ(job->state(), v1::JOB_STATE_WAITING);
  }

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitFor(pid, absl::Seconds(10));
  if (status == -1) {
    kill(pid, SIGKILL);
    WaitFor(pid, absl::Seconds(5));
    FAIL() << "daemon did not exit on SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(MuonCoordinatorMainTest, Daemon_BadPolicy_ExitsWithUsageError) {
  const std::string binary = "server/muon-coordinator";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(binary.c_str(), binary.c_str(), "--policy=fastest",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const int status = WaitFor(pid, absl::Seconds(10));
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

// Out-of-range numeric flags exit with status 2 before anything starts,
// naming the flag and its value: non-positive or non-finite timeouts, a
// world size outside [0, kMaxWorldSize], a non-positive message limit.
TEST(MuonCoordinatorMainTest, Daemon_OutOfRangeFlags_ExitUsageNamingFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--heartbeat_timeout_s=0", "--heartbeat_timeout_s=0 must be"},
      {"--heartbeat_timeout_s=-3", "--heartbeat_timeout_s=-3 must be"},
      {"--heartbeat_timeout_s=inf", "--heartbeat_timeout_s=inf must be"},
      {"--join_timeout_s=nan", "--join_timeout_s=nan must be"},
      {"--join_timeout_s=0", "--join_timeout_s=0 must be"},
      {"--world_size=-1", "--world_size=-1 must be in [0, 262144]"},
      {"--world_size=262145", "--world_size=262145 must be in [0, 262144]"},
      {"--max_message_bytes=0", "--max_message_bytes=0 must be positive"},
      {"--max_message_bytes=-5", "--max_message_bytes=-5 must be positive"},
  };
  for (const auto& [flag, message] : cases) {
    // `timeout`: a daemon that accepted the flag would serve forever.
    const std::string command =
        "MUON_JOB_SECRET=flag-test-secret timeout 10 server/muon-coordinator " +
        flag + " 2>&1";
    FILE* out = popen(command.c_str(), "r");
    ASSERT_NE(out, nullptr);
    std::string text;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), out)) > 0 &&
                   text.size() < (1 << 20);) {
      text.append(buf, n);
    }
    const int status = pclose(out);
    EXPECT_TRUE(WIFEXITED(status)) << flag;
    EXPECT_EQ(WEXITSTATUS(status), 2) << flag << "\n" << text;
    EXPECT_THAT(text, HasSubstr(message)) << flag;
    EXPECT_THAT(text, ::testing::Not(HasSubstr("listening"))) << flag;
  }
}

// `muon-coordinator --help` lists the daemon's own flags (Abseil printed
// "No flags matched" before: it looks for files named after the program).
TEST(MuonCoordinatorMainTest, Help_ListsTheDaemonFlags) {
  FILE* out = popen("server/muon-coordinator --help 2>&1", "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  char buf[4096];
  for (size_t n;
       (n = fread(buf, 1, sizeof(buf), out)) > 0 && text.size() < (1 << 20);) {
    text.append(buf, n);
  }
  pclose(out);
  EXPECT_EQ(text.find("No flags matched"), std::string::npos) << text;
  for (const char* flag :
       {"--port_file", "--job_id", "--metrics_port", "--policy", "--host"}) {
    EXPECT_NE(text.find(flag), std::string::npos) << flag << "\n" << text;
  }
}

std::string TestTmp() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Starts the daemon with `flags` (and no MUON_JOB_SECRET in its
// environment); returns its pid and the port it wrote, 0 when none in 5 s.
std::pair<pid_t, int> StartDaemon(const std::vector<std::string>& flags) {
  const std::string port_file = TestTmp() + "/auth.port";
  std::remove(port_file.c_str());
  std::vector<std::string> args = {"server/muon-coordinator",
                                   "--port_file=" + port_file};
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = fork();
  if (pid == 0) {
    unsetenv("MUON_JOB_SECRET");
    unsetenv("MUON_JOB_SECRET_FILE");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 250 && port == 0 && pid > 0; ++i) {  // up to ~5 s
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) absl::SleepFor(absl::Milliseconds(20));
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return {-1, 0};
  }
  return {pid, port};
}

void StopDaemon(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  if (WaitFor(pid, absl::Seconds(10)) == -1) {
    kill(pid, SIGKILL);
    WaitFor(pid, absl::Seconds(5));
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The daemon's job id is used when a client names none; rejected requests are
// logged with glog on stderr; --metrics_port serves Prometheus text.
TEST(MuonCoordinatorMainTest, Daemon_LogsRejectedRequestsAndServesMetrics) {
  const std::string port_file = TestTmp() + "/logs.port";
  const std::string out_file = TestTmp() + "/logs.stdout";
  const std::string err_file = TestTmp() + "/logs.stderr";
  std::remove(port_file.c_str());
  const int metrics_port = ::muon::testing::FreePort();
  ASSERT_GT(metrics_port, 0);
  const std::string binary = "server/muon-coordinator";
  const std::string port_flag = "--port_file=" + port_file;
  const std::string metrics_flag =
      absl::StrCat("--metrics_port=", metrics_port);
  const std::string secret = "daemon-logs-secret";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("MUON_JOB_SECRET", secret.c_str(), 1);
    const int out = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(out, 1);
    dup2(err, 2);
    execl(binary.c_str(), binary.c_str(), "--job_id=demo", port_flag.c_str(),
          metrics_flag.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  for (int i = 0; i < 250 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) port = 0;
    if (port == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  if (port == 0) {
    StopDaemon(pid);
    FAIL() << "daemon wrote no port; stderr: " << ReadAll(err_file);
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto connect = [&](const std::string& job, const std::string& token) {
    return *GrpcCoordinationClient::Create(address, job, absl::Seconds(3),
                                           GrpcClientSecurity{token, "", ""});
  };
  absl::StatusOr<v1::JobInfo> job = connect("", secret)->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->job_id(), "demo");
  EXPECT_THAT(connect("fashion-mnist", secret)->GetJob(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("serves job \"demo\"")));
  EXPECT_THAT(connect("", "wrong")->GetJob(),
              StatusIs(absl::StatusCode::kUnauthenticated, ::testing::_));
  const std::string metrics = HttpGet(metrics_port, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("muon_job_state{state=\"waiting\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("muon_plan_version -1"));
  StopDaemon(pid);

  EXPECT_THAT(ReadAll(out_file),
              HasSubstr(absl::StrCat("muon-coordinator metrics on "
                                     "http://127.0.0.1:",
                                     metrics_port, "/metrics")));
  const std::string log = ReadAll(err_file);
  EXPECT_THAT(log, HasSubstr("event=rejected reason=job_id "
                             "request_job=fashion-mnist job=demo"));
  EXPECT_THAT(log, HasSubstr("event=rejected reason=unauthenticated "
                             "credentials=invalid"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("wrong")));  // no token logged
}

TEST(MuonCoordinatorMainTest,
     Daemon_SecretAndReadTokenFiles_Created0600AndEnforced) {
  const std::string secret_file = TestTmp() + "/job.secret";
  const std::string read_file = TestTmp() + "/read.token";
  std::remove(secret_file.c_str());
  std::remove(read_file.c_str());
  auto [pid, port] = StartDaemon({"--job_id=auth", "--world_size=2",
                                  "--secret_file=" + secret_file,
                                  "--read_token_file=" + read_file});
  ASSERT_GT(port, 0) << "daemon did not start";
  struct stat st;
  ASSERT_EQ(stat(secret_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  ASSERT_EQ(stat(read_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  absl::StatusOr<std::string> secret = ReadSecretFile(secret_file);
  absl::StatusOr<std::string> token = ReadSecretFile(read_file);
  ASSERT_THAT(secret, IsOk());
  ASSERT_THAT(token, IsOk());
  const std::string address = absl::StrCat("127.0.0.1:", port);
  auto connect = [&](const std::string& t) {
    return *GrpcCoordinationClient::Create(address, "", absl::Seconds(3),
                                           GrpcClientSecurity{t, "", ""});
  };
  EXPECT_THAT(connect("")->GetJob(),
              StatusIs(absl::StatusCode::kUnauthenticated,
                       ::testing::Not(HasSubstr("auth"))));
  absl::StatusOr<v1::JobInfo> job = connect(*token)->GetJob();
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->job_id(), "auth");
  EXPECT_THAT(connect(*token)->KeySet("k", "v"),
              StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_THAT(connect(*secret)->KeySet("k", "v"), IsOk());
  StopDaemon(pid);
}

TEST(MuonCoordinatorMainTest, Daemon_WorldReadableSecretFile_ExitsNamingMode) {
  const std::string secret_file = TestTmp() + "/open.secret";
  std::remove(secret_file.c_str());
  {
    std::ofstream out(secret_file);
    out << "0123456789abcdef\n";
  }
  ASSERT_EQ(chmod(secret_file.c_str(), 0644), 0);
  auto [pid, port] = StartDaemon({"--secret_file=" + secret_file});
  EXPECT_EQ(port, 0);
  EXPECT_EQ(pid, -1) << "the daemon kept running with a world-readable secret";
  StopDaemon(pid);
}

}  // namespace
}  // namespace muon
