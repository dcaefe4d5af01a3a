#include "tests/client/single_device_reference.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"

namespace muon {
namespace testing {
namespace {

// Calls fn(global_offset, local_offset) for every element of the region
// `ranges` (one Range per dim) of a row-major tensor of `shape`; local
// offsets are row-major within the region. Nothing for an empty region.
void ForEachElement(const std::vector<int64_t>& shape,
                    const std::vector<Range>& ranges,
                    const std::function<void(int64_t, int64_t)>& fn) {
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> idx(nd);
  for (int d = 0; d < nd; ++d) {
    if (ranges[d].size() <= 0) return;
    idx[d] = ranges[d].begin;
  }
  for (int64_t local = 0;; ++local) {
    int64_t global = 0;
    for (int d = 0; d < nd; ++d) global = global * shape[d] + idx[d];
    fn(global, local);
    int d = nd - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < ranges[d].end) break;
      idx[d] = ranges[d].begin;
    }
    if (d < 0) return;
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int Problem::matrices() const {
  int n = 0;
  for (const TensorSpec& s : specs) {
    n += s.expert_stack ? static_cast<int>(s.shape[0])
                        : std::max<int>(1, s.row_splits.size());
  }
  return n;
}

Problem MakeProblem(const std::vector<TensorSpec>& specs, int steps) {
  Problem p;
  p.specs = specs;
  for (size_t i = 0; i < specs.size(); ++i) {
    p.init.push_back(RandomValues(Numel(specs[i].shape), 7 + i));
  }
  p.grads.resize(steps);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < specs.size(); ++i) {
      p.grads[s].push_back(
          RandomValues(Numel(specs[i].shape), 1000 * (s + 1) + i));
    }
  }
  return p;
}

absl::StatusOr<SingleDeviceResult> RunSingleDevice(const Problem& problem,
                                                   const MuonOptions& options) {
  openblas_set_num_threads(1);
  std::vector<Parameter> params(problem.specs.size());
  std::vector<Parameter*> ptrs;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].name = problem.specs[i].name;
    params[i].local_shape = problem.specs[i].shape;
    params[i].expert_stack = problem.specs[i].expert_stack;
    params[i].row_splits = problem.specs[i].row_splits;
    params[i].data = problem.init[i];
    ptrs.push_back(&params[i]);
  }
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(ptrs, options);
  if (!muon.ok()) return muon.status();
  SingleDeviceResult out;
  for (int s = 0; s < problem.steps(); ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].grad = problem.grads[s][i];
    }
    if (absl::Status st = (*muon)->Step(); !st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("step ", s + 1, ": ", st.message()));
    }
    out.stats.push_back((*muon)->last_step_stats());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    out.params.push_back(params[i].data);
    out.buffers.push_back((*muon)->momentum_buffer(static_cast<int>(i)));
    if (options.normuon) {
      out.variances.push_back((*muon)->row_state(static_cast<int>(i)));
    }
  }
  return out;
}

ProblemLayout UniformLayout(const Mesh& mesh,
                            const std::vector<Placement>& placements,
                            size_t params) {
  ProblemLayout layout;
  layout.mesh = mesh;
  layout.placements.assign(params, placements);
  return layout;
}

std::vector<Parameter*> RankShards::Pointers() {
  std::vector<Parameter*> ptrs;
  ptrs.reserve(params.size());
  for (Parameter& p : params) ptrs.push_back(&p);
  return ptrs;
}

void RankShards::SetGrads(const Problem& problem, int step) {
  for (size_t k = 0; k < params.size(); ++k) {
    const int i = held[k];
    params[k].grad = ExtractRegion(problem.grads[step][i],
                                   problem.specs[i].shape, ranges[k]);
  }
}

absl::StatusOr<RankShards> CutShards(const Problem& problem,
                                     const ProblemLayout& layout, int rank) {
  const size_t n = problem.specs.size();
  if (layout.placements.size() != n ||
      (!layout.sub_meshes.empty() && layout.sub_meshes.size() != n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout lists ", layout.placements.size(), " placement lists and ",
        layout.sub_meshes.size(), " sub-meshes for ", n, " parameters"));
  }
  const std::vector<int> coord = layout.mesh.Coord(rank);
  RankShards out;
  for (size_t i = 0; i < n; ++i) {
    const TensorSpec& spec = problem.specs[i];
    const SubMesh sub_mesh =
        layout.sub_meshes.empty() ? SubMesh{} : layout.sub_meshes[i];
    if (!sub_mesh.Contains(coord)) continue;
    absl::StatusOr<std::vector<Range>> ranges = LocalRanges(
        spec.shape, layout.placements[i], layout.mesh, coord, sub_mesh);
    if (!ranges.ok()) {
      return absl::Status(ranges.status().code(),
                          absl::StrCat("parameter \"", spec.name, "\" ",
                                       ShapeString(spec.shape), ": ",
                                       ranges.status().message()));
    }
    Parameter p;
    p.name = spec.name;
    p.global_shape = spec.shape;
    p.expert_stack = spec.expert_stack;
    p.row_splits = spec.row_splits;
    for (const Range& r : *ranges) p.local_shape.push_back(r.size());
    p.data = ExtractRegion(problem.init[i], spec.shape, *ranges);
    p.grad.assign(p.data.size(), 0.0f);
    out.params.push_back(std::move(p));
    out.held.push_back(static_cast<int>(i));
    out.ranges.push_back(*std::move(ranges));
  }
  return out;
}

std::vector<float> ExtractRegion(const std::vector<float>& global,
                                 const std::vector<int64_t>& shape,
                                 const std::vector<Range>& ranges) {
  int64_t n = 1;
  for (const Range& r : ranges) n *= r.size();
  std::vector<float> out(n);
  ForEachElement(shape, ranges,
                 [&](int64_t g, int64_t l) { out[l] = global[g]; });
  return out;
}

void InsertRegion(const std::vector<float>& local,
                  const std::vector<int64_t>& shape,
                  const std::vector<Range>& ranges,
                  std::vector<float>* global) {
  ForEachElement(shape, ranges,
                 [&](int64_t g, int64_t l) { (*global)[g] = local[l]; });
}

std::vector<absl::Status> RunDistributedSteps(const Problem& problem,
                                              const ProblemLayout& layout,
                                              const MakeMuonFn& make_muon,
                                              DistributedRun* run) {
  return RunOnRanks(run->size(), [&](int rank) -> absl::Status {
    absl::StatusOr<RankShards> shards = CutShards(problem, layout, rank);
    if (!shards.ok()) return shards.status();
    run->shards[rank] = *std::move(shards);
    absl::StatusOr<std::unique_ptr<Muon>> muon =
        make_muon(rank, run->shards[rank]);
    if (!muon.ok()) return muon.status();
    run->muons[rank] = *std::move(muon);
    run->stats[rank].clear();
    for (int step = 0; step < problem.steps(); ++step) {
      run->shards[rank].SetGrads(problem, step);
      if (absl::Status s = run->muons[rank]->Step(); !s.ok()) {
        return absl::Status(s.code(),
                            absl::StrCat("step ", step + 1, ": ", s.message()));
      }
      run->stats[rank].push_back(run->muons[rank]->last_step_stats());
    }
    return absl::OkStatus();
  });
}

namespace {

// NorMuon: rank's row state of its parameter k (global `spec`, holding
// `region`) is the single device's rows of that region, [..., rows, 1];
// zeros where the rank holds none of the columns (no matrix part, so no
// state of its own).
void ExpectRowStateMatches(const Muon& muon, int k, const TensorSpec& spec,
                           const std::vector<Range>& region,
                           const std::vector<float>& single_rows) {
  std::vector<int64_t> shape = spec.shape;
  shape.back() = 1;
  std::vector<Range> rows = region;
  const bool holds = Numel(spec.shape) > 0 && region.back().size() > 0;
  rows.back() = Range{0, 1};
  std::vector<float> want = ExtractRegion(single_rows, shape, rows);
  if (!holds) want.assign(want.size(), 0.0f);
  EXPECT_TRUE(BitwiseEqual(muon.row_state(k), want))
      << "variance_neuron of local parameter " << k;
}

}  // namespace

void ExpectShardsMatchSingleDevice(const Problem& problem,
                                   const SingleDeviceResult& single,
                                   const DistributedRun& run) {
  ASSERT_EQ(single.params.size(), problem.specs.size());
  ASSERT_EQ(single.buffers.size(), problem.specs.size());
  for (size_t i = 0; i < problem.specs.size(); ++i) {
    const TensorSpec& spec = problem.specs[i];
    SCOPED_TRACE(
        absl::StrCat("parameter ", spec.name, " ", ShapeString(spec.shape)));
    // Reassembled from the shards; NaN marks elements no rank holds.
    std::vector<float> whole(Numel(spec.shape), std::nanf(""));
    for (int r = 0; r < run.size(); ++r) {
      const RankShards& shards = run.shards[r];
      for (size_t k = 0; k < shards.held.size(); ++k) {
        if (shards.held[k] != static_cast<int>(i)) continue;
        SCOPED_TRACE(absl::StrCat("rank ", r));
        const std::vector<Range>& region = shards.ranges[k];
        const std::vector<float>& local = shards.params[k].data;
        InsertRegion(local, spec.shape, region, &whole);
        EXPECT_TRUE(BitwiseEqual(
            local, ExtractRegion(single.params[i], spec.shape, region)));
        ASSERT_NE(run.muons[r], nullptr);
        EXPECT_TRUE(
            BitwiseEqual(run.muons[r]->momentum_buffer(static_cast<int>(k)),
                         ExtractRegion(single.buffers[i], spec.shape, region)));
        if (!single.variances.empty()) {
          ExpectRowStateMatches(*run.muons[r], static_cast<int>(k), spec,
                                region, single.variances[i]);
        }
      }
    }
    EXPECT_TRUE(BitwiseEqual(whole, single.params[i]));
  }
}

void ExpectEachMatrixOrthogonalizedOnce(const Problem& problem,
                                        const SingleDeviceResult& single,
                                        const DistributedRun& run) {
  ASSERT_EQ(single.stats.size(), static_cast<size_t>(problem.steps()));
  for (int r = 0; r < run.size(); ++r) {
    ASSERT_EQ(run.stats[r].size(), static_cast<size_t>(problem.steps()))
        << "rank " << r;
  }
  for (int step = 0; step < problem.steps(); ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step + 1));
    int matrices = 0;
    double flops = 0;
    for (int r = 0; r < run.size(); ++r) {
      matrices += run.stats[r][step].matrices_orthogonalized;
      flops += run.stats[r][step].ns_flops;
    }
    EXPECT_EQ(matrices, problem.matrices());
    EXPECT_EQ(single.stats[step].matrices_orthogonalized, problem.matrices());
    EXPECT_DOUBLE_EQ(flops, single.stats[step].ns_flops);
  }
}

}  // namespace testing
}  // namespace muon
