#include "tools/validate.h"

#include <cblas.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/process_group.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "server/embedded_coordinator.h"
#include "tools/launcher.h"
#include "tools/npy.h"

namespace muon {
namespace {

struct SpecParams {
  v1::JobSpec spec;
  Mesh mesh;
  std::vector<std::vector<Placement>> placements;
  std::vector<SubMesh> sub_meshes;
};

std::vector<int64_t> ShapeOf(const v1::ParamSpec& p) {
  return std::vector<int64_t>(p.shape().begin(), p.shape().end());
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Copies between a full row-major tensor of `shape` (2-D or 3-D) and the
// block `ranges` of it, stored contiguously in `local`.
void CopyBlock(const std::vector<int64_t>& shape, const std::vector<Range>& ranges,
               float* full, float* local, bool to_local) {
  const bool stack = shape.size() == 3;
  const Range experts = stack ? ranges[0] : Range{0, 1};
  const Box box{ranges[stack ? 1 : 0], ranges[stack ? 2 : 1]};
  const Box whole{Range{0, shape[stack ? 1 : 0]}, Range{0, shape[stack ? 2 : 1]}};
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    float* f = full + e * whole.numel();
    float* l = local + (e - experts.begin) * box.numel();
    if (to_local) {
      CopyRegion(f, whole, l, box, box);
    } else {
      CopyRegion(l, box, f, whole, box);
    }
  }
}

absl::StatusOr<SpecParams> LoadSpec(const std::string& path) {
  SpecParams s;
  MUON_ASSIGN_OR_RETURN(s.spec, LoadJobSpec(path));
  MUON_RETURN_IF_ERROR(ValidateJobSpec(s.spec));
  s.mesh = MeshFromProto(s.spec.mesh());
  for (const v1::ParamSpec& p : s.spec.params()) {
    MUON_ASSIGN_OR_RETURN(std::vector<Placement> pl,
                          ParsePlacements(p.placements(), p.name()));
    MUON_ASSIGN_OR_RETURN(SubMesh sub, CheckSubMesh(p.name(), p.sub_mesh(), pl, s.mesh));
    s.placements.push_back(std::move(pl));
    s.sub_meshes.push_back(std::move(sub));
  }
  return s;
}

// Seeded synthetic values, a pure function of (seed, step, parameter), the
// same in every process: uniform in [-scale, scale).
std::vector<float> Synthetic(uint64_t seed, int64_t step, int param,
                             int64_t numel, double scale) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + step * 1000003ULL +
                      static_cast<uint64_t>(param) * 7919ULL + 17);
  std::vector<float> v(numel);
  for (float& x : v) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    x = static_cast<float>((2.0 * u - 1.0) * scale);
  }
  return v;
}

// The full [rows, cols] tensor of parameter i: initial values (step < 0) or
// the gradient of `step`.
absl::StatusOr<std::vector<float>> FullTensor(const ValidateOptions& o,
                                              const v1::ParamSpec& p, int i,
                                              int64_t step) {
  const std::vector<int64_t> shape = ShapeOf(p);
  const std::string& dir = step < 0 ? o.init_dir : o.grads_dir;
  if (dir.empty()) {
    return Synthetic(o.seed, step, i, Numel(shape), step < 0 ? 0.1 : 1.0);
  }
  const std::string path = step < 0
                               ? absl::StrCat(dir, "/", p.name(), ".npy")
                               : absl::StrCat(dir, "/", step, "/", p.name(), ".npy");
  MUON_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
  if (a.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " has shape [", absl::StrJoin(a.shape, ", "), "] but parameter \"",
        p.name(), "\" is [", absl::StrJoin(shape, ", "), "]"));
  }
  return std::move(a.data);
}

struct RunOutput {
  std::vector<int> spec_index;    // spec parameter of each local one
  std::vector<Parameter> params;  // local shards
  int64_t matrices = 0;           // orthogonalized over all steps
  double ns_flops = 0;            // their Newton-Schulz FLOPs (integers)
};

// Runs the steps on one rank (pg != nullptr) or on a single device.
absl::StatusOr<RunOutput> RunSteps(const ValidateOptions& o, const SpecParams& s,
                                   ProcessGroup* pg) {
  const bool single = pg == nullptr;
  const int rank = single ? 0 : pg->rank;
  const std::vector<int> coord = s.mesh.Coord(rank);
  RunOutput out;
  std::vector<std::vector<Range>> mine;
  for (int i = 0; i < s.spec.params_size(); ++i) {
    const v1::ParamSpec& ps = s.spec.params(i);
    const std::vector<int64_t> shape = ShapeOf(ps);
    std::vector<Range> ranges;
    if (single) {
      for (int64_t d : shape) ranges.push_back(Range{0, d});
    } else {
      if (!s.sub_meshes[i].Contains(coord)) continue;  // another stage's
      MUON_ASSIGN_OR_RETURN(ranges, LocalRanges(shape, s.placements[i], s.mesh,
                                                coord, s.sub_meshes[i]));
    }
    Parameter p;
    p.name = ps.name();
    p.global_shape = shape;
    p.expert_stack = shape.size() == 3;
    for (const Range& r : ranges) p.local_shape.push_back(r.size());
    MUON_ASSIGN_OR_RETURN(std::vector<float> init, FullTensor(o, ps, i, -1));
    p.data.resize(p.local_numel());
    p.grad.resize(p.local_numel());
    CopyBlock(shape, ranges, init.data(), p.data.data(), /*to_local=*/true);
    out.spec_index.push_back(i);
    out.params.push_back(std::move(p));
    mine.push_back(std::move(ranges));
  }
  std::vector<Parameter*> ptrs;
  for (Parameter& p : out.params) ptrs.push_back(&p);
  std::optional<DistributedConfig> config;
  if (!single) {
    std::vector<ParamPlacement> pp;
    for (int i : out.spec_index) {
      pp.push_back(ParamPlacement{s.placements[i], s.sub_meshes[i]});
    }
    MUON_ASSIGN_OR_RETURN(config, CreateMeshConfig(s.mesh, pp, pg->comm.get(),
                                                   pg->coordinator.get(),
                                                   pg->incarnation));
    if (!s.spec.execution().assignment_policy().empty()) {
      config->assignment_policy = s.spec.execution().assignment_policy();
    }
    config->bucket_size_bytes = s.spec.execution().bucket_size_bytes();
    config->async_gpu_parallelism = s.spec.execution().async_gpu_parallelism();
    config->prefetch_count = s.spec.execution().prefetch_count();
  }
  MuonOptions options = MuonOptionsFromProto(s.spec.optimizer());
  // Single device and ranks orthogonalize on the same device kind, so the
  // comparison stays bitwise (e.g. 4 host-staged ranks sharing one GPU vs
  // the single-device GPU run).
  if (!s.spec.execution().device().empty()) options.device = s.spec.execution().device();
  if (!s.spec.execution().gpu_precision().empty()) {
    options.gpu_precision = s.spec.execution().gpu_precision();
  }
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(ptrs, options, config));
  for (int64_t step = 0; step < o.steps; ++step) {
    for (size_t k = 0; k < out.params.size(); ++k) {
      const v1::ParamSpec& ps = s.spec.params(out.spec_index[k]);
      MUON_ASSIGN_OR_RETURN(std::vector<float> g,
                            FullTensor(o, ps, out.spec_index[k], step));
      CopyBlock(ShapeOf(ps), mine[k], g.data(), out.params[k].grad.data(),
                /*to_local=*/true);
    }
    MUON_RETURN_IF_ERROR(opt->Step());
    out.matrices += opt->last_step_stats().matrices_orthogonalized;
    out.ns_flops += opt->last_step_stats().ns_flops;
  }
  if (!single) MUON_RETURN_IF_ERROR(pg->comm->Barrier());
  return out;
}

absl::Status MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      cur = path.substr(0, i);
      if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("cannot create ", cur));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunValidateRank(const ValidateOptions& o, int rank,
                             const std::string& out_dir,
                             const std::string& port_file) {
  openblas_set_num_threads(1);
  MUON_ASSIGN_OR_RETURN(SpecParams s, LoadSpec(o.spec_path));
  ProcessGroupOptions pgo;
  pgo.rank = rank;
  pgo.world_size = s.mesh.world_size();
  pgo.job_id = s.spec.job_id().empty() ? "validate" : s.spec.job_id();
  pgo.coordinator_address = o.coordinator;
  pgo.embed_coordinator = o.coordinator.empty();
  pgo.start_embedded_coordinator = StartEmbeddedCoordinator;
  pgo.port_file = port_file;
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg, InitProcessGroup(pgo));
  MUON_ASSIGN_OR_RETURN(RunOutput run, RunSteps(o, s, pg.get()));
  for (size_t k = 0; k < run.params.size(); ++k) {
    MUON_RETURN_IF_ERROR(
        WriteNpy(absl::StrCat(out_dir, "/rank", rank, "_", run.spec_index[k], ".npy"),
                 run.params[k].local_shape, run.params[k].data.data()));
  }
  std::ofstream(absl::StrCat(out_dir, "/rank", rank, ".count"))
      << run.matrices << " " << absl::StrFormat("%.0f", run.ns_flops) << "\n";
  return absl::OkStatus();
}

absl::Status RunValidate(const ValidateOptions& o, std::ostream& out) {
  MUON_ASSIGN_OR_RETURN(SpecParams s, LoadSpec(o.spec_path));
  const int world = s.mesh.world_size();
  MUON_ASSIGN_OR_RETURN(std::string dir, MakeTempDir("muon-validate-"));
  const std::string self = SelfExecutable();
  auto args = [&](int rank) {
    std::vector<std::string> a = {
        self, "validate-rank", absl::StrCat("--spec=", o.spec_path),
        absl::StrCat("--steps=", o.steps), absl::StrCat("--rank=", rank),
        absl::StrCat("--out_dir=", dir), absl::StrCat("--seed=", o.seed),
        absl::StrCat("--init=", o.init_dir), absl::StrCat("--grads=", o.grads_dir)};
    return a;
  };
  out << "validate: " << s.spec.params_size() << " parameters, mesh "
      << s.mesh.ToString() << ", " << world << " rank processes, " << o.steps
      << " steps, coordinator "
      << (o.coordinator.empty() ? "embedded in rank 0" : o.coordinator) << "\n";
  out.flush();
  std::vector<pid_t> pids;
  std::string address = o.coordinator;
  const std::string port_file = dir + "/coordinator.port";
  {
    std::vector<std::string> a = args(0);
    if (address.empty()) {
      a.push_back("--port_file=" + port_file);
    } else {
      a.push_back("--coordinator=" + address);
    }
    MUON_ASSIGN_OR_RETURN(pid_t pid, SpawnProcess(a));
    pids.push_back(pid);
  }
  if (address.empty()) {
    absl::StatusOr<int> port = WaitForPortFile(port_file, pids[0], absl::Seconds(60));
    if (!port.ok()) {
      WaitAll(pids, absl::Seconds(5));
      return absl::AbortedError(absl::StrCat(
          "rank 0 did not start its coordinator: ", port.status().message()));
    }
    address = absl::StrCat("127.0.0.1:", *port);
  }
  for (int r = 1; r < world; ++r) {
    std::vector<std::string> a = args(r);
    a.push_back("--coordinator=" + address);
    absl::StatusOr<pid_t> pid = SpawnProcess(a);
    if (!pid.ok()) {
      WaitAll(pids, absl::Seconds(5));
      return pid.status();
    }
    pids.push_back(*pid);
  }
  const std::vector<int> codes = WaitAll(pids, absl::Seconds(o.timeout_s));
  for (int r = 0; r < world; ++r) {
    if (codes[r] != 0) {
      return absl::AbortedError(absl::StrCat("rank ", r, " exited with ", codes[r],
                                             " (see its error above)"));
    }
  }
  // The same steps on a single device, in this process.
  openblas_set_num_threads(1);
  MUON_ASSIGN_OR_RETURN(RunOutput single, RunSteps(o, s, nullptr));
  // Zero redundancy: the world's counts add up to the single device's.
  // FLOPs are integers far below 2^53, so the sums are exact.
  int64_t dist_matrices = 0;
  double dist_flops = 0;
  for (int r = 0; r < world; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".count"));
    int64_t n = 0;
    double f = 0;
    in >> n >> f;
    dist_matrices += n;
    dist_flops += f;
  }
  double worst = 0;
  out << absl::StrFormat("%-32s %-16s %s\n", "parameter", "global shape",
                         "max |distributed - single|");
  std::vector<std::vector<float>> dist_full(s.spec.params_size());
  for (int i = 0; i < s.spec.params_size(); ++i) {
    const v1::ParamSpec& ps = s.spec.params(i);
    const std::vector<int64_t> shape = ShapeOf(ps);
    dist_full[i].assign(Numel(shape), std::nanf(""));
    for (int r = 0; r < world; ++r) {
      const std::vector<int> coord = s.mesh.Coord(r);
      if (!s.sub_meshes[i].Contains(coord)) continue;
      MUON_ASSIGN_OR_RETURN(std::vector<Range> ranges,
                            LocalRanges(shape, s.placements[i], s.mesh, coord,
                                        s.sub_meshes[i]));
      const std::string file = absl::StrCat(dir, "/rank", r, "_", i, ".npy");
      MUON_ASSIGN_OR_RETURN(NpyArray shard, ReadNpy(file));
      CopyBlock(shape, ranges, dist_full[i].data(), shard.data.data(),
                /*to_local=*/false);
      std::remove(file.c_str());
    }
    double diff = 0;
    for (int64_t k = 0; k < Numel(shape); ++k) {
      const double d = std::fabs(double(dist_full[i][k]) - single.params[i].data[k]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
    worst = std::max(worst, diff);
    out << absl::StrFormat("%-32s %-16s %g\n", ps.name(),
                           absl::StrCat("[", absl::StrJoin(shape, ", "), "]"), diff);
    if (!o.dump_dir.empty()) {
      MUON_RETURN_IF_ERROR(MakeDirs(o.dump_dir + "/distributed"));
      MUON_RETURN_IF_ERROR(MakeDirs(o.dump_dir + "/single"));
      MUON_RETURN_IF_ERROR(WriteNpy(absl::StrCat(o.dump_dir, "/distributed/", ps.name(), ".npy"),
                                    shape, dist_full[i].data()));
      MUON_RETURN_IF_ERROR(WriteNpy(absl::StrCat(o.dump_dir, "/single/", ps.name(), ".npy"),
                                    shape, single.params[i].data.data()));
    }
  }
  for (int r = 0; r < world; ++r) std::remove(absl::StrCat(dir, "/rank", r, ".count").c_str());
  std::remove(port_file.c_str());
  rmdir(dir.c_str());
  const bool equal = worst <= o.tolerance;
  const bool counts =
      dist_matrices == single.matrices && dist_flops == single.ns_flops;
  out << absl::StrFormat(
      "validate: max_abs_diff=%g tolerance=%g matrices_orthogonalized "
      "distributed=%d single=%d ns_flops distributed=%.0f single=%.0f "
      "world=%d steps=%d: %s\n",
      worst, o.tolerance, dist_matrices, single.matrices, dist_flops,
      single.ns_flops, world, o.steps, equal && counts ? "OK" : "MISMATCH");
  out.flush();
  if (!equal) {
    return absl::DataLossError(absl::StrCat(
        "distributed and single-device parameters differ by up to ", worst,
        " (tolerance ", o.tolerance, ")"));
  }
  if (!counts) {
    return absl::DataLossError(absl::StrCat(
        "zero redundancy violated: the ranks orthogonalized ", dist_matrices,
        " matrices (", absl::StrFormat("%.0f", dist_flops),
        " NS FLOPs) in all, the single device ", single.matrices, " (",
        absl::StrFormat("%.0f", single.ns_flops), ")"));
  }
  return absl::OkStatus();
}

}  // namespace muon
