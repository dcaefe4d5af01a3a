// Newton-Schulz throughput on the CPU next to the sgemm rate measured in the
// same run.
//
// For each size rows x cols (m = min, n = max): times NewtonSchulz (1 warm-up,
// then --repeats timed runs; best and median), reports its rate as
// NewtonSchulzFlops / best time, and the rate of one cblas_sgemm of the
// m x m x n Gram shape (A = X X^T, 2*m*m*n FLOPs), timed in the same loop
// (one NS run, then one sgemm run, per repeat). The
// ratio NS/sgemm says how close NS is to the machine's GEMM rate for that
// shape, counting the FLOPs NS actually executes
// (kernels::NewtonSchulzExecutedFlops: an ssyrk is half a GEMM); "NS GF/s"
// is the nominal rate (NewtonSchulzFlops, the count of torch's 3 GEMMs per
// step), so that rates compare across implementations.
//
// --torch: also times PyTorch's own Newton-Schulz (fp32, 2.9's
// `_zeropower_via_newtonschulz` with torch.addmm, tools/torch_ns_bench.py
// --cpu --serve) in a child process started once, interleaved per repeat
// (ours, sgemm, torch; same machine state), with torch.set_num_threads and
// OPENBLAS_NUM_THREADS set to our OpenBLAS thread count and the environment
// (OPENBLAS_CORETYPE) inherited; prints torch's best / median and the ratio
// torch / ours of the best and of the median times. Run from the repository
// root (the script path is relative): bazel-bin/tools/ns_bench --torch.
// Each timed NS and torch run starts after --pause_ms (200) of idle time:
// OpenBLAS's threads busy-wait for about 0.1 s after a call and would
// otherwise steal the other process's cores. "paired x" is the median over
// the repeats of torch / ours within one repeat: the two runs are seconds
// apart, so a drift of the VM's speed over the whole run cancels.
//
// --gram (with --method standard): also times the Gram method (kGram,
// default restart period) in the same loop and prints its best time and
// standard best / gram best (> 1: Gram faster).
//
// Usage: ns_bench [--sizes 1024x1024,2048x2048] [--repeats 3] [--steps 5]
//                 [--method standard|gram] [--gram] [--torch] [--python
//                 /usr/bin/python3]
//                 [--torch_script tools/torch_ns_bench.py]
#include <cblas.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/blas_tiles.h"
#include "kernels/newton_schulz.h"
#include "tools/bench_util.h"

namespace {

using Clock = std::chrono::steady_clock;

using ::muon::bench::Shape;
using ::muon::bench::Summarize;
using ::muon::bench::Timing;

}  // namespace

ABSL_FLAG(std::string, sizes, "1024x1024,2048x2048,1024x4096,4096x1024",
          "Matrix shapes RxC, comma-separated.");
ABSL_FLAG(int, repeats, 5, "Timed runs after one warm-up.");
ABSL_FLAG(int, steps, 5, "Newton-Schulz iterations.");
ABSL_FLAG(std::string, method, "standard",
          "Newton-Schulz method: standard or gram.");
ABSL_FLAG(bool, gram, false,
          "With --method standard: also time the Gram method, interleaved.");
ABSL_FLAG(bool, torch, false,
          "Also time PyTorch's fp32 Newton-Schulz, interleaved.");
ABSL_FLAG(int, pause_ms, 200,
          "With --torch: idle time before each timed run, so that the other "
          "process's OpenBLAS threads (which busy-wait ~0.1 s after a call) "
          "and OpenMP threads are asleep.");
ABSL_FLAG(std::string, python, "/usr/bin/python3",
          "Python with torch, for --torch.");
ABSL_FLAG(std::string, torch_script, "tools/torch_ns_bench.py",
          "Path of torch_ns_bench.py, for --torch.");

namespace {

constexpr char kUsage[] =
    "usage: ns_bench [--sizes RxC[,RxC...]] [--repeats N] [--steps K]\n"
    "  --sizes    matrix shapes (default "
    "1024x1024,2048x2048,1024x4096,4096x1024)\n"
    "  --repeats  timed runs after one warm-up (default 5)\n"
    "  --steps    Newton-Schulz iterations (default 5)\n"
    "  --method   standard (default) or gram\n"
    "  --gram     with --method standard: also time gram, interleaved\n"
    "  --torch    also time PyTorch's fp32 NS, interleaved (run from the\n"
    "             repository root; --python, --torch_script)\n";

template <typename Fn>
double Seconds(Fn fn) {
  const Clock::time_point start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<float> RandomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (float& v : m) {
    v = static_cast<float>(static_cast<double>(gen() >> 8) / (1 << 23) - 1.0);
  }
  return m;
}

// A child `python3 torch_ns_bench.py --cpu --serve` answering "RxC" lines
// with "ms <milliseconds>" (one PyTorch Newton-Schulz run each).
class TorchServer {
 public:
  ~TorchServer() {
    if (to_ != nullptr) std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

  bool Start(const std::string& python, const std::string& script, int threads,
             int steps) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return false;
    const std::string threads_text = std::to_string(threads);
    const std::string steps_text = std::to_string(steps);
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[0]);
      close(in[1]);
      close(out[0]);
      close(out[1]);
      setenv("OPENBLAS_NUM_THREADS", threads_text.c_str(), 1);
      setenv("OMP_NUM_THREADS", threads_text.c_str(), 1);
      execl(python.c_str(), python.c_str(), script.c_str(), "--cpu", "--serve",
            "--threads", threads_text.c_str(), "--steps", steps_text.c_str(),
            static_cast<char*>(nullptr));
      std::perror("ns_bench: exec python");
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
    return to_ != nullptr && from_ != nullptr;
  }

  // Milliseconds of one PyTorch run on a rows x cols matrix; < 0 on error.
  double RunMs(int64_t rows, int64_t cols) {
    std::fprintf(to_, "%lldx%lld\n", static_cast<long long>(rows),
                 static_cast<long long>(cols));
    std::fflush(to_);
    char line[128];
    double ms = -1.0;
    if (std::fgets(line, sizeof(line), from_) == nullptr ||
        std::sscanf(line, "ms %lf", &ms) != 1) {
      return -1.0;
    }
    return ms;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;    // Child's stdin.
  FILE* from_ = nullptr;  // Child's stdout.
};

// What to measure, from the flags.
struct BenchConfig {
  std::vector<Shape> shapes;
  int repeats = 0;
  muon::kernels::NewtonSchulzOptions options;       // --method
  muon::kernels::NewtonSchulzOptions gram_options;  // --gram
  bool with_gram = false;
  bool with_torch = false;
  int pause_us = 0;  // Before each timed run, with --torch.
};

// Reads the flags into *config; false (usage printed) when one is bad.
bool ParseConfig(BenchConfig* config) {
  config->repeats = absl::GetFlag(FLAGS_repeats);
  const int steps = absl::GetFlag(FLAGS_steps);
  absl::StatusOr<muon::kernels::NewtonSchulzMethod> method =
      muon::kernels::ParseNewtonSchulzMethod(absl::GetFlag(FLAGS_method));
  if (!::muon::bench::ParseSizes(absl::GetFlag(FLAGS_sizes), "ns_bench",
                                 &config->shapes) ||
      config->repeats < 1 || steps < 1 || !method.ok()) {
    std::fprintf(stderr, "ns_bench: bad flags%s%s\n%s", method.ok() ? "" : ": ",
                 method.ok() ? "" : method.status().ToString().c_str(), kUsage);
    return false;
  }
  config->options.steps = steps;
  config->options.method = *method;
  config->with_gram = absl::GetFlag(FLAGS_gram);
  if (config->with_gram &&
      *method != muon::kernels::NewtonSchulzMethod::kStandard) {
    std::fprintf(stderr, "ns_bench: --gram needs --method standard\n%s",
                 kUsage);
    return false;
  }
  config->gram_options = config->options;
  config->gram_options.method = muon::kernels::NewtonSchulzMethod::kGram;
  config->with_torch = absl::GetFlag(FLAGS_torch);
  config->pause_us =
      config->with_torch ? absl::GetFlag(FLAGS_pause_ms) * 1000 : 0;
  return true;
}

void PrintHeader(const BenchConfig& config) {
  const char* coretype_env = std::getenv("OPENBLAS_CORETYPE");
  const char* threads_env = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf(
      "OpenBLAS core: %s | threads: %d | OPENBLAS_CORETYPE=%s | "
      "OPENBLAS_NUM_THREADS=%s\n",
      openblas_get_corename(), muon::kernels::ComputeThreads(),
      coretype_env != nullptr ? coretype_env : "(unset)",
      threads_env != nullptr ? threads_env : "(unset)");
  std::printf("OpenBLAS config: %s\n", openblas_get_config());
  std::printf(
      "NS: fp32, %s, %d steps, 1 warm-up + %d timed runs; sgemm: m x m x n "
      "(A = X X^T shape)%s, interleaved\n",
      absl::GetFlag(FLAGS_method).c_str(), config.options.steps, config.repeats,
      config.with_torch ? "; torch: PyTorch 2.9 _zeropower_via_newtonschulz "
                          "fp32 (addmm), same thread count"
                        : "");
  std::printf(
      "NS GF/s: nominal FLOPs k*(4m^2n+2m^3); NS/gemm: executed FLOPs "
      "(ssyrk = half) / time, over the sgemm rate\n\n");
  std::printf("%-11s %5s %5s %10s %10s %9s %10s %8s", "size", "m", "n",
              "NS best", "NS median", "NS GF/s", "sgemm GF/s", "NS/gemm");
  if (config.with_gram) std::printf(" %10s %8s", "gram best", "std/gram");
  if (config.with_torch) {
    std::printf(" %11s %11s %9s %9s %9s", "torch best", "torch med", "best x",
                "median x", "paired x");
  }
  std::printf("\n");
}

// Timings of one size, in seconds.
struct RowTimings {
  Timing ns, gemm, gram, torch;
  double paired = 0.0;  // Median of torch / ours within a repeat.
};

// Times one shape: a warm-up of each, then per repeat ours, the sgemm,
// Gram (--gram) and torch (--torch), interleaved. Errors: NewtonSchulz's,
// or Internal when the torch child does not answer.
absl::StatusOr<RowTimings> BenchShape(
    const BenchConfig& config, const Shape& shape, TorchServer* torch,
    muon::kernels::NewtonSchulzWorkspace* workspace,
    muon::kernels::NewtonSchulzWorkspace* gram_workspace) {
  const int64_t rows = shape.rows;
  const int64_t cols = shape.cols;
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  const std::vector<float> u = RandomMatrix(rows, cols, 1);
  std::vector<float> out(u.size());
  std::vector<float> gram_out(config.with_gram ? u.size() : 0);
  workspace->Reserve(rows, cols);
  // The Gram GEMM of the NS shape: [m, n] x [m, n]^T -> [m, m].
  const std::vector<float> x = RandomMatrix(m, n, 2);
  std::vector<float> gram(static_cast<size_t>(m) * m);
  absl::Status status;
  auto run_ns = [&] {
    status.Update(muon::kernels::NewtonSchulz(
        u.data(), rows, cols, config.options, out.data(), workspace));
  };
  auto run_gram = [&] {
    status.Update(muon::kernels::NewtonSchulz(u.data(), rows, cols,
                                              config.gram_options,
                                              gram_out.data(), gram_workspace));
  };
  // The peer: OpenBLAS's own sgemm on as many threads as ours run on (our
  // products keep OpenBLAS at one thread and split the output themselves;
  // see kernels/blas_tiles.h).
  const int threads = muon::kernels::ComputeThreads();
  auto run_gemm = [&] {
    openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0f,
                x.data(), n, x.data(), n, 0.0f, gram.data(), m);
    openblas_set_num_threads(1);
  };
  const absl::Status no_torch =
      absl::InternalError("tools/torch_ns_bench.py did not answer");
  // Warm-up, then all interleaved so that each sees the same machine state
  // (shared 2-core VMs drift by 2x over seconds).
  run_ns();
  run_gemm();
  if (config.with_gram) run_gram();
  if (config.with_torch && torch->RunMs(rows, cols) < 0) return no_torch;
  std::vector<double> ns, gemm, gram_s, torch_s, paired;
  for (int r = 0; r < config.repeats; ++r) {
    usleep(config.pause_us);
    ns.push_back(Seconds(run_ns));
    gemm.push_back(Seconds(run_gemm));
    if (config.with_gram) {
      usleep(config.pause_us);
      gram_s.push_back(Seconds(run_gram));
    }
    if (config.with_torch) {
      usleep(config.pause_us);
      const double ms = torch->RunMs(rows, cols);
      if (ms < 0) return no_torch;
      torch_s.push_back(ms * 1e-3);
      paired.push_back(torch_s.back() / ns.back());
    }
  }
  if (!status.ok()) return status;
  RowTimings row;
  row.ns = Summarize(ns);
  row.gemm = Summarize(gemm);
  if (config.with_gram) row.gram = Summarize(gram_s);
  if (config.with_torch) {
    row.torch = Summarize(torch_s);
    row.paired = Summarize(paired).median;
  }
  return row;
}

void PrintRow(const BenchConfig& config, const Shape& shape,
              const RowTimings& row) {
  const int64_t m = std::min(shape.rows, shape.cols);
  const int64_t n = std::max(shape.rows, shape.cols);
  const double ns_gflops = muon::kernels::NewtonSchulzFlops(
                               shape.rows, shape.cols, config.options.steps) /
                           row.ns.best / 1e9;
  const double ns_executed_gflops =
      muon::kernels::NewtonSchulzExecutedFlops(shape.rows, shape.cols,
                                               config.options) /
      row.ns.best / 1e9;
  const double gemm_gflops = 2.0 * m * m * n / row.gemm.best / 1e9;
  char size[48];
  std::snprintf(size, sizeof(size), "%lldx%lld",
                static_cast<long long>(shape.rows),
                static_cast<long long>(shape.cols));
  std::printf("%-11s %5lld %5lld %8.1fms %8.1fms %9.1f %10.1f %8.2f", size,
              static_cast<long long>(m), static_cast<long long>(n),
              row.ns.best * 1e3, row.ns.median * 1e3, ns_gflops, gemm_gflops,
              ns_executed_gflops / gemm_gflops);
  if (config.with_gram) {
    std::printf(" %8.1fms %8.2f", row.gram.best * 1e3,
                row.ns.best / row.gram.best);
  }
  if (config.with_torch) {
    std::printf(" %9.1fms %9.1fms %9.2f %9.2f %9.2f", row.torch.best * 1e3,
                row.torch.median * 1e3, row.torch.best / row.ns.best,
                row.torch.median / row.ns.median, row.paired);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  BenchConfig config;
  if (!ParseConfig(&config)) return 2;
  PrintHeader(config);
  TorchServer torch;
  if (config.with_torch &&
      !torch.Start(absl::GetFlag(FLAGS_python),
                   absl::GetFlag(FLAGS_torch_script),
                   muon::kernels::ComputeThreads(), config.options.steps)) {
    std::fprintf(stderr, "ns_bench: cannot start %s %s\n",
                 absl::GetFlag(FLAGS_python).c_str(),
                 absl::GetFlag(FLAGS_torch_script).c_str());
    return 1;
  }
  muon::kernels::NewtonSchulzWorkspace workspace;
  muon::kernels::NewtonSchulzWorkspace gram_workspace;
  for (const Shape& shape : config.shapes) {
    absl::StatusOr<RowTimings> row =
        BenchShape(config, shape, &torch, &workspace, &gram_workspace);
    if (!row.ok()) {
      std::fprintf(stderr, "ns_bench: %s\n", row.status().ToString().c_str());
      return 1;
    }
    PrintRow(config, shape, *row);
  }
  return 0;
}
