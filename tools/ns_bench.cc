// Newton-Schulz throughput on the CPU next to the sgemm rate measured in the
// same run (DESIGN.md section 10).
//
// For each size rows x cols (m = min, n = max): times NewtonSchulz (1 warm-up,
// then --repeats timed runs; best and median), reports its rate as
// NewtonSchulzFlops / best time, and the rate of one cblas_sgemm of the
// m x m x n Gram shape (A = X X^T, 2*m*m*n FLOPs), timed in the same loop
// (one NS run, then one sgemm run, per repeat). The
// ratio NS/sgemm says how close NS is to the machine's GEMM rate for that
// shape (1.0 would be perfect; NS also runs m x m x m and m x n x m GEMMs and
// copies).
//
// Usage: ns_bench [--sizes 1024x1024,2048x2048] [--repeats 3] [--steps 5]
#include <cblas.h>

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
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
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

namespace {

constexpr char kUsage[] =
    "usage: ns_bench [--sizes RxC[,RxC...]] [--repeats N] [--steps K]\n"
    "  --sizes    matrix shapes (default "
    "1024x1024,2048x2048,1024x4096,4096x1024)\n"
    "  --repeats  timed runs after one warm-up (default 5)\n"
    "  --steps    Newton-Schulz iterations (default 5)\n";

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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  std::vector<Shape> shapes;
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int steps = absl::GetFlag(FLAGS_steps);
  if (!::muon::bench::ParseSizes(absl::GetFlag(FLAGS_sizes), "ns_bench",
                                 &shapes) ||
      repeats < 1 || steps < 1) {
    std::fprintf(stderr, "ns_bench: bad flags\n%s", kUsage);
    return 2;
  }

  const char* coretype_env = std::getenv("OPENBLAS_CORETYPE");
  const char* threads_env = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf(
      "OpenBLAS core: %s | threads: %d | OPENBLAS_CORETYPE=%s | "
      "OPENBLAS_NUM_THREADS=%s\n",
      openblas_get_corename(), openblas_get_num_threads(),
      coretype_env != nullptr ? coretype_env : "(unset)",
      threads_env != nullptr ? threads_env : "(unset)");
  std::printf("OpenBLAS config: %s\n", openblas_get_config());
  std::printf(
      "NS: fp32, %d steps, 1 warm-up + %d timed runs; sgemm: m x m x n "
      "(A = X X^T shape), interleaved with NS\n\n",
      steps, repeats);
  std::printf("%-11s %5s %5s %10s %10s %9s %11s %10s %8s\n", "size", "m", "n",
              "NS best", "NS median", "NS GF/s", "sgemm best", "sgemm GF/s",
              "NS/gemm");

  muon::kernels::NewtonSchulzOptions options;
  options.steps = steps;
  muon::kernels::NewtonSchulzWorkspace workspace;
  for (const Shape& shape : shapes) {
    const int64_t rows = shape.rows;
    const int64_t cols = shape.cols;
    const int m = static_cast<int>(std::min(rows, cols));
    const int n = static_cast<int>(std::max(rows, cols));
    const std::vector<float> u = RandomMatrix(rows, cols, 1);
    std::vector<float> out(u.size());
    workspace.Reserve(rows, cols);

    // The Gram GEMM of the NS shape: [m, n] x [m, n]^T -> [m, m].
    const std::vector<float> x = RandomMatrix(m, n, 2);
    std::vector<float> gram(static_cast<size_t>(m) * m);
    absl::Status status;
    auto run_ns = [&] {
      status = muon::kernels::NewtonSchulz(u.data(), rows, cols, options,
                                           out.data(), &workspace);
    };
    auto run_gemm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, n, 1.0f,
                  x.data(), n, x.data(), n, 0.0f, gram.data(), m);
    };
    // Warm-up, then NS and sgemm interleaved so both see the same machine
    // state (shared 2-core VMs drift by 2x over seconds).
    run_ns();
    run_gemm();
    std::vector<double> ns_seconds, gemm_seconds;
    for (int r = 0; r < repeats; ++r) {
      ns_seconds.push_back(Seconds(run_ns));
      gemm_seconds.push_back(Seconds(run_gemm));
    }
    if (!status.ok()) {
      std::fprintf(stderr, "ns_bench: NewtonSchulz failed: %s\n",
                   status.ToString().c_str());
      return 1;
    }
    const Timing ns = Summarize(ns_seconds);
    const Timing gemm = Summarize(gemm_seconds);

    const double ns_gflops =
        muon::kernels::NewtonSchulzFlops(rows, cols, steps) / ns.best / 1e9;
    const double gemm_gflops = 2.0 * m * m * n / gemm.best / 1e9;
    char size[32];
    std::snprintf(size, sizeof(size), "%lldx%lld", static_cast<long long>(rows),
                  static_cast<long long>(cols));
    std::printf("%-11s %5d %5d %8.1fms %8.1fms %9.1f %9.1fms %10.1f %8.2f\n",
                size, m, n, ns.best * 1e3, ns.median * 1e3, ns_gflops,
                gemm.best * 1e3, gemm_gflops, ns_gflops / gemm_gflops);
    std::fflush(stdout);
  }
  return 0;
}
