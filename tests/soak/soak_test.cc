// The soak: a muon-coordinator daemon and SOAK_RANKS (default 8) rank processes
// (tests/soak:soak_rank, FSDP over every rank, Gloo on loopback) run SOAK_STEPS
// (default 10,000) Muon steps on a few small matrices. Every rank samples its
// own RSS (VmRSS) after step 1 and every SOAK_SAMPLE_EVERY (default 1,000)
// steps; the test samples the daemon's (/proc/PID/status) when every rank has
// passed each of those steps and once more after all ranks exited. It checks
// that
//   - every rank ran every step and exited 0, and the daemon lists every
//     rank "finished" with its last step report at step SOAK_STEPS and no
//     job error (`muonctl status --json`);
//   - no process's RSS grew by more than kMaxGrowthKb from the warm-up
//     sample (step SOAK_WARMUP, default 1,000) to the end, at any sample
//     in between included;
// and prints one line per process (RSS at warm-up, at the end, growth,
// largest sample after warm-up, every sample) and the wall time; the files
// (rank stderr, samples) stay in the temporary folder it names when it
// fails. Every process it starts is killed and
// reaped on every path (and dies with it: PR_SET_PDEATHSIG). A per-job
// secret: the children inherit this process's environment, and
// MUON_JOB_SECRET is set to a random value when it is not set already.
// tools/soak.sh runs it outside Bazel with other step and rank counts.
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/soak/rss.h"
#include "tools/launcher.h"

namespace muon {
namespace {

// Largest RSS growth accepted per process from the warm-up sample to any
// later one. Measured (2 busy cores): from step 1,000 to 10,000 with 8
// ranks the daemon grew 240 kB and each rank 8-36 kB; with 2 ranks from
// step 10,000 to 100,000 the daemon grew 228 kB, levelling off (+4..12 kB
// per 10,000 steps at the end), the ranks 16-28 kB: allocator settling,
// not a leak per step or report. 1 MiB is 4x the largest; it catches a
// leak of ~12 bytes per step report in the daemon (80,000 reports) or
// ~120 bytes per step in a rank. The daemon's first ~1.4 MB fill its
// report rings (reports_kept = 256 per rank), before the warm-up step.
constexpr int64_t kMaxGrowthKb = 1024;

int EnvInt(const char* name, int fallback, int min = 1) {
  const char* v = std::getenv(name);
  int n = fallback;
  if (v == nullptr || !absl::SimpleAtoi(v, &n) || n < min) return fallback;
  return n;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Occurrences of `what` in `text`.
int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

// FSDP over `ranks`: a handful of small matrices, some not divisible by
// the world size (torch.chunk shards, empty ones included).
std::string Spec(int ranks, bool async, int64_t bucket_bytes) {
  return absl::StrCat(R"json({
  "job_id": "soak",
  "mesh": {"dims": [{"name": "dp_shard", "size": )json",
                      ranks, R"json(}]},
  "params": [
    {"name": "a", "shape": [64, 32], "placements": ["Shard(0)"]},
    {"name": "b", "shape": [32, 64], "placements": ["Shard(0)"]},
    {"name": "c", "shape": [16, 16], "placements": ["Shard(0)"]},
    {"name": "d", "shape": [24, 48], "placements": ["Shard(1)"]},
    {"name": "e", "shape": [40, 20], "placements": ["Shard(0)"]},
    {"name": "f", "shape": [6, 16], "placements": ["Shard(0)"]}
  ],
  "optimizer": {"lr": 0.02, "weight_decay": 0.1},
  "execution": {"async_gpu_parallelism": )json",
                      async ? "true" : "false",
                      R"json(, "prefetch_count": 1,
                "bucket_size_bytes": )json",
                      bucket_bytes, R"json(}
})json");
}

// The processes of one run: SIGKILLed and reaped when it goes out of scope
// (every failure path), those already reaped excepted.
class Processes {
 public:
  ~Processes() {
    for (pid_t& p : pids_) {
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        p = -1;
      }
    }
  }
  int Add(pid_t pid) {
    pids_.push_back(pid);
    return static_cast<int>(pids_.size()) - 1;
  }
  pid_t pid(int i) const { return pids_[i]; }
  bool running(int i) const { return pids_[i] > 0; }
  // The exit code (128 + signal when killed) once `i` ended, else -1.
  int Poll(int i) {
    int st = 0;
    if (pids_[i] <= 0 || waitpid(pids_[i], &st, WNOHANG) != pids_[i]) {
      return -1;
    }
    pids_[i] = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  // Waits up to `timeout` for `i`, then SIGKILLs it; its exit code.
  int Wait(int i, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const int code = Poll(i);
      if (code >= 0) return code;
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pids_[i], SIGKILL);
    waitpid(pids_[i], nullptr, 0);
    pids_[i] = -1;
    return -1;
  }

 private:
  std::vector<pid_t> pids_;
};

// RSS samples of one process: step -> KiB (step -1: after the end).
struct Series {
  std::string name;
  std::map<int64_t, int64_t> kb;
};

// Parses a rank's "STEP KB" / "end KB" lines.
void ParseRankFile(const std::string& path, Series& s) {
  std::istringstream in(ReadFile(path));
  std::string step, kb;
  while (in >> step >> kb) {
    int64_t k = -1, n = -1;
    if (!absl::SimpleAtoi(kb, &k)) continue;
    if (step == "end") {
      s.kb[-1] = k;
    } else if (absl::SimpleAtoi(step, &n)) {
      s.kb[n] = k;
    }
  }
}

// "exec [setpriv --pdeathsig KILL --] ARGS 2>ERR": the process dies with
// this one (the daemon cannot set it itself).
std::vector<std::string> Shell(const std::string& args, const std::string& err,
                               bool pdeathsig) {
  const bool setpriv = pdeathsig && access("/usr/bin/setpriv", X_OK) == 0;
  return {"/bin/sh", "-c",
          absl::StrCat("exec ",
                       setpriv ? "/usr/bin/setpriv --pdeathsig KILL -- " : "",
                       args, " >", err, ".out 2>", err)};
}

TEST(SoakTest, DaemonAndRanks_AllStepsFinished_RssFlat) {
  const int ranks = EnvInt("SOAK_RANKS", 8);
  const int steps = EnvInt("SOAK_STEPS", 10000);
  const int every = EnvInt("SOAK_SAMPLE_EVERY", std::min(1000, steps));
  const int warmup = EnvInt("SOAK_WARMUP", std::min(1000, steps));
  const absl::Duration timeout = absl::Seconds(EnvInt("SOAK_TIMEOUT_S", 600));
  ASSERT_EQ(warmup % every, 0) << "SOAK_WARMUP must be a multiple of "
                                  "SOAK_SAMPLE_EVERY";
  if (std::getenv("MUON_JOB_SECRET") == nullptr) {
    std::random_device rd;
    setenv("MUON_JOB_SECRET",
           absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd()).c_str(),
           0);
  }
  absl::StatusOr<std::string> dir = MakeTempDir("soak-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::ofstream(*dir + "/spec.json")
      << Spec(ranks, EnvInt("SOAK_ASYNC", 1, 0) != 0,
              EnvInt("SOAK_BUCKET_BYTES", 0, 0));
  std::cout << "soak: " << ranks << " ranks x " << steps
            << " steps with a muon-coordinator daemon, files in " << *dir
            << std::endl;

  const absl::Time start = absl::Now();
  Processes procs;
  const std::string port_file = *dir + "/port";
  absl::StatusOr<pid_t> daemon_pid = SpawnProcess(Shell(
      absl::StrCat("server/muon-coordinator --port=0 --port_file=", port_file,
                   " --job_id=soak --world_size=", ranks,
                   " --join_timeout_s=120"),
      *dir + "/daemon.err", /*pdeathsig=*/true));
  ASSERT_TRUE(daemon_pid.ok()) << daemon_pid.status();
  const int daemon = procs.Add(*daemon_pid);
  absl::StatusOr<int> port =
      WaitForPortFile(port_file, *daemon_pid, absl::Seconds(60));
  ASSERT_TRUE(port.ok()) << port.status() << "\n"
                         << ReadFile(*dir + "/daemon.err");
  const std::string address = absl::StrCat("127.0.0.1:", *port);

  std::vector<int> rank_index;
  for (int r = 0; r < ranks; ++r) {
    absl::StatusOr<pid_t> pid = SpawnProcess(
        Shell(absl::StrCat("tests/soak/soak_rank --spec=", *dir,
                           "/spec.json --steps=", steps,
                           " --sample_every=", every, " --rss_file=", *dir,
                           "/rank", r, ".rss --seed=1 --timeout_s=120"),
              absl::StrCat(*dir, "/rank", r, ".err"), /*pdeathsig=*/false),
        {absl::StrCat("RANK=", r), absl::StrCat("WORLD_SIZE=", ranks),
         absl::StrCat("LOCAL_RANK=", r),
         absl::StrCat("LOCAL_WORLD_SIZE=", ranks), "MASTER_ADDR=127.0.0.1",
         absl::StrCat("MASTER_PORT=", *port), "MUON_JOB_ID=soak",
         absl::StrCat("MUON_COORDINATOR=", address)});
    ASSERT_TRUE(pid.ok()) << pid.status();
    rank_index.push_back(procs.Add(*pid));
  }

  // Until every rank ended: the daemon's RSS once every rank has passed
  // each sampled step.
  std::vector<Series> series(ranks + 1);
  series[0].name = "daemon";
  for (int r = 0; r < ranks; ++r) series[r + 1].name = absl::StrCat("rank ", r);
  std::vector<int> codes(ranks, -1);
  int running = ranks;
  std::string failure;
  while (running > 0 && failure.empty()) {
    for (int r = 0; r < ranks; ++r) {
      if (codes[r] >= 0) continue;
      codes[r] = procs.Poll(rank_index[r]);
      if (codes[r] >= 0) --running;
      if (codes[r] > 0) {
        failure =
            absl::StrCat("rank ", r, " exited with ", codes[r], ": ",
                         ReadFile(absl::StrCat(*dir, "/rank", r, ".err")));
      }
    }
    int64_t all_passed = INT64_MAX;
    for (int r = 0; r < ranks; ++r) {
      ParseRankFile(absl::StrCat(*dir, "/rank", r, ".rss"), series[r + 1]);
      int64_t last = 0;
      for (const auto& [step, kb] : series[r + 1].kb)
        last = std::max(last, step);
      all_passed = std::min(all_passed, last);
    }
    for (int64_t s = every; s <= all_passed; s += every) {
      if (!series[0].kb.count(s))
        series[0].kb[s] =
            ::muon::testing::RssKb(std::to_string(procs.pid(daemon)));
    }
    if (absl::Now() - start > timeout) {
      failure =
          absl::StrCat("not finished after ", absl::FormatDuration(timeout),
                       " (SOAK_TIMEOUT_S); samples so far in ", *dir);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(failure.empty()) << failure;
  series[0].kb[-1] = ::muon::testing::RssKb(std::to_string(procs.pid(daemon)));
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - start);

  // The daemon's view, through `muonctl status --json` (which reads the
  // job secret from the environment as the ranks do): every rank
  // finished (RANK_STATE_FINISHED: JSON prints protobuf's enum names), its
  // last step report at `steps`, no job error.
  const std::string status_file = *dir + "/status.json";
  absl::StatusOr<pid_t> muonctl = SpawnProcess(
      {"/bin/sh", "-c",
       absl::StrCat("exec tools/muonctl status --coordinator=", address,
                    " --job_id=soak --json >", status_file, " 2>", status_file,
                    ".err")});
  ASSERT_TRUE(muonctl.ok()) << muonctl.status();
  const int muonctl_index = procs.Add(*muonctl);
  ASSERT_EQ(procs.Wait(muonctl_index, absl::Seconds(30)), 0)
      << ReadFile(status_file + ".err");
  const std::string status = ReadFile(status_file);
  const size_t list_at = status.find("\"ranks\": [");
  ASSERT_NE(list_at, std::string::npos) << status;
  const std::string job = status.substr(0, list_at);
  const std::string listed = status.substr(list_at);
  const int finished = CountOf(listed, "\"state\": \"RANK_STATE_FINISHED\"");
  EXPECT_EQ(finished, ranks) << status;
  // int64 fields are JSON numbers.
  EXPECT_EQ(CountOf(listed, absl::StrCat("\"last_step\": ", steps, ",")), ranks)
      << status;
  EXPECT_EQ(CountOf(job, "\"failed_rank\": -1"), 1) << status;

  kill(procs.pid(daemon), SIGTERM);
  EXPECT_EQ(procs.Wait(daemon, absl::Seconds(20)), 0)
      << ReadFile(*dir + "/daemon.err");

  // The table, and the bound.
  std::cout << absl::StrFormat("%-8s %12s %12s %10s %12s  %s\n", "process",
                               absl::StrCat("kB@", warmup), "kB@end",
                               "growth kB", "max kB", "samples (kB)");
  for (const Series& s : series) {
    const auto w = s.kb.find(warmup);
    const auto e = s.kb.find(-1);
    ASSERT_TRUE(w != s.kb.end() && e != s.kb.end())
        << s.name << ": no sample at step " << warmup << " or at the end";
    int64_t max_after = e->second;
    std::vector<std::string> all;
    for (const auto& [step, kb] : s.kb) {
      if (step >= warmup) max_after = std::max(max_after, kb);
      if (step >= 0) all.push_back(absl::StrCat(step, ":", kb));
    }
    all.push_back(absl::StrCat("end:", e->second));
    std::cout << absl::StrFormat("%-8s %12d %12d %+10d %12d  %s\n", s.name,
                                 w->second, e->second, e->second - w->second,
                                 max_after, absl::StrJoin(all, " "));
    EXPECT_GT(w->second, 0) << s.name;
    EXPECT_LE(max_after - w->second, kMaxGrowthKb)
        << s.name << ": RSS grew from " << w->second << " kB at step " << warmup
        << " to " << max_after << " kB";
  }
  std::cout << absl::StrFormat(
                   "soak: %d ranks x %d steps, %d/%d ranks finished per the "
                   "daemon, wall %.1f s (%.2f ms/step)\n",
                   ranks, steps, finished, ranks, wall_s, 1e3 * wall_s / steps)
            << std::flush;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(*dir);
}

}  // namespace
}  // namespace muon
