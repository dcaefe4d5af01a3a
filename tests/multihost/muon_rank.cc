// A rank program for the several-hosts test, started by muonrun (or alone
// with --single): runs K Muon steps on the layout of a job spec and writes
// its parameter shards, built on the pieces tools/validate.cc's RunSteps
// uses (LocalRanges, CreateMeshConfig, Muon over views), with the process
// group from torchrun's environment (ProcessGroupOptionsFromEnv: RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT; Gloo binds the address
// SelectGlooHost picks).
//
//   muonrun ... muon_rank --spec FILE --steps K --seed S --out_dir DIR
//     writes DIR/rank<r>_<i>.npy (the shard of spec parameter i) and
//     DIR/rank<r>.gloo_host (the address Gloo was given);
//   muon_rank --single --spec FILE --steps K --seed S --out_dir DIR
//     runs the same steps on one device: DIR/single_<i>.npy.
// Initial values and gradients are seeded functions of (seed, step,
// parameter), the same in every process. Exit code 0, or 1 with the error
// on stderr.
#include <cblas.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "server/embedded_coordinator.h"
#include "tools/npy.h"

ABSL_FLAG(std::string, spec, "", "Job spec (JSON).");
ABSL_FLAG(int, steps, 3, "Muon steps.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the initial values and gradients.");
ABSL_FLAG(std::string, out_dir, "", "Where to write the shards.");
ABSL_FLAG(bool, single, false, "Run on one device, without a process group.");
ABSL_FLAG(int, timeout_s, 60, "Bound on rendezvous and each collective.");

namespace muon {
namespace {

// Uniform in [-scale, scale), a pure function of (seed, step, param).
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

// The [rows.begin, rows.end) x [cols.begin, cols.end) block of a row-major
// [rows, cols] matrix.
std::vector<float> Block(const std::vector<float>& full, int64_t cols,
                         const Box& box) {
  std::vector<float> out;
  out.reserve(box.numel());
  for (int64_t r = box.rows.begin; r < box.rows.end; ++r) {
    for (int64_t c = box.cols.begin; c < box.cols.end; ++c) {
      out.push_back(full[r * cols + c]);
    }
  }
  return out;
}

absl::Status Run() {
  openblas_set_num_threads(1);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  const bool single = absl::GetFlag(FLAGS_single);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  MUON_ASSIGN_OR_RETURN(v1::JobSpec spec,
                        LoadJobSpec(absl::GetFlag(FLAGS_spec)));
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh mesh = MeshFromProto(spec.mesh());

  std::unique_ptr<ProcessGroup> pg;
  std::string gloo_host;
  int rank = 0;
  if (!single) {
    MUON_ASSIGN_OR_RETURN(ProcessGroupOptions pgo,
                          ProcessGroupOptionsFromEnv());
    if (pgo.world_size != mesh.world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("WORLD_SIZE=", pgo.world_size, " but the mesh ",
                       mesh.ToString(), " has ", mesh.world_size(), " ranks"));
    }
    pgo.job_id = spec.job_id().empty() ? "multihost" : spec.job_id();
    pgo.start_embedded_coordinator = StartEmbeddedCoordinator;
    pgo.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
    const char* ifname = getenv("GLOO_SOCKET_IFNAME");
    MUON_ASSIGN_OR_RETURN(
        gloo_host,
        SelectGlooHost(pgo.gloo_host, ifname == nullptr ? "" : ifname,
                       getenv("MASTER_ADDR") != nullptr ? getenv("MASTER_ADDR")
                                                        : "127.0.0.1"));
    MUON_ASSIGN_OR_RETURN(pg, InitProcessGroup(pgo));
    rank = pg->rank;
  }

  // This rank's shards (views of its own memory, as a trainer's tensors).
  std::vector<int> index;
  std::vector<Box> boxes;
  std::vector<std::vector<float>> data, grad;
  std::vector<ParamPlacement> placements;
  for (int i = 0; i < spec.params_size(); ++i) {
    const v1::ParamSpec& p = spec.params(i);
    if (p.shape_size() != 2 || !p.sub_mesh().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", p.name(),
                       "\": this test program takes 2-D "
                       "parameters without sub_mesh"));
    }
    Box box{Range{0, p.shape(0)}, Range{0, p.shape(1)}};
    if (!single) {
      MUON_ASSIGN_OR_RETURN(std::vector<Placement> pl,
                            ParsePlacements(p.placements(), p.name()));
      MUON_ASSIGN_OR_RETURN(
          box, LocalBox(p.shape(0), p.shape(1), pl, mesh, mesh.Coord(rank)));
      placements.push_back(ParamPlacement{pl, SubMesh{}});
    }
    index.push_back(i);
    boxes.push_back(box);
    data.push_back(Block(Synthetic(seed, -1, i, p.shape(0) * p.shape(1), 0.1),
                         p.shape(1), box));
    grad.emplace_back(box.numel());
  }
  std::vector<ParamView> views;
  for (size_t k = 0; k < index.size(); ++k) {
    const v1::ParamSpec& p = spec.params(index[k]);
    ParamView v;
    v.name = p.name();
    v.data = data[k].data();
    v.grad = grad[k].data();
    v.local_shape = {boxes[k].rows.size(), boxes[k].cols.size()};
    v.global_shape = {p.shape(0), p.shape(1)};
    views.push_back(std::move(v));
  }
  std::optional<DistributedConfig> config;
  if (!single) {
    MUON_ASSIGN_OR_RETURN(
        config, CreateMeshConfig(mesh, placements, pg->comm.get(),
                                 pg->coordinator.get(), pg->incarnation));
    // The spec's execution options (its device and gpu_precision set
    // MuonOptions' in Muon::Create).
    config->execution = spec.execution();
  }
  MUON_ASSIGN_OR_RETURN(MuonOptions options,
                        MuonOptionsFromProto(spec.optimizer()));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(views, options, config));
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    for (size_t k = 0; k < index.size(); ++k) {
      const v1::ParamSpec& p = spec.params(index[k]);
      const std::vector<float> g =
          Block(Synthetic(seed, step, index[k], p.shape(0) * p.shape(1), 1.0),
                p.shape(1), boxes[k]);
      std::copy(g.begin(), g.end(), grad[k].begin());
    }
    MUON_RETURN_IF_ERROR(opt->Step());
  }
  if (!single) MUON_RETURN_IF_ERROR(pg->comm->Barrier());
  for (size_t k = 0; k < index.size(); ++k) {
    const std::string path =
        single ? absl::StrCat(out_dir, "/single_", index[k], ".npy")
               : absl::StrCat(out_dir, "/rank", rank, "_", index[k], ".npy");
    MUON_RETURN_IF_ERROR(WriteNpy(
        path, {boxes[k].rows.size(), boxes[k].cols.size()}, data[k].data()));
  }
  if (!single) {
    std::ofstream(absl::StrCat(out_dir, "/rank", rank, ".gloo_host"))
        << gloo_host << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace muon

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = muon::Run();
  if (!s.ok()) {
    std::cerr << "muon_rank (RANK=" << (getenv("RANK") ? getenv("RANK") : "-")
              << "): " << s << "\n";
    return 1;
  }
  return 0;
}
