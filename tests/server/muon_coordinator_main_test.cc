// Tests of the muon-coordinator daemon binary: it starts on a free port,
// writes --port_file, answers RPCs and exits 0 on SIGTERM.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/grpc_coordination_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

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
    EXPECT_EQ(job->state(), "waiting");
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

}  // namespace
}  // namespace muon
