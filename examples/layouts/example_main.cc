#include "examples/layouts/example_main.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "server/embedded_coordinator.h"
#include "tools/launcher.h"

ABSL_FLAG(int, nproc, 0, "Rank processes (0 = the example's default).");
ABSL_FLAG(int, timeout_s, 60, "Bound on the whole job, in seconds.");
// Internal: set by the launcher on the rank processes it starts.
ABSL_FLAG(int, rank, -1, "Internal: this process's rank.");
ABSL_FLAG(std::string, coordinator, "",
          "Internal: host:port of rank 0's coordinator.");
ABSL_FLAG(std::string, port_file, "", "Internal: rank 0 writes its port here.");
ABSL_FLAG(std::string, out_dir, "",
          "Internal: where ranks leave their results.");

namespace muon::examples {
namespace {

// FNV-1a: a seed from a name that is the same in every build and process.
uint64_t NameSeed(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> Uniform(uint64_t seed, int64_t numel, double scale) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(numel);
  for (float& x : v) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    x = static_cast<float>((2.0 * u - 1.0) * scale);
  }
  return v;
}

// Copies between a full row-major tensor of `shape` (2-D, or 3-D expert
// stack) and its block `ranges`, stored contiguously in `local`.
void CopyBlock(const std::vector<int64_t>& shape,
               const std::vector<Range>& ranges, const float* full,
               float* local) {
  const bool stack = shape.size() == 3;
  const Range experts = stack ? ranges[0] : Range{0, 1};
  const Box box{ranges[stack ? 1 : 0], ranges[stack ? 2 : 1]};
  const Box whole{Range{0, shape[stack ? 1 : 0]},
                  Range{0, shape[stack ? 2 : 1]}};
  if (box.empty()) return;
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    CopyRegion(full + e * whole.numel(), whole,
               local + (e - experts.begin) * box.numel(), box, box);
  }
}

}  // namespace

std::vector<ParamDef> Mlp() {
  return {ParamDef{"fc1.weight", {16, 13}}, ParamDef{"fc2.weight", {12, 16}},
          ParamDef{"fc3.weight", {10, 12}}};
}

std::vector<ParamDef> Transformer(int layers) {
  constexpr int64_t kModel = 11, kFf = 18;
  std::vector<ParamDef> defs;
  for (int l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    defs.push_back({p + "attention.qkv_proj.weight", {3 * kModel, kModel}});
    defs.push_back({p + "attention.out_proj.weight", {kModel, kModel}});
    defs.push_back({p + "ffn.w1.weight", {kFf, kModel}});
    defs.push_back({p + "ffn.w2.weight", {kModel, kFf}});
  }
  return defs;
}

std::vector<ParamDef> MoE(int experts) {
  constexpr int64_t kModel = 11, kFf = 18;
  return {ParamDef{"router.weight", {experts, kModel}},
          ParamDef{"experts.w1", {experts, kFf, kModel}},
          ParamDef{"experts.w2", {experts, kModel, kFf}}};
}

MuonOptions ExampleOptions() {
  MuonOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.1;
  o.momentum = 0.95;
  o.nesterov = true;
  return o;
}

std::vector<float> FullInit(const ParamDef& def) {
  return Uniform(NameSeed(def.name) ^ 0x5EEDULL, Numel(def.shape), 0.1);
}

std::vector<float> FullGrad(const ParamDef& def, int step) {
  return Uniform(NameSeed(def.name) + 7919ULL * (step + 1), Numel(def.shape),
                 1.0);
}

std::vector<int> RankRange(int start, int stop, int step) {
  std::vector<int> ranks;
  for (int r = start; r < stop; r += step) ranks.push_back(r);
  return ranks;
}

std::vector<std::vector<Placement>> SamePlacements(
    const std::vector<ParamDef>& model,
    const std::vector<Placement>& placements) {
  return std::vector<std::vector<Placement>>(model.size(), placements);
}

absl::Status LocalModel::AddShard(const ParamDef& def, const Mesh& mesh,
                                  const std::vector<Placement>& placements,
                                  int rank, const SubMesh& sub_mesh) {
  const std::vector<int> coord = mesh.Coord(rank);
  if (!sub_mesh.Contains(coord)) return absl::OkStatus();  // not ours
  absl::StatusOr<std::vector<Range>> ranges =
      LocalRanges(def.shape, placements, mesh, coord, sub_mesh);
  if (!ranges.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", def.name, "\": ", ranges.status().message()));
  }
  auto p = std::make_unique<Parameter>();
  p->name = def.name;
  p->global_shape = def.shape;
  p->expert_stack = def.expert_stack();
  for (const Range& r : *ranges) p->local_shape.push_back(r.size());
  p->data.resize(p->local_numel());
  p->grad.assign(p->local_numel(), 0.0f);
  CopyBlock(def.shape, *ranges, FullInit(def).data(), p->data.data());
  defs_.push_back(def);
  ranges_.push_back(*std::move(ranges));
  params_.push_back(std::move(p));
  return absl::OkStatus();
}

void LocalModel::AddFull(const ParamDef& def) {
  const Mesh one = Mesh::OneDim(1);
  absl::Status s = AddShard(def, one, {Placement::Replicate()}, 0);
  (void)s;  // Replicate() over one rank cannot fail.
}

std::vector<ParamView> LocalModel::params() {
  std::vector<ParamView> views;
  for (auto& p : params_) views.push_back(p->View());
  return views;
}

void LocalModel::SetGrads(int step) {
  for (size_t k = 0; k < params_.size(); ++k) {
    CopyBlock(defs_[k].shape, ranges_[k], FullGrad(defs_[k], step).data(),
              params_[k]->grad.data());
  }
}

absl::Status LocalModel::CheckAgainstSingleDevice(
    const std::vector<ParamDef>& model, RankContext& ctx) const {
  // The reference: the whole model on one device, no distributed config.
  LocalModel single;
  for (const ParamDef& def : model) single.AddFull(def);
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(single.params(), ExampleOptions()));
  for (int step = 0; step < kSteps; ++step) {
    single.SetGrads(step);
    MUON_RETURN_IF_ERROR(opt->Step());
  }
  double max_diff = 0;
  int64_t checked = 0;
  std::string first_mismatch;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Parameter& mine = *params_[k];
    int ref = -1;
    for (int i = 0; i < single.size(); ++i) {
      if (single.defs_[i].name == mine.name) ref = i;
    }
    if (ref < 0) {
      return absl::InternalError(
          absl::StrCat("rank ", ctx.rank, ": parameter \"", mine.name,
                       "\" is not in the single-device model"));
    }
    std::vector<float> expected(mine.data.size());
    CopyBlock(defs_[k].shape, ranges_[k], single.params_[ref]->data.data(),
              expected.data());
    for (size_t i = 0; i < expected.size(); ++i) {
      const double diff = std::fabs(static_cast<double>(mine.data[i]) -
                                    static_cast<double>(expected[i]));
      max_diff = std::max(max_diff, std::isnan(diff) ? INFINITY : diff);
      if (first_mismatch.empty() &&
          std::memcmp(&mine.data[i], &expected[i], sizeof(float)) != 0) {
        first_mismatch =
            absl::StrCat("parameter \"", mine.name, "\" local element ", i,
                         " is ", mine.data[i], " instead of ", expected[i]);
      }
    }
    checked += static_cast<int64_t>(expected.size());
  }
  if (!first_mismatch.empty()) {
    return absl::InternalError(
        absl::StrCat("rank ", ctx.rank,
                     ": not bitwise equal to the single-device run "
                     "(max_abs_diff ",
                     max_diff, "); first: ", first_mismatch));
  }
  ctx.max_abs_diff = max_diff;
  ctx.values_checked = checked;
  return absl::OkStatus();
}

absl::StatusOr<LocalModel> ShardModel(
    const std::vector<ParamDef>& model, const Mesh& mesh,
    const std::vector<std::vector<Placement>>& placements, int rank,
    const std::vector<SubMesh>& sub_meshes) {
  if (placements.size() != model.size() ||
      (!sub_meshes.empty() && sub_meshes.size() != model.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShardModel: ", model.size(), " parameters but ", placements.size(),
        " placement lists and ", sub_meshes.size(), " sub-meshes"));
  }
  LocalModel local;
  for (size_t i = 0; i < model.size(); ++i) {
    MUON_RETURN_IF_ERROR(
        local.AddShard(model[i], mesh, placements[i], rank,
                       sub_meshes.empty() ? SubMesh{} : sub_meshes[i]));
  }
  return local;
}

namespace {

std::string ResultPath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank", rank, ".result");
}

// One rank process: join the job, run the example, leave the result.
int RankMain(const Example& example, int world) {
  const int rank = absl::GetFlag(FLAGS_rank);
  ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.job_id = example.name;
  options.coordinator_address = absl::GetFlag(FLAGS_coordinator);
  options.embed_coordinator = rank == 0 && options.coordinator_address.empty();
  options.start_embedded_coordinator = StartEmbeddedCoordinator;
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg = InitProcessGroup(options);
  if (!pg.ok()) {
    std::fprintf(stderr, "example %s: rank %d: %s\n", example.name.c_str(),
                 rank, pg.status().ToString().c_str());
    return 1;
  }
  RankContext ctx;
  ctx.rank = rank;
  ctx.world_size = world;
  ctx.world = (*pg)->comm.get();
  ctx.coordinator = (*pg)->coordinator.get();
  ctx.incarnation = (*pg)->incarnation;
  absl::Status s = example.run(ctx);
  if (s.ok() && ctx.max_abs_diff < 0) {
    s = absl::InternalError(
        absl::StrCat("rank ", rank,
                     ": the example never compared its result with the "
                     "single-device run"));
  }
  // Every rank is done with the coordinator before rank 0 (its host) exits.
  if (s.ok()) s = ctx.world->Barrier();
  if (!s.ok()) {
    std::fprintf(stderr, "example %s: rank %d: %s\n", example.name.c_str(),
                 rank, s.ToString().c_str());
    return 1;
  }
  std::ofstream out(ResultPath(absl::GetFlag(FLAGS_out_dir), rank));
  out << ctx.max_abs_diff << " " << ctx.values_checked << "\n";
  return out.good() ? 0 : 1;
}

// The launcher: a tiny torchrun for `world` ranks of this binary.
int LaunchMain(const Example& example, int world) {
  const std::string& name = example.name;
  auto fail = [&](const std::string& why) {
    std::printf("example %s: FAILED (world %d: %s)\n", name.c_str(), world,
                why.c_str());
    std::fflush(stdout);
    return 1;
  };
  absl::StatusOr<std::string> dir = MakeTempDir("muon-example-" + name + "-");
  if (!dir.ok()) return fail(dir.status().ToString());
  const std::string self = SelfExecutable();
  const std::string port_file = *dir + "/coordinator.port";
  auto args = [&](int rank) {
    return std::vector<std::string>{self, absl::StrCat("--rank=", rank),
                                    absl::StrCat("--nproc=", world),
                                    "--out_dir=" + *dir};
  };
  RankLaunchOptions launch;
  launch.world_size = world;
  launch.argv = args;
  launch.port_file = port_file;
  launch.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  launch.grace = absl::Seconds(5);
  const absl::Status launched = LaunchRanks(launch);
  std::vector<std::string> failed;
  if (!launched.ok()) failed.push_back(std::string(launched.message()));
  double max_diff = 0;
  for (int r = 0; r < world && failed.empty(); ++r) {
    std::ifstream in(ResultPath(*dir, r));
    double d = -1;
    int64_t n = 0;
    if (!(in >> d >> n) || d < 0 || n <= 0) {
      failed.push_back(absl::StrCat("rank ", r, " left no result"));
    }
    max_diff = std::max(max_diff, d);
    std::remove(ResultPath(*dir, r).c_str());
  }
  std::remove(port_file.c_str());
  rmdir(dir->c_str());
  if (!failed.empty()) return fail(absl::StrJoin(failed, "; "));
  if (max_diff != 0) {
    return fail(absl::StrCat("max_abs_diff ", max_diff));
  }
  std::printf("example %s: OK (world %d, max_abs_diff %g)\n", name.c_str(),
              world, max_diff);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int ExampleMain(int argc, char** argv, const Example& example) {
  absl::ParseCommandLine(argc, argv);
  openblas_set_num_threads(1);  // every process, launcher included
  const int world = absl::GetFlag(FLAGS_nproc) > 0 ? absl::GetFlag(FLAGS_nproc)
                                                   : example.default_world;
  if (absl::GetFlag(FLAGS_rank) >= 0) return RankMain(example, world);
  return LaunchMain(example, world);
}

}  // namespace muon::examples
