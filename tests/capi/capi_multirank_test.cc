// Multi-process test of the C ABI: 4 rank processes of capi_rank_main (a C
// program over capi/muonrt.h) with torchrun's environment (RANK,
// WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT; rank 0 embeds the
// coordinator on MASTER_PORT+1, the others start once it listens) run
// FSDP Shard(0) over dp_shard=4 for 3
// steps; the assembled shards must equal, bitwise, the same 3 steps run
// single-device through the same C API, and the distributed checkpoint
// must load (resharded) into the single-device optimizer with the same
// momentum. Every process started here is waited for with a bound and
// killed past it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "tools/launcher.h"

namespace muon {
namespace {

using ::testing::Each;
using ::testing::Eq;

constexpr char kRankMain[] = "tests/capi/capi_rank_main";
constexpr int kWorld = 4;

// The model of capi_rank_main.c: global rows, cols, bytes per element.
struct ParamShape {
  int64_t rows, cols, elem;
};
constexpr ParamShape kModel[] = {{10, 6, 4}, {6, 5, 4}, {8, 12, 4}, {7, 8, 2}};

// torch.chunk's size of chunk `index` of `n` rows in `parts`.
int64_t ChunkRows(int64_t n, int parts, int index) {
  const int64_t chunk = (n + parts - 1) / parts;
  const int64_t begin = std::min(n, chunk * index);
  const int64_t end = std::min(n, chunk * (index + 1));
  return end - begin;
}

// Waits until 127.0.0.1:`port` accepts connections, up to `timeout`, or
// until process `pid` has exited (then *exited is set and false returned:
// e.g. the port was taken by another process after FreePort chose it).
bool WaitForListener(int port, absl::Duration timeout, pid_t pid = -1,
                     bool* exited = nullptr) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, WNOHANG) == pid) {
      if (exited != nullptr) *exited = true;
      return false;
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    const bool ok =
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

// Environment shared by every process: one OpenBLAS thread, so an owner
// rank and the single-device run compute Newton-Schulz with the same bits
// (kernels/newton_schulz.h).
std::vector<std::string> CommonEnv() { return {"OPENBLAS_NUM_THREADS=1"}; }

// Starts `kWorld` ranks of `mode` (rank 0 first, the others once its
// coordinator listens) and returns their exit codes (bounded: killed after
// `timeout`).
std::vector<int> RunRanksOnce(const std::string& mode, const std::string& dir,
                              const std::string& job_id, absl::Duration timeout,
                              bool* port_taken) {
  const int port = ::muon::testing::FreePort();
  EXPECT_GT(port, 1);
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    std::vector<std::string> env = CommonEnv();
    env.push_back(absl::StrCat("RANK=", r));
    env.push_back(absl::StrCat("WORLD_SIZE=", kWorld));
    env.push_back(absl::StrCat("LOCAL_RANK=", r));
    env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", kWorld));
    env.push_back("MASTER_ADDR=127.0.0.1");
    // The embedded coordinator listens on MASTER_PORT + 1 (the free one).
    env.push_back(absl::StrCat("MASTER_PORT=", port - 1));
    env.push_back(absl::StrCat("MUON_JOB_ID=", job_id));
    absl::StatusOr<pid_t> pid = SpawnProcess({kRankMain, mode, dir}, env);
    if (!pid.ok()) {
      ADD_FAILURE() << pid.status();
      break;
    }
    pids.push_back(*pid);
    bool exited = false;
    if (r == 0 && !WaitForListener(port, absl::Seconds(30), *pid, &exited)) {
      if (exited) {
        *port_taken = true;  // rank 0 gave up: start again on another port
        return std::vector<int>(kWorld, -2);
      }
      ADD_FAILURE() << "rank 0's coordinator did not listen on port " << port;
      break;
    }
  }
  std::vector<int> codes = WaitAll(pids, timeout, absl::Seconds(20));
  codes.resize(kWorld, -2);  // ranks that could not be started
  return codes;
}

// Rank 0 exits at once when the port FreePort chose was taken in between
// (another test's server): the job is then started again on a new port, at
// most kPortAttempts times.
constexpr int kPortAttempts = 3;

std::vector<int> RunRanks(const std::string& mode, const std::string& dir,
                          const std::string& job_id, absl::Duration timeout) {
  for (int attempt = 1;; ++attempt) {
    bool port_taken = false;
    std::vector<int> codes =
        RunRanksOnce(mode, dir, job_id, timeout, &port_taken);
    if (!port_taken || attempt == kPortAttempts) return codes;
  }
}

TEST(CapiMultirankTest, Fsdp4Ranks_MatchesSingleDeviceBitwise) {
  absl::StatusOr<std::string> dir = MakeTempDir("capi_multirank");
  ASSERT_TRUE(dir.ok()) << dir.status();

  EXPECT_THAT(RunRanks("dist", *dir, "capi_fsdp", absl::Seconds(150)),
              Each(Eq(0)));
  // The single-device run, also in its own process (same OpenBLAS setup);
  // it checks the distributed checkpoint's momentum itself.
  absl::StatusOr<pid_t> single =
      SpawnProcess({kRankMain, "single", *dir}, CommonEnv());
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_THAT(WaitAll({*single}, absl::Seconds(60)), Each(Eq(0)));

  const std::string expected = ReadFile(*dir + "/single.bin");
  std::vector<std::string> shards;
  for (int r = 0; r < kWorld; ++r) {
    shards.push_back(ReadFile(absl::StrCat(*dir, "/rank_", r, ".bin")));
  }
  // Assemble: per parameter, the ranks' row chunks in rank order.
  std::string assembled;
  std::vector<size_t> offset(kWorld, 0);
  size_t expected_size = 0;
  for (const ParamShape& p : kModel) {
    expected_size += p.rows * p.cols * p.elem;
    for (int r = 0; r < kWorld; ++r) {
      const size_t bytes = ChunkRows(p.rows, kWorld, r) * p.cols * p.elem;
      ASSERT_LE(offset[r] + bytes, shards[r].size()) << "rank " << r;
      assembled.append(shards[r], offset[r], bytes);
      offset[r] += bytes;
    }
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(offset[r], shards[r].size()) << "rank " << r;
  }
  ASSERT_EQ(expected.size(), expected_size);
  ASSERT_EQ(assembled.size(), expected.size());
  size_t first_diff = 0;
  while (first_diff < expected.size() &&
         assembled[first_diff] == expected[first_diff]) {
    ++first_diff;
  }
  EXPECT_EQ(first_diff, expected.size())
      << "the distributed parameters differ from the single-device ones at "
         "byte "
      << first_diff;
}

TEST(CapiMultirankTest, MismatchedManifests_EveryRankGetsInvalidArgument) {
  absl::StatusOr<std::string> dir = MakeTempDir("capi_mismatch");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_THAT(
      RunRanks("dist_mismatch", *dir, "capi_mismatch", absl::Seconds(120)),
      Each(Eq(3)));
}

// One rank's parameter of an unknown dtype, refused by the C ABI before it
// can join: the other ranks' creates fail at once naming it, not after
// their 60 s join timeout.
TEST(CapiMultirankTest, OneRankBadDtype_EveryRankFailsAtOnceNamingIt) {
  absl::StatusOr<std::string> dir = MakeTempDir("capi_bad_dtype");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      RunRanks("dist_bad_dtype", *dir, "capi_bad_dtype", absl::Seconds(120)),
      Each(Eq(3)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));
}

// One rank's own check fails before it creates its optimizer
// (muonrt_pg_report_create_failure): the other ranks' creates fail at once
// naming it and its message, not after their 60 s join timeout.
TEST(CapiMultirankTest, OneRankReportsItsCheckFailed_EveryRankFailsAtOnce) {
  absl::StatusOr<std::string> dir = MakeTempDir("capi_caller_refused");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const absl::Time start = absl::Now();
  EXPECT_THAT(RunRanks("dist_caller_refused", *dir, "capi_caller_refused",
                       absl::Seconds(120)),
              Each(Eq(3)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(40));
}

}  // namespace
}  // namespace muon
