// Muon checkpoints: state_dict / load_state_dict, Save / Load with
// resharding (FSDP over 4 -> over 2, FSDP -> TP x FSDP, DDP -> FSDP; with
// NorMuon's row state too), resume bitwise equal to an uninterrupted
// single-device run, and checkpoints that do not fit rejected with the
// optimizer untouched.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/blas_tiles.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using testing::BitwiseEqual;
using testing::RandomValues;

constexpr int kSteps = 4;

// Global parameter shapes, initial values and per-step gradients.
struct Problem {
  std::vector<std::string> names = {"w0", "w1", "w2"};
  std::vector<std::vector<int64_t>> shapes = {{10, 7}, {8, 12}, {5, 9}};
  std::vector<std::vector<float>> init;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][param]
  Problem() {
    for (size_t i = 0; i < shapes.size(); ++i) {
      init.push_back(RandomValues(shapes[i][0] * shapes[i][1], 40 + i));
    }
    for (int s = 0; s < kSteps; ++s) {
      grads.emplace_back();
      for (size_t i = 0; i < shapes.size(); ++i) {
        grads[s].push_back(
            RandomValues(shapes[i][0] * shapes[i][1], 500 + 10 * s + i));
      }
    }
  }
  Box Whole(size_t i) const {
    return Box{Range{0, shapes[i][0]}, Range{0, shapes[i][1]}};
  }
};

// A layout: a mesh and one placement list per parameter. A mesh of one
// rank runs the single-device path (no DistributedConfig).
struct Layout {
  Mesh mesh;
  std::vector<Placement> placements;  // the same for every parameter
};

MuonOptions Options() {
  MuonOptions o;
  o.lr = 0.02;
  return o;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

// Runs steps [from, to) of `problem` on `layout`, starting from the full
// parameters `*full` (the trainer's own model checkpoint) and, when
// `load_dir` is set, the optimizer state saved there; saves the optimizer
// state to `save_dir` after the last step when set; writes the full
// parameters back to `*full`. Returns the first rank's error.
absl::Status RunPhase(const Problem& problem, const Layout& layout, int from,
                      int to, std::vector<std::vector<float>>* full,
                      const std::string& load_dir, const std::string& save_dir,
                      const MuonOptions& options = Options()) {
  const int world = layout.mesh.world_size();
  const size_t np = problem.shapes.size();
  std::vector<std::vector<Box>> boxes(np);
  for (size_t i = 0; i < np; ++i) {
    MUON_ASSIGN_OR_RETURN(boxes[i],
                          AllBoxes(problem.shapes[i][0], problem.shapes[i][1],
                                   layout.placements, layout.mesh));
  }
  std::vector<std::vector<std::vector<float>>> w(world), g(world);
  std::unique_ptr<testing::ThreadWorld> tw;
  if (world > 1) {
    tw = std::make_unique<testing::ThreadWorld>(world);
    if (!tw->Connect()) return absl::InternalError("connect failed");
  }
  std::vector<absl::Status> st =
      testing::RunOnRanks(world, [&](int rank) -> absl::Status {
        std::vector<ParamView> views;
        w[rank].resize(np);
        g[rank].resize(np);
        for (size_t i = 0; i < np; ++i) {
          const Box& box = boxes[i][rank];
          w[rank][i].resize(box.numel());
          g[rank][i].resize(box.numel());
          CopyRegion((*full)[i].data(), problem.Whole(i), w[rank][i].data(),
                     box, box);
          ParamView v;
          v.name = problem.names[i];
          v.data = w[rank][i].data();
          v.grad = g[rank][i].data();
          v.local_shape = {box.rows.size(), box.cols.size()};
          v.global_shape = problem.shapes[i];
          views.push_back(v);
        }
        std::optional<DistributedConfig> config;
        if (world > 1) {
          std::vector<ParamPlacement> pls(np,
                                          ParamPlacement{layout.placements});
          MUON_ASSIGN_OR_RETURN(
              config, CreateMeshConfig(layout.mesh, pls, tw->comm(rank),
                                       tw->client(rank), rank + 1));
          config->state.rank = rank;
          config->state.world_size = world;
        }
        MUON_ASSIGN_OR_RETURN(std::unique_ptr<Muon> opt,
                              Muon::Create(views, options, config));
        if (!load_dir.empty()) MUON_RETURN_IF_ERROR(opt->Load(load_dir));
        if (opt->step_count() != from) {
          return absl::InternalError(
              absl::StrCat("step_count ", opt->step_count(), " != ", from));
        }
        for (int s = from; s < to; ++s) {
          for (size_t i = 0; i < np; ++i) {
            const Box& box = boxes[i][rank];
            CopyRegion(problem.grads[s][i].data(), problem.Whole(i),
                       g[rank][i].data(), box, box);
          }
          MUON_RETURN_IF_ERROR(opt->Step());
        }
        if (!save_dir.empty()) MUON_RETURN_IF_ERROR(opt->Save(save_dir));
        return absl::OkStatus();
      });
  for (const absl::Status& s : st) MUON_RETURN_IF_ERROR(s);
  for (size_t i = 0; i < np; ++i) {
    for (int r = 0; r < world; ++r) {
      CopyRegion(w[r][i].data(), boxes[i][r], (*full)[i].data(),
                 problem.Whole(i), boxes[i][r]);
    }
  }
  return absl::OkStatus();
}

Layout Single() { return {Mesh::OneDim(1), {Placement::Replicate()}}; }
Layout Fsdp(int n) {
  return {Mesh::OneDim(n, "dp_shard"), {Placement::Shard(0)}};
}
Layout Ddp(int n) {
  return {Mesh::OneDim(n, "dp_replicate"), {Placement::Replicate()}};
}
Layout TpFsdp() {
  return {Mesh{{"dp_shard", "tp"}, {2, 2}},
          {Placement::Shard(0), Placement::Shard(1)}};
}

// Uninterrupted single-device run of every step.
std::vector<std::vector<float>> Uninterrupted(
    const Problem& problem, const MuonOptions& options = Options()) {
  std::vector<std::vector<float>> full = problem.init;
  absl::Status s =
      RunPhase(problem, Single(), 0, kSteps, &full, "", "", options);
  EXPECT_TRUE(s.ok()) << s;
  return full;
}

// Runs to step 2 on `before`, saves, resumes on `after` from the checkpoint
// and runs to the end; expects the single-device uninterrupted bits.
void ExpectResumeBitwise(const Layout& before, const Layout& after,
                         const std::string& name,
                         const MuonOptions& options = Options()) {
  Problem problem;
  const std::vector<std::vector<float>> want = Uninterrupted(problem, options);
  std::vector<std::vector<float>> full = problem.init;
  const std::string dir = TempDir(name);
  ASSERT_TRUE(RunPhase(problem, before, 0, 2, &full, "", dir, options).ok());
  absl::Status s = RunPhase(problem, after, 2, kSteps, &full, dir, "", options);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(full[i], want[i])) << problem.names[i];
  }
}

TEST(MuonCheckpointTest, Resume_SingleDevice_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Single(), Single(), "single");
}

TEST(MuonCheckpointTest,
     Resume_FsdpOver4IntoFsdpOver2_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Fsdp(4), Fsdp(2), "fsdp4_fsdp2");
}

TEST(MuonCheckpointTest,
     Resume_FsdpIntoTpTimesFsdp_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Fsdp(4), TpFsdp(), "fsdp_tpfsdp");
}

TEST(MuonCheckpointTest, Resume_DdpIntoFsdp_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Ddp(2), Fsdp(4), "ddp_fsdp");
}

TEST(MuonCheckpointTest,
     Resume_FsdpIntoSingleDevice_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Fsdp(4), Single(), "fsdp_single");
}

MuonOptions NorMuonOptions() {
  MuonOptions o = Options();
  o.normuon = true;
  return o;
}

Layout Tp(int n) { return {Mesh::OneDim(n, "tp"), {Placement::Shard(1)}}; }

// NorMuon's row state is saved as "<param>.row_state" ([rows, 1],
// sharded with the rows, replicated over a mesh dim sharding the columns)
// and resharded on load: the resumed run keeps the uninterrupted bits
// (without the row state it would not: v starts again from zeros).
TEST(MuonCheckpointTest,
     Resume_NorMuonFsdpIntoTpTimesFsdp_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Fsdp(4), TpFsdp(), "normuon_fsdp_tpfsdp",
                      NorMuonOptions());
}

TEST(MuonCheckpointTest,
     Resume_NorMuonTpIntoFsdpOver2_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Tp(4), Fsdp(2), "normuon_tp_fsdp2", NorMuonOptions());
}

TEST(MuonCheckpointTest,
     Resume_NorMuonFsdpIntoSingleDevice_BitwiseEqualsUninterrupted) {
  ExpectResumeBitwise(Fsdp(4), Single(), "normuon_fsdp_single",
                      NorMuonOptions());
}

// Steps [from, to) of `problem` on one device over weights `w` with
// `opt` (its views point into `w` and `g`).
void StepSingle(const Problem& problem, int from, int to,
                std::vector<std::vector<float>>* g, Muon* opt) {
  for (int s = from; s < to; ++s) {
    *g = problem.grads[s];
    ASSERT_TRUE(opt->Step().ok());
  }
}

std::unique_ptr<Muon> SingleNorMuon(const Problem& problem,
                                    std::vector<std::vector<float>>* w,
                                    std::vector<std::vector<float>>* g) {
  std::vector<ParamView> views;
  for (size_t i = 0; i < w->size(); ++i) {
    ParamView v;
    v.name = problem.names[i];
    v.data = (*w)[i].data();
    v.grad = (*g)[i].data();
    v.local_shape = problem.shapes[i];
    views.push_back(v);
  }
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(views, NorMuonOptions());
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

// state_dict carries the row state and load_state_dict restores it: a
// resumed run keeps the uninterrupted bits, and the same resume with the
// row state zeroed ends elsewhere (so the resume tests above do not pass
// vacuously). A row state of the wrong size is refused, naming it.
TEST(MuonCheckpointTest, LoadStateDict_NorMuonRowState_RestoredAndNeeded) {
  Problem problem;
  const std::vector<std::vector<float>> want =
      Uninterrupted(problem, NorMuonOptions());
  std::vector<std::vector<float>> w = problem.init, g = problem.grads[0];
  std::unique_ptr<Muon> first = SingleNorMuon(problem, &w, &g);
  ASSERT_NE(first, nullptr);
  StepSingle(problem, 0, 2, &g, first.get());
  const OptimizerStateDict sd = first->state_dict();
  ASSERT_EQ(sd.params[0].row_state.size(), 10u);  // one per row
  OptimizerStateDict zeroed = sd;
  for (ParamState& ps : zeroed.params) {
    ps.row_state.assign(ps.row_state.size(), 0.0f);
  }
  std::vector<std::vector<bool>> differs;
  for (const OptimizerStateDict* state :
       std::vector<const OptimizerStateDict*>{&sd, &zeroed}) {
    std::vector<std::vector<float>> w2 = w, g2 = g;
    std::unique_ptr<Muon> opt = SingleNorMuon(problem, &w2, &g2);
    ASSERT_NE(opt, nullptr);
    ASSERT_TRUE(opt->load_state_dict(*state).ok());
    StepSingle(problem, 2, kSteps, &g2, opt.get());
    differs.emplace_back();
    for (size_t i = 0; i < want.size(); ++i) {
      differs.back().push_back(!BitwiseEqual(w2[i], want[i]));
    }
  }
  EXPECT_EQ(differs[0], std::vector<bool>(want.size(), false));
  EXPECT_NE(differs[1], std::vector<bool>(want.size(), false));

  OptimizerStateDict bad = sd;
  bad.params[1].row_state.pop_back();
  const std::vector<float> before = first->row_state(1);
  EXPECT_THAT(first->load_state_dict(bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("variance_neuron of 7 values "
                                            "(expected 8")));
  EXPECT_TRUE(BitwiseEqual(first->row_state(1), before));
}

// A single-device optimizer over problem.init (views into `w`, `g`).
struct SingleOptimizer {
  Problem problem;
  std::vector<std::vector<float>> w = problem.init, g = problem.grads[0];
  std::unique_ptr<Muon> opt;
  explicit SingleOptimizer(std::vector<std::vector<int64_t>> shapes = {}) {
    if (!shapes.empty()) problem.shapes = shapes;
    std::vector<ParamView> views;
    for (size_t i = 0; i < w.size(); ++i) {
      ParamView v;
      v.name = problem.names[i];
      v.data = w[i].data();
      v.grad = g[i].data();
      v.local_shape = problem.shapes[i];
      views.push_back(v);
    }
    opt = *Muon::Create(views, Options());
  }
};

// A NorMuon checkpoint loaded into a plain Muon would drop its row state
// silently and go on as another optimizer: refused naming the tensor, and
// nothing loaded. The same checkpoint resumes a NorMuon optimizer.
TEST(MuonCheckpointTest, Load_NorMuonCheckpointIntoPlainMuon_RefusedUntouched) {
  Problem problem;
  const std::string dir = TempDir("normuon_into_plain");
  {
    std::vector<std::vector<float>> w = problem.init, g = problem.grads[0];
    std::unique_ptr<Muon> normuon = SingleNorMuon(problem, &w, &g);
    ASSERT_NE(normuon, nullptr);
    StepSingle(problem, 0, 2, &g, normuon.get());
    ASSERT_TRUE(normuon->Save(dir).ok());
  }
  SingleOptimizer plain;
  ASSERT_TRUE(plain.opt->Step().ok());
  const OptimizerStateDict before = plain.opt->state_dict();
  EXPECT_THAT(
      plain.opt->Load(dir),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               ::testing::AllOf(
                   ::testing::HasSubstr("rank 0: loading \"w0\": the "
                                        "checkpoint holds \"w0.variance_"
                                        "neuron\""),
                   ::testing::HasSubstr("without a variant such as normuon"))));
  const OptimizerStateDict after = plain.opt->state_dict();
  EXPECT_EQ(after.step, before.step);
  for (size_t i = 0; i < before.params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(after.params[i].momentum_buffer,
                             before.params[i].momentum_buffer));
  }
  std::vector<std::vector<float>> w = problem.init, g = problem.grads[0];
  std::unique_ptr<Muon> resumed = SingleNorMuon(problem, &w, &g);
  ASSERT_NE(resumed, nullptr);
  EXPECT_TRUE(resumed->Load(dir).ok());
  EXPECT_EQ(resumed->step_count(), 2);
}

// A step count past 2^62 would overflow the counter a step increments.
TEST(MuonCheckpointTest, LoadStateDict_StepPastLimit_InvalidArgumentUntouched) {
  SingleOptimizer s;
  OptimizerStateDict sd = s.opt->state_dict();
  sd.step = kMaxCheckpointStep + 1;
  EXPECT_THAT(s.opt->load_state_dict(sd),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(
                           "rank 0: load_state_dict: step 4611686018427387905 "
                           "is outside [0, 4611686018427387904]")));
  sd.step = -1;
  EXPECT_THAT(s.opt->load_state_dict(sd),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("step -1 is outside")));
  EXPECT_EQ(s.opt->step_count(), 0);
  sd.step = kMaxCheckpointStep;
  EXPECT_TRUE(s.opt->load_state_dict(sd).ok());
  EXPECT_EQ(s.opt->step_count(), kMaxCheckpointStep);
}

TEST(MuonCheckpointTest, Load_MissingParameter_NotFoundAndUntouched) {
  // Saved by an optimizer without "w2".
  const std::string dir = TempDir("missing");
  {
    Problem p;
    std::vector<float> w = p.init[0], g = p.grads[0][0];
    ParamView v;
    v.name = "w0";
    v.data = w.data();
    v.grad = g.data();
    v.local_shape = p.shapes[0];
    auto opt = Muon::Create({v}, Options());
    ASSERT_TRUE(opt.ok());
    ASSERT_TRUE((*opt)->Step().ok());
    ASSERT_TRUE((*opt)->Save(dir).ok());
  }
  SingleOptimizer s;
  ASSERT_TRUE(s.opt->Step().ok());
  const OptimizerStateDict before = s.opt->state_dict();
  absl::Status st = s.opt->Load(dir);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kNotFound, ::testing::_));
  EXPECT_NE(st.message().find("w1"), std::string::npos) << st;
  const OptimizerStateDict after = s.opt->state_dict();
  EXPECT_EQ(after.step, before.step);
  for (size_t i = 0; i < before.params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(after.params[i].momentum_buffer,
                             before.params[i].momentum_buffer));
  }
}

// Checkpoints record the CPU kernel set (the bits depend on it); a load
// under another one goes ahead and warns naming both, the same one stays
// silent.
TEST(MuonCheckpointTest, Save_RecordsCpuKernels_LoadOnOtherKernelsWarns) {
  const std::string dir = TempDir("kernels");
  SingleOptimizer saved;
  ASSERT_TRUE(saved.opt->Step().ok());
  ASSERT_TRUE(saved.opt->Save(dir).ok());
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::string here = kernels::BlasCoreName();
  EXPECT_EQ((*reader)->metadata().blas_core, here);

  SingleOptimizer same;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(same.opt->Load(dir).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("warning"),
            std::string::npos);

  // The same checkpoint as if written on another core type.
  const std::string path = dir + "/metadata.json";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find(here);
  ASSERT_NE(at, std::string::npos) << text.substr(0, 400);
  const std::string other = "Haswell (OpenBLAS 0.0 elsewhere)";
  text.replace(at, here.size(), other);
  std::ofstream(path, std::ios::trunc) << text;
  SingleOptimizer resumed;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(resumed.opt->Load(dir).ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(other), std::string::npos) << err;
  EXPECT_NE(err.find(here), std::string::npos) << err;
  EXPECT_EQ(resumed.opt->step_count(), 1);
}

TEST(MuonCheckpointTest, Load_OtherGlobalShape_InvalidArgumentNamingBoth) {
  const std::string dir = TempDir("shape");
  SingleOptimizer saved;
  ASSERT_TRUE(saved.opt->Step().ok());
  ASSERT_TRUE(saved.opt->Save(dir).ok());
  SingleOptimizer other({{10, 7}, {8, 12}, {9, 5}});
  absl::Status st = other.opt->Load(dir);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_NE(st.message().find("w2"), std::string::npos) << st;
  EXPECT_EQ(other.opt->step_count(), 0);
}

TEST(MuonCheckpointTest, Load_TruncatedFile_DataLossNamingFile) {
  const std::string dir = TempDir("truncated");
  SingleOptimizer saved;
  ASSERT_TRUE(saved.opt->Step().ok());
  ASSERT_TRUE(saved.opt->Save(dir).ok());
  const std::string file = dir + "/rank_0.safetensors";
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size() - 16);
  }
  SingleOptimizer fresh;
  absl::Status st = fresh.opt->Load(dir);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rank_0.safetensors"), std::string::npos) << st;
  EXPECT_EQ(fresh.opt->step_count(), 0);
  EXPECT_EQ(fresh.opt->momentum_buffer(0), std::vector<float>(70, 0.0f));
}

TEST(MuonCheckpointTest, LoadStateDict_OtherBox_InvalidArgumentAndUntouched) {
  SingleOptimizer s;
  ASSERT_TRUE(s.opt->Step().ok());
  OptimizerStateDict sd = s.opt->state_dict();
  EXPECT_EQ(sd.step, 1);
  ASSERT_EQ(sd.params.size(), 3u);
  EXPECT_EQ(sd.params[1].name, "w1");
  EXPECT_EQ(sd.params[1].global_shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(sd.params[1].placements, std::vector<std::string>{"Replicate()"});
  OptimizerStateDict bad = sd;
  bad.params[2].box[0].end = 3;
  bad.step = 9;
  for (float& x : bad.params[0].momentum_buffer) x = 1.0f;
  absl::Status st = s.opt->load_state_dict(bad);
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_NE(st.message().find("\"w2\""), std::string::npos) << st;
  EXPECT_EQ(s.opt->step_count(), 1);
  EXPECT_TRUE(
      BitwiseEqual(s.opt->momentum_buffer(0), sd.params[0].momentum_buffer));
  // The right one loads.
  sd.step = 7;
  EXPECT_TRUE(s.opt->load_state_dict(sd).ok());
  EXPECT_EQ(s.opt->step_count(), 7);
}

}  // namespace
}  // namespace muon
