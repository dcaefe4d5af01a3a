// The rank side of a plan at scale: the time one rank takes to compile
// its bucket layout (BucketLayout::Compile, client/bucket_layout.h: its
// gather and redistribute lists and slot offsets), which every rank does
// when it joins and at every re-plan. The job is FSDP: `--ranks` ranks,
// each matrix of every `--sizes` shape Shard(0) over all of them
// (torch.chunk rows; ranks past the last row hold empty shards), `--matrices`
// matrices per shape, owners round-robin, one bucket per matrix. Rank 0
// is timed (it owns matrix 0, so its gather lists are an owner's), plain
// and with per-row state (NorMuon).
//
// Built by `bazel build -c opt --symlink_prefix=/
// //tools:layout_compile_bench`, run as
// bazel-out/k8-opt/bin/tools/layout_compile_bench with, e.g.,
// `--ranks 1024,4096,16384 --sizes 16384x4096 --matrices 4`. Prints the
// core type, then per rank count: ms per compile (best and median of
// --repeats), ms per matrix, and ms per compile with row state (median).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/bucket_layout.h"
#include "common/layout.h"
#include "muon/v1/coordinator.pb.h"
#include "tools/bench_util.h"

ABSL_FLAG(std::string, ranks, "1024,4096", "World sizes, comma-separated.");
ABSL_FLAG(std::string, sizes, "4096x4096", "Matrix shapes RxC.");
ABSL_FLAG(int, matrices, 16, "Matrices of each shape (1-100000).");
ABSL_FLAG(int, repeats, 3, "Compiles timed per world size (1-100).");

namespace muon {
namespace {

// Rows [b, e) of a [rows, cols] matrix.
Box RowsOf(int64_t b, int64_t e, int64_t cols) {
  return Box{Range{b, e}, Range{0, cols}};
}

// torch.chunk's row shards of `rows` over `world` ranks: ceil(rows /
// world) each, the last ones short or empty.
std::vector<Box> ChunkRows(int64_t rows, int64_t cols, int world) {
  const int64_t chunk = (rows + world - 1) / world;
  std::vector<Box> boxes;
  boxes.reserve(world);
  for (int r = 0; r < world; ++r) {
    const int64_t b = std::min(rows, r * chunk);
    const int64_t e = std::min(rows, b + chunk);
    boxes.push_back(b < e ? RowsOf(b, e, cols) : Box{});
  }
  return boxes;
}

struct Job {
  v1::Plan plan;
  std::vector<MatrixGeometry> geometry;  // rank 0's
};

Job MakeJob(int world, const std::vector<bench::Shape>& shapes, int count) {
  Job job;
  job.plan.set_world_size(world);
  for (const bench::Shape& shape : shapes) {
    const std::vector<Box> boxes = ChunkRows(shape.rows, shape.cols, world);
    for (int k = 0; k < count; ++k) {
      const int i = job.plan.matrices_size();
      const std::string name = absl::StrCat("w", i);
      v1::MatrixPlan* mp = job.plan.add_matrices();
      mp->set_index(i);
      mp->set_param(name);
      mp->set_rows(shape.rows);
      mp->set_cols(shape.cols);
      // Round-robin over the ranks holding rows (an owner holds a shard).
      const int64_t holders = std::min<int64_t>(world, shape.rows);
      mp->set_owner(static_cast<int>(i % holders));
      v1::Bucket* b = job.plan.add_buckets();
      b->set_index(i);
      b->add_matrices(i);
      MatrixGeometry g;
      g.param = name;
      g.param_index = i;
      g.rows = shape.rows;
      g.cols = shape.cols;
      g.boxes = boxes;
      job.geometry.push_back(std::move(g));
    }
  }
  return job;
}

double CompileMs(const Job& job, bool row_state) {
  BucketLayoutOptions options;
  options.form_update = true;
  options.row_state = row_state;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<BucketLayout> layout = BucketLayout::Compile(
      0, job.plan.world_size(), job.plan, job.geometry, options);
  const auto end = std::chrono::steady_clock::now();
  if (!layout.ok()) {
    std::fprintf(stderr, "layout_compile_bench: %s\n",
                 layout.status().ToString().c_str());
    return -1;
  }
  return std::chrono::duration<double, std::milli>(end - start).count();
}

int Run() {
  std::vector<int> worlds;
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',', absl::SkipEmpty())) {
    int w = 0;
    if (!absl::SimpleAtoi(item, &w) || w < 1 || w > (1 << 20)) {
      std::fprintf(stderr, "layout_compile_bench: bad --ranks item \"%s\"\n",
                   std::string(item).c_str());
      return 2;
    }
    worlds.push_back(w);
  }
  std::vector<bench::Shape> shapes;
  if (!bench::ParseSizes(absl::GetFlag(FLAGS_sizes), "layout_compile_bench",
                         &shapes)) {
    return 2;
  }
  const int count = absl::GetFlag(FLAGS_matrices);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (worlds.empty() || count < 1 || count > 100000 || repeats < 1 ||
      repeats > 100) {
    std::fprintf(stderr,
                 "layout_compile_bench: --ranks needs an item, --matrices "
                 "1-100000, --repeats 1-100\n");
    return 2;
  }
  std::printf("cpu: %s\n", bench::CpuDescription().c_str());
  std::printf("%-8s %9s %12s %12s %14s %14s\n", "ranks", "matrices", "best ms",
              "median ms", "ms/matrix", "row state ms");
  for (int world : worlds) {
    const Job job = MakeJob(world, shapes, count);
    std::vector<double> plain, rows;
    for (int i = 0; i < repeats; ++i) {
      plain.push_back(CompileMs(job, /*row_state=*/false));
      rows.push_back(CompileMs(job, /*row_state=*/true));
      if (plain.back() < 0 || rows.back() < 0) return 1;
    }
    const bench::Timing p = bench::Summarize(plain);
    const bench::Timing r = bench::Summarize(rows);
    const int matrices = job.plan.matrices_size();
    std::printf("%-8d %9d %12.2f %12.2f %14.4f %14.2f\n", world, matrices,
                p.best, p.median, p.median / matrices, r.median);
  }
  return 0;
}

}  // namespace
}  // namespace muon

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return muon::Run();
}
