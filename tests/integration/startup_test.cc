// Start-up that cannot collide: under muonrun on one node, rank 0's
// coordinator binds a port the kernel picks and hands its address to the
// other ranks through muonrun's private directory, so a job whose
// MASTER_PORT + 1 is held by another process still starts; and 50
// back-to-back 4-rank start-ups under CPU load all succeed. Every process
// started here is bounded by a timeout and stopped here.
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command_util.h"

namespace muon {
namespace {

using ::muon::testing::CommandResult;
using ::muon::testing::RunCommand;
using ::testing::HasSubstr;

constexpr char kMuonrun[] = "tools/muonrun";
constexpr char kRank[] = "tests/integration/pg_rank";

// A TCP socket listening on 127.0.0.1 at a port the kernel picks, closed
// on destruction: "another job" holding that port.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 &&
        bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        listen(fd_, 16) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~HeldPort() {
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// `n` processes spinning on a CPU each until destruction (SIGKILL, and
// PR_SET_PDEATHSIG should the test die first).
class CpuLoad {
 public:
  explicit CpuLoad(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile unsigned long spin = 0;
        // Bounded: at most 10 minutes even if nobody kills it.
        const absl::Time end = absl::Now() + absl::Minutes(10);
        while (absl::Now() < end) {
          for (int k = 0; k < 1000000; ++k) spin = spin + 1;
        }
        _exit(0);
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuLoad() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  int size() const { return static_cast<int>(pids_.size()); }

 private:
  std::vector<pid_t> pids_;
};

std::string Muonrun(int nproc, int master_port) {
  return absl::StrCat(kMuonrun, " --nproc-per-node ", nproc,
                      " --master-addr 127.0.0.1 --master-port ", master_port,
                      " --timeout_s 90 --grace_s 5 ", kRank);
}

// The port after MASTER_PORT is held by someone else: the job starts all
// the same (its coordinator is at a port the kernel picked). Pinning the
// coordinator to the held port (MUON_COORDINATOR_PORT) fails instead,
// naming the port: that was every job's fixed port before.
TEST(StartupTest, MasterPortPlusOneTaken_FourRanksStillStart) {
  HeldPort held;
  ASSERT_GT(held.port(), 1);
  const int master_port = held.port() - 1;
  const CommandResult ok = RunCommand(Muonrun(4, master_port), 120);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;

  const CommandResult pinned =
      RunCommand(absl::StrCat("env MUON_COORDINATOR_PORT=", held.port(), " ",
                              Muonrun(4, master_port)),
                 120);
  EXPECT_NE(pinned.exit_code, 0) << pinned.output;
  EXPECT_THAT(pinned.output, HasSubstr(absl::StrCat(held.port())));
}

// 50 four-rank jobs, one after another, while two processes keep the CPUs
// busy: every one starts, rendezvouses and exits 0. Prints the start-up
// times (median and worst).
TEST(StartupTest, FiftyBackToBackStartsUnderCpuLoad_AllSucceed) {
  constexpr int kStarts = 50;
  CpuLoad load(2);
  ASSERT_EQ(load.size(), 2);
  std::vector<double> seconds;
  int failures = 0;
  std::string first_failure;
  for (int i = 0; i < kStarts; ++i) {
    HeldPort held;  // Each job's MASTER_PORT + 1 is taken, too.
    const absl::Time start = absl::Now();
    const CommandResult r = RunCommand(Muonrun(4, held.port() - 1), 120);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    if (r.exit_code != 0) {
      ++failures;
      if (first_failure.empty()) {
        first_failure =
            absl::StrCat("start ", i, ": exit ", r.exit_code, "\n", r.output);
      }
    }
  }
  std::sort(seconds.begin(), seconds.end());
  std::printf(
      "%d 4-rank start-ups under load of 2 spinning processes: "
      "%d failed; median %.2f s, worst %.2f s\n",
      kStarts, failures, seconds[seconds.size() / 2], seconds.back());
  EXPECT_EQ(failures, 0) << first_failure;
}

}  // namespace
}  // namespace muon
