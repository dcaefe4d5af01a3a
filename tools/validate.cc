#include "tools/validate.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "kernels/blas_tiles.h"
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
void CopyBlock(const std::vector<int64_t>& shape,
               const std::vector<Range>& ranges, float* full, float* local,
               bool to_local) {
  const bool stack = shape.size() == 3;
  const Range experts = stack ? ranges[0] : Range{0, 1};
  const Box box{ranges[stack ? 1 : 0], ranges[stack ? 2 : 1]};
  const Box whole{Range{0, shape[stack ? 1 : 0]},
                  Range{0, shape[stack ? 2 : 1]}};
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
  // Bounds of a local check, before any process is forked or any full
  // tensor allocated (ValidateJobSpec already bounded every product).
  if (s.mesh.world_size() > kMaxValidateRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec \"", path, "\": mesh ", s.mesh.ToString(),
                     " has ", s.mesh.world_size(),
                     " ranks; validate starts one local process per "
                     "rank and runs at most ",
                     kMaxValidateRanks));
  }
  int64_t total = 0;
  for (const v1::ParamSpec& p : s.spec.params()) {
    // Each shape's product is at most kMaxParamElements (checked by
    // ValidateJobSpec), and there are at most kMaxParams: no overflow.
    int64_t n = 1;
    for (int64_t d : p.shape()) n *= d;
    total += n;
    if (total > kMaxValidateElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec \"", path, "\": the parameters up to \"",
                       p.name(), "\" hold ", total,
                       " elements; validate keeps full copies in one "
                       "process and accepts at most ",
                       kMaxValidateElements));
    }
  }
  for (const v1::ParamSpec& p : s.spec.params()) {
    MUON_ASSIGN_OR_RETURN(std::vector<Placement> pl,
                          ParsePlacements(p.placements(), p.name()));
    MUON_ASSIGN_OR_RETURN(SubMesh sub,
                          CheckSubMesh(p.name(), p.sub_mesh(), pl, s.mesh));
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

// The .npy file of parameter `p`'s initial values (step < 0) or of its
// gradient at `step`, under `dir` (--init or --grads).
std::string InputPath(const std::string& dir, const v1::ParamSpec& p,
                      int64_t step) {
  return step < 0
             ? absl::StrCat(dir, "/", NpyFileName(p.name()), ".npy")
             : absl::StrCat(dir, "/", step, "/", NpyFileName(p.name()), ".npy");
}

// InvalidArgument naming the file and both shapes unless `got` is p's.
absl::Status CheckInputShape(const std::string& path,
                             const std::vector<int64_t>& got,
                             const v1::ParamSpec& p) {
  const std::vector<int64_t> shape = ShapeOf(p);
  if (got == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      path, " has shape [", absl::StrJoin(got, ", "), "] but parameter \"",
      p.name(), "\" is [", absl::StrJoin(shape, ", "), "]"));
}

// The full [rows, cols] tensor of parameter i: initial values (step < 0) or
// the gradient of `step`.
absl::StatusOr<std::vector<float>> FullTensor(const ValidateOptions& o,
                                              const v1::ParamSpec& p, int i,
                                              int64_t step) {
  const std::string& dir = step < 0 ? o.init_dir : o.grads_dir;
  if (dir.empty()) {
    return Synthetic(o.seed, step, i, Numel(ShapeOf(p)), step < 0 ? 0.1 : 1.0);
  }
  const std::string path = InputPath(dir, p, step);
  MUON_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
  MUON_RETURN_IF_ERROR(CheckInputShape(path, a.shape, p));
  return std::move(a.data);
}

struct RunOutput {
  std::vector<int> spec_index;  // spec parameter of each local one
  // Local shards (fp32, row-major), the trainer's own memory: the optimizer
  // sees views of them.
  std::vector<std::vector<float>> data;
  std::vector<std::vector<float>> grad;
  std::vector<std::vector<int64_t>> local_shape;
  std::vector<std::vector<Range>> ranges;  // global ranges held, per dim
  int64_t matrices = 0;                    // orthogonalized over all steps
  double ns_flops = 0;  // their Newton-Schulz FLOPs (integers)
};

// The steps a run covers and the checkpoints it reads and writes.
struct Phase {
  int64_t from = 0;  // first step (0-based)
  int64_t to = 0;    // one past the last
  // Checkpoint directory to resume from (model/ and optim/ inside); empty =
  // start from the initial values.
  std::string load_dir;
  // Checkpoint directory to write after the last step; empty = none.
  std::string save_dir;
};

// This rank's parameters (ranges, views of freshly allocated shards) with
// their initial values or, when resuming, the values saved under
// `load_dir`/model read for this rank's boxes.
absl::Status InitLocalParams(const ValidateOptions& o, const SpecParams& s,
                             bool single, int rank, const std::string& load_dir,
                             RunOutput* out) {
  const std::vector<int> coord = s.mesh.Coord(rank);
  std::unique_ptr<CheckpointReader> model;
  if (!load_dir.empty()) {
    MUON_ASSIGN_OR_RETURN(model, CheckpointReader::Open(load_dir + "/model"));
  }
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
    std::vector<int64_t> local;
    for (const Range& r : ranges) local.push_back(r.size());
    std::vector<float> data(Numel(local));
    if (model != nullptr) {
      MUON_RETURN_IF_ERROR(
          model->ReadRegion(ps.name(), shape, ranges, data.data()));
    } else {
      MUON_ASSIGN_OR_RETURN(std::vector<float> init, FullTensor(o, ps, i, -1));
      CopyBlock(shape, ranges, init.data(), data.data(), /*to_local=*/true);
    }
    out->spec_index.push_back(i);
    out->grad.emplace_back(data.size());
    out->data.push_back(std::move(data));
    out->local_shape.push_back(std::move(local));
    out->ranges.push_back(std::move(ranges));
  }
  return absl::OkStatus();
}

// Views of `out`'s shards, as a trainer passes its tensors.
std::vector<ParamView> LocalViews(const SpecParams& s, RunOutput* out) {
  std::vector<ParamView> views;
  for (size_t k = 0; k < out->data.size(); ++k) {
    const v1::ParamSpec& ps = s.spec.params(out->spec_index[k]);
    ParamView v;
    v.name = ps.name();
    v.data = out->data[k].data();
    v.grad = out->grad[k].data();
    v.local_shape = out->local_shape[k];
    v.global_shape = ShapeOf(ps);
    v.expert_stack = v.global_shape.size() == 3;
    v.row_splits.assign(ps.row_splits().begin(), ps.row_splits().end());
    views.push_back(std::move(v));
  }
  return views;
}

absl::StatusOr<DistributedConfig> ConfigOf(const SpecParams& s,
                                           const RunOutput& out,
                                           ProcessGroup* pg) {
  std::vector<ParamPlacement> pp;
  for (int i : out.spec_index) {
    pp.push_back(ParamPlacement{s.placements[i], s.sub_meshes[i]});
  }
  MUON_ASSIGN_OR_RETURN(
      DistributedConfig config,
      CreateMeshConfig(s.mesh, pp, pg->comm.get(), pg->coordinator.get(),
                       pg->incarnation));
  config.state.control_communicator = pg->control();
  // The spec's execution options; the device is MuonOptions' (below).
  config.execution = s.spec.execution();
  config.execution.clear_device();
  config.execution.clear_gpu_precision();
  return config;
}

absl::StatusOr<MuonOptions> OptionsOf(const SpecParams& s) {
  MUON_ASSIGN_OR_RETURN(MuonOptions options,
                        MuonOptionsFromProto(s.spec.optimizer()));
  // Single device and ranks orthogonalize on the same device kind, so the
  // comparison stays bitwise (e.g. 4 host-staged ranks sharing one GPU vs
  // the single-device GPU run).
  MuonOptionNames names;
  names.device = s.spec.execution().device();
  names.gpu_precision = s.spec.execution().gpu_precision();
  MUON_RETURN_IF_ERROR(ApplyMuonOptionNames(names, &options));
  return options;
}

// Writes this rank's parameter shards as a checkpoint (DIR/model, the
// trainer's own model checkpoint) next to the optimizer's (DIR/optim).
absl::Status SaveCheckpoint(const SpecParams& s, const RunOutput& out,
                            const Muon& opt, const std::string& dir) {
  MUON_RETURN_IF_ERROR(opt.Save(dir + "/optim"));
  CheckpointMetadata meta;
  meta.world_size = opt.world_size();
  meta.mesh = opt.world_size() == 1 ? Mesh::OneDim(1) : s.mesh;
  meta.plan_hash = opt.plan().hash();
  meta.step = opt.step_count();
  std::vector<ShardTensorView> tensors;
  for (size_t k = 0; k < out.data.size(); ++k) {
    const int i = out.spec_index[k];
    ShardTensorView t;
    t.name = s.spec.params(i).name();
    t.global_shape = ShapeOf(s.spec.params(i));
    if (opt.world_size() == 1) {
      t.placements = {"Replicate()"};
    } else {
      for (const Placement& p : s.placements[i])
        t.placements.push_back(p.ToString());
    }
    t.box = out.ranges[k];
    t.data = out.data[k].data();
    tensors.push_back(std::move(t));
  }
  MUON_RETURN_IF_ERROR(
      WriteCheckpointShard(dir + "/model", opt.current_rank(), meta, tensors));
  if (opt.current_rank() == 0) {
    MUON_RETURN_IF_ERROR(
        WriteCheckpointMetadata(dir + "/model", meta, tensors));
  }
  return absl::OkStatus();
}

// Runs `phase`'s steps on one rank (pg != nullptr) or on a single device.
// Runs `phase` on this rank (pg) or on one device (pg == nullptr);
// `progress(step, seconds)`, when set, after each step (1-based step, wall
// seconds since the phase began).
absl::StatusOr<RunOutput> RunSteps(
    const ValidateOptions& o, const SpecParams& s, ProcessGroup* pg,
    const Phase& phase,
    const std::function<void(int64_t, double)>& progress = nullptr) {
  const absl::Time start = absl::Now();
  const bool single = pg == nullptr;
  RunOutput out;
  MUON_RETURN_IF_ERROR(InitLocalParams(o, s, single, single ? 0 : pg->rank,
                                       phase.load_dir, &out));
  std::optional<DistributedConfig> config;
  if (!single) {
    MUON_ASSIGN_OR_RETURN(config, ConfigOf(s, out, pg));
  }
  MUON_ASSIGN_OR_RETURN(MuonOptions options, OptionsOf(s));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(LocalViews(s, &out), options, config));
  if (!phase.load_dir.empty()) {
    MUON_RETURN_IF_ERROR(opt->Load(phase.load_dir + "/optim"));
    if (opt->step_count() != phase.from) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", phase.load_dir, " is at step ", opt->step_count(),
          " but the run resumes at step ", phase.from));
    }
  }
  for (int64_t step = phase.from; step < phase.to; ++step) {
    for (size_t k = 0; k < out.data.size(); ++k) {
      const v1::ParamSpec& ps = s.spec.params(out.spec_index[k]);
      MUON_ASSIGN_OR_RETURN(std::vector<float> g,
                            FullTensor(o, ps, out.spec_index[k], step));
      CopyBlock(ShapeOf(ps), out.ranges[k], g.data(), out.grad[k].data(),
                /*to_local=*/true);
    }
    MUON_RETURN_IF_ERROR(opt->Step());
    out.matrices += opt->last_step_stats().matrices_orthogonalized;
    out.ns_flops += opt->last_step_stats().ns_flops;
    if (progress) {
      progress(step + 1, absl::ToDoubleSeconds(absl::Now() - start));
    }
  }
  if (!phase.save_dir.empty()) {
    MUON_RETURN_IF_ERROR(SaveCheckpoint(s, out, *opt, phase.save_dir));
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

// Removes `path` and everything below it (files this tool wrote).
void RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace

absl::Status RunValidateRank(const ValidateOptions& o, int rank,
                             const std::string& out_dir,
                             const std::string& port_file) {
  (void)kernels::SetComputeThreads(1);  // one thread per rank process
  MUON_ASSIGN_OR_RETURN(SpecParams s, LoadSpec(o.spec_path));
  ProcessGroupOptions pgo;
  pgo.rank = rank;
  pgo.world_size = s.mesh.world_size();
  // With a daemon the ranks join whatever job it serves (its --job_id);
  // rank 0's embedded coordinator serves the spec's job id.
  pgo.job_id = !o.coordinator.empty()    ? ""
               : s.spec.job_id().empty() ? "validate"
                                         : s.spec.job_id();
  pgo.coordinator_address = o.coordinator;
  pgo.embed_coordinator = o.coordinator.empty();
  pgo.start_embedded_coordinator = StartEmbeddedCoordinator;
  pgo.port_file = port_file;
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg,
                        InitProcessGroup(pgo));
  const Phase phase{o.phase_from, o.phase_to < 0 ? o.steps : o.phase_to,
                    o.load_dir, o.save_dir};
  // Rank 0 reports each step (the other ranks take it at the same pace).
  auto progress = [&](int64_t step, double seconds) {
    std::fprintf(stderr, "validate: distributed step %lld/%d done (%.2f s)\n",
                 static_cast<long long>(step), o.steps, seconds);
  };
  MUON_ASSIGN_OR_RETURN(
      RunOutput run,
      RunSteps(o, s, pg.get(), phase,
               rank == 0 ? std::function<void(int64_t, double)>(progress)
                         : nullptr));
  for (size_t k = 0; k < run.data.size(); ++k) {
    MUON_RETURN_IF_ERROR(WriteNpy(
        absl::StrCat(out_dir, "/rank", rank, "_", run.spec_index[k], ".npy"),
        run.local_shape[k], run.data[k].data()));
  }
  std::ofstream(absl::StrCat(out_dir, "/rank", rank, ".count"))
      << run.matrices << " " << absl::StrFormat("%.0f", run.ns_flops) << "\n";
  return absl::OkStatus();
}

namespace {

// Runs `phase` on the rank processes of the spec at `spec_path`, writing
// their shards and counts under `out_dir`.
absl::Status RunRankPhase(const ValidateOptions& o,
                          const std::string& spec_path, int world,
                          const Phase& phase, const std::string& out_dir) {
  MUON_RETURN_IF_ERROR(MakeDirs(out_dir));
  const std::string self = SelfExecutable();
  RankLaunchOptions launch;
  launch.world_size = world;
  launch.coordinator = o.coordinator;
  launch.port_file = out_dir + "/coordinator.port";
  launch.timeout = absl::Seconds(o.timeout_s);
  launch.argv = [&](int rank) {
    std::vector<std::string> argv{self,
                                  "validate-rank",
                                  absl::StrCat("--spec=", spec_path),
                                  absl::StrCat("--steps=", o.steps),
                                  absl::StrCat("--rank=", rank),
                                  absl::StrCat("--out_dir=", out_dir),
                                  absl::StrCat("--seed=", o.seed),
                                  absl::StrCat("--phase_from=", phase.from),
                                  absl::StrCat("--phase_to=", phase.to)};
    // Paths only when set (muonctl checks that they exist).
    for (const auto& [flag, value] :
         {std::make_pair("--init=", o.init_dir),
          std::make_pair("--grads=", o.grads_dir),
          std::make_pair("--load_dir=", phase.load_dir),
          std::make_pair("--save_dir=", phase.save_dir)}) {
      if (!value.empty()) argv.push_back(absl::StrCat(flag, value));
    }
    return argv;
  };
  MUON_RETURN_IF_ERROR(LaunchRanks(launch));
  std::remove(launch.port_file.c_str());
  return absl::OkStatus();
}

// The zero-redundancy counts the ranks of a phase wrote.
void AddCounts(const std::string& dir, int world, int64_t* matrices,
               double* flops) {
  for (int r = 0; r < world; ++r) {
    const std::string path = absl::StrCat(dir, "/rank", r, ".count");
    std::ifstream in(path);
    int64_t n = 0;
    double f = 0;
    in >> n >> f;
    *matrices += n;
    *flops += f;
    std::remove(path.c_str());
  }
}

// The resume spec must hold the same parameters (names, global shapes, in
// order) as the spec; only the layout may differ.
absl::Status CheckSameParams(const SpecParams& a, const SpecParams& b,
                             const std::string& b_path) {
  if (a.spec.params_size() != b.spec.params_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume_spec ", b_path, " has ", b.spec.params_size(),
                     " parameters but --spec has ", a.spec.params_size()));
  }
  for (int i = 0; i < a.spec.params_size(); ++i) {
    const v1::ParamSpec& x = a.spec.params(i);
    const v1::ParamSpec& y = b.spec.params(i);
    if (x.name() != y.name() || ShapeOf(x) != ShapeOf(y)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--resume_spec ", b_path, ": parameter ", i, " is \"", y.name(),
          "\" [", absl::StrJoin(ShapeOf(y), ", "), "] but --spec has \"",
          x.name(), "\" [", absl::StrJoin(ShapeOf(x), ", "), "]"));
    }
  }
  return absl::OkStatus();
}

// Assembles parameter i's full tensor from the shards the ranks of layout
// `s` wrote under `dir`.
absl::StatusOr<std::vector<float>> Assemble(const SpecParams& s, int i,
                                            const std::string& dir) {
  const v1::ParamSpec& ps = s.spec.params(i);
  const std::vector<int64_t> shape = ShapeOf(ps);
  std::vector<float> full(Numel(shape), std::nanf(""));
  for (int r = 0; r < s.mesh.world_size(); ++r) {
    const std::vector<int> coord = s.mesh.Coord(r);
    if (!s.sub_meshes[i].Contains(coord)) continue;
    MUON_ASSIGN_OR_RETURN(
        std::vector<Range> ranges,
        LocalRanges(shape, s.placements[i], s.mesh, coord, s.sub_meshes[i]));
    const std::string file = absl::StrCat(dir, "/rank", r, "_", i, ".npy");
    MUON_ASSIGN_OR_RETURN(NpyArray shard, ReadNpy(file));
    CopyBlock(shape, ranges, full.data(), shard.data.data(),
              /*to_local=*/false);
    std::remove(file.c_str());
  }
  return full;
}

}  // namespace

// Reads every --init file (one per parameter) and every --grads file (one
// per step and parameter) and checks its shape, so that a missing or
// misshapen file fails validate before any rank process starts.
// Errors: ReadNpy's (NotFound / DataLoss naming the path); InvalidArgument
// for a shape other than the parameter's (names the file, both shapes).
absl::Status CheckInputFiles(const ValidateOptions& o, const SpecParams& s) {
  // Headers only (ReadNpyShape checks the file size against the header):
  // the ranks read the data.
  auto check = [&](const std::string& dir, const v1::ParamSpec& p,
                   int64_t step) -> absl::Status {
    const std::string path = InputPath(dir, p, step);
    MUON_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ReadNpyShape(path));
    return CheckInputShape(path, shape, p);
  };
  for (const v1::ParamSpec& p : s.spec.params()) {
    if (!o.init_dir.empty()) {
      MUON_RETURN_IF_ERROR(check(o.init_dir, p, /*step=*/-1));
    }
    if (o.grads_dir.empty()) continue;
    for (int64_t step = 0; step < o.steps; ++step) {
      MUON_RETURN_IF_ERROR(check(o.grads_dir, p, step));
    }
  }
  return absl::OkStatus();
}

namespace {

// Runs the distributed steps in rank processes (with --checkpoint_at: up to
// the checkpoint on `s`'s mesh, then resumed on `s2`'s) into `final_dir`;
// adds up the ranks' orthogonalized matrices and NS FLOPs.
absl::Status RunDistributed(const ValidateOptions& o, const SpecParams& s,
                            const SpecParams& s2,
                            const std::string& resume_path,
                            const std::string& dir, const std::string& ckpt,
                            const std::string& final_dir, int64_t* matrices,
                            double* flops) {
  if (o.checkpoint_at > 0) {
    MUON_RETURN_IF_ERROR(RunRankPhase(o, o.spec_path, s.mesh.world_size(),
                                      Phase{0, o.checkpoint_at, "", ckpt},
                                      dir + "/before"));
    AddCounts(dir + "/before", s.mesh.world_size(), matrices, flops);
    MUON_RETURN_IF_ERROR(RunRankPhase(o, resume_path, s2.mesh.world_size(),
                                      Phase{o.checkpoint_at, o.steps, ckpt, ""},
                                      final_dir));
  } else {
    MUON_RETURN_IF_ERROR(RunRankPhase(o, o.spec_path, s.mesh.world_size(),
                                      Phase{0, o.steps, "", ""}, final_dir));
  }
  const SpecParams& last = o.checkpoint_at > 0 ? s2 : s;
  AddCounts(final_dir, last.mesh.world_size(), matrices, flops);
  return absl::OkStatus();
}

// Prints, per parameter, the largest |distributed - single| (writing both
// as .npy under --dump); returns the largest over all.
absl::StatusOr<double> CompareParameters(
    const ValidateOptions& o, const SpecParams& s, const SpecParams& last,
    const std::string& final_dir, const RunOutput& single, std::ostream& out) {
  double worst = 0;
  out << absl::StrFormat("%-32s %-16s %s\n", "parameter", "global shape",
                         "max |distributed - single|");
  for (int i = 0; i < s.spec.params_size(); ++i) {
    const v1::ParamSpec& ps = s.spec.params(i);
    const std::vector<int64_t> shape = ShapeOf(ps);
    MUON_ASSIGN_OR_RETURN(std::vector<float> dist_full,
                          Assemble(last, i, final_dir));
    double diff = 0;
    for (int64_t k = 0; k < Numel(shape); ++k) {
      const double d = std::fabs(double(dist_full[k]) - single.data[i][k]);
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
    worst = std::max(worst, diff);
    out << absl::StrFormat("%-32s %-16s %g\n", ps.name(),
                           absl::StrCat("[", absl::StrJoin(shape, ", "), "]"),
                           diff);
    if (o.dump_dir.empty()) continue;
    MUON_RETURN_IF_ERROR(MakeDirs(o.dump_dir + "/distributed"));
    MUON_RETURN_IF_ERROR(MakeDirs(o.dump_dir + "/single"));
    MUON_RETURN_IF_ERROR(WriteNpy(absl::StrCat(o.dump_dir, "/distributed/",
                                               NpyFileName(ps.name()), ".npy"),
                                  shape, dist_full.data()));
    MUON_RETURN_IF_ERROR(WriteNpy(
        absl::StrCat(o.dump_dir, "/single/", NpyFileName(ps.name()), ".npy"),
        shape, single.data[i].data()));
  }
  return worst;
}

// Prints what the run will do: the job, and with a checkpoint, the mesh it
// resumes on.
void PrintValidateHeader(const ValidateOptions& o, const SpecParams& s,
                         const SpecParams& s2, bool resume, std::ostream& out) {
  out << "validate: " << s.spec.params_size() << " parameters, mesh "
      << s.mesh.ToString() << ", " << s.mesh.world_size() << " rank processes, "
      << o.steps << " steps, coordinator "
      << (o.coordinator.empty() ? "embedded in rank 0" : o.coordinator) << "\n";
  if (resume) {
    out << "validate: checkpoint after step " << o.checkpoint_at
        << ", resumed in fresh rank processes on mesh " << s2.mesh.ToString()
        << " (" << s2.mesh.world_size() << " ranks)\n";
  }
  out.flush();
}

// Prints the verdict line and returns DataLoss when the parameters differ
// beyond the tolerance or the distributed run orthogonalized a different
// number of matrices (or NS FLOPs) than the single device.
absl::Status ReportVerdict(const ValidateOptions& o, const SpecParams& last,
                           double worst, int64_t dist_matrices,
                           double dist_flops, const RunOutput& single,
                           bool resume, std::ostream& out) {
  const bool equal = worst <= o.tolerance;
  const bool counts =
      dist_matrices == single.matrices && dist_flops == single.ns_flops;
  // What the bitwise promise is scoped by: the CPU kernel set (any thread
  // and rank count).
  out << "validate: cpu_kernels=" << kernels::BlasCoreName() << "\n";
  out << absl::StrFormat(
      "validate: max_abs_diff=%g tolerance=%g matrices_orthogonalized "
      "distributed=%d single=%d ns_flops distributed=%.0f single=%.0f "
      "world=%d steps=%d%s: %s\n",
      worst, o.tolerance, dist_matrices, single.matrices, dist_flops,
      single.ns_flops, last.mesh.world_size(), o.steps,
      resume ? absl::StrCat(" checkpoint_at=", o.checkpoint_at) : "",
      equal && counts ? "OK" : "MISMATCH");
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

}  // namespace

absl::Status RunValidate(const ValidateOptions& o, std::ostream& out) {
  MUON_ASSIGN_OR_RETURN(SpecParams s, LoadSpec(o.spec_path));
  const bool resume = o.checkpoint_at > 0;
  if (resume && o.checkpoint_at >= o.steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_at ", o.checkpoint_at,
                     " must be between 1 and --steps - 1 (", o.steps - 1, ")"));
  }
  const std::string resume_path =
      o.resume_spec_path.empty() ? o.spec_path : o.resume_spec_path;
  MUON_ASSIGN_OR_RETURN(SpecParams s2, LoadSpec(resume_path));
  MUON_RETURN_IF_ERROR(CheckSameParams(s, s2, resume_path));
  const SpecParams& last = resume ? s2 : s;
  // --init / --grads: every file there and of the right shape before any
  // rank process starts.
  MUON_RETURN_IF_ERROR(CheckInputFiles(o, s));
  MUON_ASSIGN_OR_RETURN(const std::string dir, MakeTempDir("muon-validate-"));
  // The rank processes' shards, counts and (without --dump) checkpoint go
  // under `dir`: removed on every return, failures included.
  absl::Cleanup remove_dir = [&dir] { RemoveTree(dir); };
  PrintValidateHeader(o, s, s2, resume, out);
  // With --dump the checkpoint is kept (DIR/checkpoint/{model,optim}).
  const std::string ckpt =
      (o.dump_dir.empty() ? dir : o.dump_dir) + "/checkpoint";
  const std::string final_dir = dir + "/final";
  int64_t dist_matrices = 0;
  double dist_flops = 0;
  MUON_RETURN_IF_ERROR(RunDistributed(o, s, s2, resume_path, dir, ckpt,
                                      final_dir, &dist_matrices, &dist_flops));
  // The same steps on a single device, uninterrupted, in this process.
  (void)kernels::SetComputeThreads(1);  // one thread per rank process
  MUON_ASSIGN_OR_RETURN(
      RunOutput single,
      RunSteps(o, s, nullptr, Phase{0, o.steps, "", ""},
               [&](int64_t step, double seconds) {
                 out << absl::StrFormat(
                     "validate: single-device step %d/%d done (%.2f s)\n", step,
                     o.steps, seconds);
                 out.flush();
               }));
  MUON_ASSIGN_OR_RETURN(const double worst,
                        CompareParameters(o, s, last, final_dir, single, out));
  return ReportVerdict(o, last, worst, dist_matrices, dist_flops, single,
                       resume, out);
}

}  // namespace muon
