// The rank program of the soak test (tests/soak/soak_test.cc,
// tools/soak.sh): Muon steps in a loop on a job spec's layout, with the
// process group from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, MUON_COORDINATOR naming a muon-coordinator daemon), sampling
// its own resident set size (/proc/self/status VmRSS) as it goes:
//
//   soak_rank --spec FILE --steps N --sample_every K --rss_file PATH
//
// appends "STEP RSS_KB" to PATH (flushed) after step 0 and after every K-th
// step (STEP counted from 1), and "end RSS_KB" after the last one. The
// gradients are a few seeded sets computed before the loop and taken in
// turn, so the loop itself allocates nothing of its own: whatever RSS grows
// is the library's (or the allocator's). Exit code 0, or 1 with the error
// on stderr. The process dies with its parent (PR_SET_PDEATHSIG), so a
// killed test leaves no rank behind.
#include <cblas.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "tests/soak/rss.h"

ABSL_FLAG(std::string, spec, "", "Job spec (JSON).");
ABSL_FLAG(int, steps, 10000, "Muon steps.");
ABSL_FLAG(int, sample_every, 1000, "Steps between RSS samples.");
ABSL_FLAG(std::string, rss_file, "", "Where to append the RSS samples.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial values and gradients.");
ABSL_FLAG(int, timeout_s, 60, "Bound on rendezvous and each collective.");

namespace muon {
namespace {

constexpr int kGradSets = 4;

// Uniform in [-scale, scale) over this rank's block of a [rows, cols]
// matrix, a pure function of (seed, set, param): the same in every process.
std::vector<float> Synthetic(uint64_t seed, int set, int param, int64_t cols,
                             const Box& box, double scale) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + set * 1000003ULL +
                      static_cast<uint64_t>(param) * 7919ULL + 17);
  std::vector<float> out;
  out.reserve(box.numel());
  for (int64_t r = 0; r < box.rows.end; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      if (r >= box.rows.begin && c >= box.cols.begin && c < box.cols.end) {
        out.push_back(static_cast<float>((2.0 * u - 1.0) * scale));
      }
    }
  }
  return out;
}

absl::Status Run() {
  openblas_set_num_threads(1);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int steps = absl::GetFlag(FLAGS_steps);
  const int sample_every = absl::GetFlag(FLAGS_sample_every);
  if (steps < 1 || sample_every < 1) {
    return absl::InvalidArgumentError(
        "--steps and --sample_every must be >= 1");
  }
  std::ofstream rss(absl::GetFlag(FLAGS_rss_file), std::ios::app);
  if (!rss) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open --rss_file ", absl::GetFlag(FLAGS_rss_file)));
  }
  MUON_ASSIGN_OR_RETURN(v1::JobSpec spec,
                        LoadJobSpec(absl::GetFlag(FLAGS_spec)));
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh mesh = MeshFromProto(spec.mesh());
  MUON_ASSIGN_OR_RETURN(ProcessGroupOptions pgo, ProcessGroupOptionsFromEnv());
  if (pgo.world_size != mesh.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE=", pgo.world_size, " but the mesh ",
                     mesh.ToString(), " has ", mesh.world_size(), " ranks"));
  }
  pgo.job_id = spec.job_id();
  pgo.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> pg,
                        InitProcessGroup(pgo));
  const int rank = pg->rank;

  std::vector<std::vector<float>> data, grad;
  std::vector<std::vector<std::vector<float>>> grad_sets(kGradSets);
  std::vector<ParamPlacement> placements;
  std::vector<ParamView> views;
  for (int i = 0; i < spec.params_size(); ++i) {
    const v1::ParamSpec& p = spec.params(i);
    if (p.shape_size() != 2 || !p.sub_mesh().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", p.name(),
                       "\": soak_rank takes 2-D parameters without sub_mesh"));
    }
    MUON_ASSIGN_OR_RETURN(std::vector<Placement> pl,
                          ParsePlacements(p.placements(), p.name()));
    MUON_ASSIGN_OR_RETURN(
        Box box, LocalBox(p.shape(0), p.shape(1), pl, mesh, mesh.Coord(rank)));
    placements.push_back(ParamPlacement{pl, SubMesh{}});
    data.push_back(Synthetic(seed, -1, i, p.shape(1), box, 0.1));
    grad.emplace_back(box.numel());
    for (int s = 0; s < kGradSets; ++s) {
      grad_sets[s].push_back(Synthetic(seed, s, i, p.shape(1), box, 1.0));
    }
    ParamView v;
    v.name = p.name();
    v.local_shape = {box.rows.size(), box.cols.size()};
    v.global_shape = {p.shape(0), p.shape(1)};
    views.push_back(std::move(v));
  }
  for (size_t k = 0; k < views.size(); ++k) {
    views[k].data = data[k].data();
    views[k].grad = grad[k].data();
  }
  MUON_ASSIGN_OR_RETURN(
      DistributedConfig config,
      CreateMeshConfig(mesh, placements, pg->comm.get(), pg->coordinator.get(),
                       pg->incarnation));
  // The spec's execution options (its device and gpu_precision set
  // MuonOptions' in Muon::Create).
  config.execution = spec.execution();
  MUON_ASSIGN_OR_RETURN(MuonOptions options,
                        MuonOptionsFromProto(spec.optimizer()));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                        Muon::Create(views, options, config));
  for (int step = 0; step < steps; ++step) {
    const std::vector<std::vector<float>>& g = grad_sets[step % kGradSets];
    for (size_t k = 0; k < grad.size(); ++k) {
      std::copy(g[k].begin(), g[k].end(), grad[k].begin());
    }
    MUON_RETURN_IF_ERROR(opt->Step());
    if (step == 0 || (step + 1) % sample_every == 0) {
      rss << (step + 1) << " " << ::muon::testing::RssKb() << std::endl;
    }
  }
  MUON_RETURN_IF_ERROR(pg->comm->Barrier());
  rss << "end " << ::muon::testing::RssKb() << std::endl;
  for (const std::vector<float>& d : data) {
    for (float x : d) {
      if (!std::isfinite(x)) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, ": non-finite parameter after ", steps, " steps"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace muon

int main(int argc, char** argv) {
  // Die with the parent (the soak test or tools/soak.sh's harness).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = muon::Run();
  if (!s.ok()) {
    std::cerr << "soak_rank (RANK=" << (getenv("RANK") ? getenv("RANK") : "-")
              << "): " << s << "\n";
    return 1;
  }
  return 0;
}
