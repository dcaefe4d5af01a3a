// Planning time and peak memory at scale: `muonctl plan` of a 1-D dp_shard mesh
// with N ranks and M matrices cycling through the shapes 4096x4096, 4096x14336,
// 14336x4096 and 1024x4096, every one placed Shard(0). The JobSpec is built in
// memory and planned by PlanJobSpec (tools/muonctl_lib.h), the function
// `muonctl plan --spec FILE` calls.
//
// Each size runs in its own child process (fork): the child sets
// RLIMIT_AS to --mem_limit_gb, the parent kills it with SIGKILL after
// --time_limit_s and reads its peak RSS from wait4's rusage (ru_maxrss).
// Per size, two children:
//   1. "muonctl": PlanJobSpec(spec), timed end to end: the real figure.
//      Jobs over the size limit (matrices x ranks > kMaxMatrixRankBoxes,
//      common/checked_math.h) are refused here with InvalidArgument.
//   2. "phases" (unless --nophases): PlanJobFromSpec's pieces timed one
//      by one, with the process's RSS and peak RSS (VmRSS/VmHWM) after
//      each:
//        layout         LayoutFromSpec (plan/manifest_validation.h)
//        planner        PlannerOptionsForJob + MakePlan (plan/planner.h;
//                       includes the compact schedule and the hash)
//        rank_schedule  MakeRankSchedule for the last rank (what every
//                       rank derives at Join; plan/schedule.h)
//        hash           PlanHash re-run on the finished plan
//        validate       ValidatePlan (recomputes the hash once)
//      All are the real functions.
//
// Output, one line per size and child, e.g.
//   plan 1024 ranks x 2048 matrices: 9.0 s, peak 1.4 GB, max/mean 1.000
//   plan 4096 ranks x 10000 matrices: killed after 300 s
//   plan 16384 ranks x 100000 matrices: out of memory (limit 20 GiB)
// GB = 10^9 bytes; limits are GiB. The load average (1 min) before and
// after each child is printed with it (the machine may be busy).
//
// Usage: plan_scale_bench [--sizes 1024x10000,4096x10000,16384x100000]
//          [--time_limit_s 300] [--mem_limit_gb 20] [--nophases]
//          [--policy lpt|round_robin]
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checked_math.h"
#include "common/layout.h"
#include "common/spec.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/manifest_validation.h"
#include "plan/plan_job.h"
#include "plan/planner.h"
#include "plan/schedule.h"
#include "tools/bench_util.h"
#include "tools/muonctl_lib.h"

ABSL_FLAG(std::string, sizes, "1024x10000,4096x10000,16384x100000",
          "Comma-separated RANKSxMATRICES.");
ABSL_FLAG(double, time_limit_s, 300,
          "Wall-clock limit per child (SIGKILL from the parent).");
ABSL_FLAG(double, mem_limit_gb, 20, "RLIMIT_AS of each child, in GiB.");
ABSL_FLAG(bool, phases, true,
          "Also run a second child per size that times PlanJob's phases.");
ABSL_FLAG(std::string, policy, "",
          "Assignment policy (lpt or round_robin); empty = the spec's (lpt).");

namespace muon {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The job `muonctl plan --spec` would read for this size.
v1::JobSpec MakeSpec(int ranks, int matrices) {
  struct Kind {
    const char* name;
    int64_t rows, cols;
  };
  static constexpr Kind kKinds[] = {
      {"attention.wq", 4096, 4096},
      {"feed_forward.w2", 4096, 14336},
      {"feed_forward.w1", 14336, 4096},
      {"attention.wk", 1024, 4096},
  };
  v1::JobSpec spec;
  spec.set_job_id("plan_scale");
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(ranks);
  for (int i = 0; i < matrices; ++i) {
    const Kind& k = kKinds[i % 4];
    v1::ParamSpec* p = spec.add_params();
    p->set_name(absl::StrCat("layers.", i / 4, ".", k.name, ".weight"));
    p->add_shape(k.rows);
    p->add_shape(k.cols);
    p->add_placements("Shard(0)");
  }
  return spec;
}

// Bytes from /proc/self/status ("VmRSS", "VmHWM"); -1 if unreadable.
int64_t ProcStatusBytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoll(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return -1;
}

// Child -> parent messages, one line each, on `fd`.
void Report(int fd, const std::string& line) {
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

class PhaseTimer {
 public:
  explicit PhaseTimer(int fd) : fd_(fd) {}
  void Start() { t0_ = Clock::now(); }
  // Reports "phase NAME SECONDS RSS HWM".
  void Done(const std::string& name) {
    const double s = Since(t0_);
    Report(fd_,
           absl::StrFormat("phase %s %.3f %d %d", name, s,
                           ProcStatusBytes("VmRSS"), ProcStatusBytes("VmHWM")));
    t0_ = Clock::now();
  }

 private:
  int fd_;
  Clock::time_point t0_;
};

std::string LoadRatio(const v1::Plan& plan) {
  const double mean = plan.mean_load_flops();
  return absl::StrFormat("%.3f", mean > 0 ? plan.max_load_flops() / mean : 0);
}

// Child 1: PlanJobSpec as `muonctl plan`. Reports "ok SECONDS MAXMEAN" or
// "error SECONDS MESSAGE".
void RunMuonctlChild(int fd, int ranks, int matrices,
                     const std::string& policy) {
  const v1::JobSpec spec = MakeSpec(ranks, matrices);
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<JobPlan> p = PlanJobSpec(spec, policy);
  const double s = Since(t0);
  if (!p.ok()) {
    Report(fd, absl::StrFormat("error %.3f %s", s, p.status().ToString()));
    return;
  }
  Report(fd, absl::StrFormat("ok %.3f %s %d", s, LoadRatio(p->plan),
                             p->plan.buckets_size()));
}

// Child 2: PlanJob's phases one by one (see the file comment).
void RunPhasesChild(int fd, int ranks, int matrices,
                    const std::string& policy) {
  PhaseTimer t(fd);
  t.Start();
  v1::JobSpec spec = MakeSpec(ranks, matrices);
  if (!policy.empty()) spec.mutable_execution()->set_assignment_policy(policy);
  t.Done("spec");
  absl::StatusOr<JobLayout> layout = LayoutFromSpec(spec);
  if (!layout.ok()) {
    Report(fd, absl::StrCat("error 0 ", layout.status().ToString()));
    return;
  }
  t.Done("layout");
  absl::StatusOr<PlannerOptions> options =
      PlannerOptionsForJob(*layout, spec.job_id(), PlanDefaults());
  if (!options.ok()) {
    Report(fd, absl::StrCat("error 0 ", options.status().ToString()));
    return;
  }
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, *options);
  if (!plan.ok()) {
    Report(fd, absl::StrCat("error 0 ", plan.status().ToString()));
    return;
  }
  t.Done("planner");
  const v1::RankSchedule mine = MakeRankSchedule(*plan, ranks - 1);
  t.Done("rank_schedule");
  const std::string hash = PlanHash(*plan);
  t.Done("hash");
  absl::Status valid = ValidatePlan(*plan, *layout);
  if (!valid.ok()) {
    Report(fd, absl::StrCat("error 0 ", valid.ToString()));
    return;
  }
  t.Done("validate");
  Report(fd, absl::StrFormat("sizes plan_bytes=%d join_response_bytes=%d "
                             "rank_schedule_bytes=%d buckets=%d",
                             plan->ByteSizeLong(),
                             PlanForRank(*plan, 0).ByteSizeLong(),
                             mine.ByteSizeLong(), plan->buckets_size()));
  Report(fd, absl::StrFormat("ok 0 %s", LoadRatio(*plan)));
}

struct ChildResult {
  enum Kind { kExited, kKilled, kOutOfMemory, kSignaled } kind = kExited;
  int code = 0;  // exit code or signal
  double wall_s = 0;
  int64_t peak_bytes = 0;
  std::vector<std::string> lines;
};

// Runs `body(fd)` in a child under the limits; collects its lines.
template <typename Body>
ChildResult RunChild(Body body, double time_limit_s, double mem_limit_gib) {
  ChildResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const Clock::time_point t0 = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    close(fds[0]);
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max =
        static_cast<rlim_t>(mem_limit_gib * 1024.0 * 1024.0 * 1024.0);
    setrlimit(RLIMIT_AS, &rl);
    try {
      body(fds[1]);
    } catch (const std::bad_alloc&) {
      Report(fds[1], "oom");
      _exit(3);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string buffer;
  bool killed = false;
  for (;;) {
    const double left = time_limit_s - Since(t0);
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    struct pollfd p = {fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1e3));
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n <= 0) break;  // EOF: the child is done
    buffer.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      result.lines.push_back(buffer.substr(0, nl));
      buffer.erase(0, nl + 1);
    }
  }
  close(fds[0]);
  int status = 0;
  struct rusage ru;
  std::memset(&ru, 0, sizeof(ru));
  wait4(pid, &status, 0, &ru);
  result.wall_s = Since(t0);
  result.peak_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  bool oom = false;
  for (const std::string& l : result.lines) oom |= l == "oom";
  if (killed) {
    result.kind = ChildResult::kKilled;
  } else if (oom) {
    result.kind = ChildResult::kOutOfMemory;
  } else if (WIFSIGNALED(status)) {
    result.kind = ChildResult::kSignaled;
    result.code = WTERMSIG(status);
  } else {
    result.code = WEXITSTATUS(status);
  }
  return result;
}

double Load1() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

std::string Gb(int64_t bytes) {
  return absl::StrFormat("%.2f GB", static_cast<double>(bytes) / 1e9);
}

// "killed after 300 s" / "out of memory (limit 20 GiB)" / "" when it ran.
std::string Failure(const ChildResult& r, double time_limit_s,
                    double mem_limit_gib) {
  switch (r.kind) {
    case ChildResult::kKilled:
      return absl::StrFormat("killed after %.0f s", time_limit_s);
    case ChildResult::kOutOfMemory:
      return absl::StrFormat(
          "out of memory (limit %g GiB) after %.1f s, peak %s", mem_limit_gib,
          r.wall_s, Gb(r.peak_bytes));
    case ChildResult::kSignaled:
      if (r.code == SIGKILL) {
        return absl::StrFormat(
            "killed by SIGKILL from outside after %.1f s, peak %s (not the "
            "time limit: the kernel's OOM killer when the machine ran out of "
            "memory; see dmesg)",
            r.wall_s, Gb(r.peak_bytes));
      }
      return absl::StrFormat(
          "died of signal %d (%s) after %.1f s, peak %s (at the %g GiB "
          "limit this is an allocation failure)",
          r.code, strsignal(r.code), r.wall_s, Gb(r.peak_bytes), mem_limit_gib);
    case ChildResult::kExited:
      if (r.code != 0) {
        return absl::StrFormat("exited %d after %.1f s", r.code, r.wall_s);
      }
      return "";
  }
  return "";
}

// The muonctl plan path for one size in a child: its result line.
std::string MuonctlPathLine(int ranks, int matrices, const std::string& policy,
                            double time_limit, double mem_limit) {
  ChildResult r =
      RunChild([&](int fd) { RunMuonctlChild(fd, ranks, matrices, policy); },
               time_limit, mem_limit);
  std::string line = Failure(r, time_limit, mem_limit);
  if (!line.empty()) return line;
  line = "no result";
  for (const std::string& l : r.lines) {
    double s = 0;
    char ratio[32] = {0};
    int buckets = 0;
    if (std::sscanf(l.c_str(), "ok %lf %31s %d", &s, ratio, &buckets) == 3) {
      line = absl::StrFormat("%.2f s, peak %s, max/mean %s, %d buckets", s,
                             Gb(r.peak_bytes), ratio, buckets);
    } else if (l.rfind("error ", 0) == 0) {
      std::sscanf(l.c_str(), "error %lf", &s);
      const size_t msg = l.find(' ', 6);
      line = absl::StrFormat("refused in %.2f s, peak %s: %s", s,
                             Gb(r.peak_bytes), l.substr(msg + 1));
    }
  }
  return line;
}

// The planning phases for one size in a child, printed after `what`.
void PrintPhases(const std::string& what, int ranks, int matrices,
                 const std::string& policy, double time_limit,
                 double mem_limit) {
  const double load0 = Load1();
  ChildResult r =
      RunChild([&](int fd) { RunPhasesChild(fd, ranks, matrices, policy); },
               time_limit, mem_limit);
  std::vector<std::string> phases;
  std::string extra, ratio_text;
  double total = 0;
  for (const std::string& l : r.lines) {
    char name[32] = {0};
    double s = 0;
    long long rss = 0, hwm = 0;
    char ratio[32] = {0};
    if (std::sscanf(l.c_str(), "phase %31s %lf %lld %lld", name, &s, &rss,
                    &hwm) == 4) {
      total += s;
      phases.push_back(absl::StrFormat("%s %.2f s (rss %s, peak %s)", name, s,
                                       Gb(rss), Gb(hwm)));
    } else if (l.rfind("sizes ", 0) == 0) {
      extra = l.substr(6);
    } else if (std::sscanf(l.c_str(), "ok 0 %31s", ratio) == 1) {
      ratio_text = ratio;
    } else if (l.rfind("error ", 0) == 0) {
      extra = l;
    }
  }
  std::string line = Failure(r, time_limit, mem_limit);
  if (line.empty()) {
    line = absl::StrFormat("%.2f s in phases, peak %s, max/mean %s", total,
                           Gb(r.peak_bytes), ratio_text);
  }
  std::printf("%s, phases: %s [load %.2f -> %.2f]\n", what.c_str(),
              line.c_str(), load0, Load1());
  for (const std::string& p : phases) std::printf("    %s\n", p.c_str());
  if (!extra.empty()) std::printf("    %s\n", extra.c_str());
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "plan_scale_bench [--sizes 1024x10000,...] [--time_limit_s 300] "
      "[--mem_limit_gb 20] [--nophases] [--policy P]");
  absl::ParseCommandLine(argc, argv);
  std::vector<bench::Shape> sizes;
  if (!bench::ParseSizes(absl::GetFlag(FLAGS_sizes), "plan_scale_bench",
                         &sizes)) {
    return 2;
  }
  const double time_limit = absl::GetFlag(FLAGS_time_limit_s);
  const double mem_limit = absl::GetFlag(FLAGS_mem_limit_gb);
  const std::string policy = absl::GetFlag(FLAGS_policy);
  std::printf(
      "plan_scale_bench: nproc %ld (%s), memory %.1f GB, limits %.0f s and "
      "%g GiB per child, size limit matrices x ranks <= %lld\n",
      sysconf(_SC_NPROCESSORS_ONLN), bench::CpuDescription().c_str(),
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) /
          1e9,
      time_limit, mem_limit, static_cast<long long>(kMaxMatrixRankBoxes));
  for (const bench::Shape& size : sizes) {
    const int ranks = static_cast<int>(size.rows);
    const int matrices = static_cast<int>(size.cols);
    const std::string what =
        absl::StrFormat("plan %d ranks x %d matrices", ranks, matrices);
    // 1. The muonctl plan path, 2. the phases.
    const double load0 = Load1();
    const std::string line =
        MuonctlPathLine(ranks, matrices, policy, time_limit, mem_limit);
    std::printf("%s: %s [load %.2f -> %.2f]\n", what.c_str(), line.c_str(),
                load0, Load1());
    std::fflush(stdout);
    if (absl::GetFlag(FLAGS_phases)) {
      PrintPhases(what, ranks, matrices, policy, time_limit, mem_limit);
    }
  }
  return 0;
}

}  // namespace
}  // namespace muon

int main(int argc, char** argv) { return muon::Main(argc, argv); }
