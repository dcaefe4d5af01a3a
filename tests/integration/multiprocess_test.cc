// Multi-process integration: 4 rank processes on loopback run Muon steps
// (via `muonctl validate`, which also runs the same steps single-device and
// compares bitwise), once with the coordinator embedded in rank 0 and once
// with a separate muon-coordinator daemon; then muonctl inspects the live
// daemon. Every process started here is stopped here, with a bound.
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command_util.h"
#include "tests/job_secret_env.h"
#include "tools/launcher.h"
#include "tools/npy.h"

namespace muon {
namespace {

using ::muon::testing::CommandResult;
using ::testing::HasSubstr;

// A command bounded by `timeout_s` (120 s unless given).
CommandResult RunCommand(const std::string& command, int timeout_s = 120) {
  return ::muon::testing::RunCommand(command, timeout_s);
}

std::string Spec(const std::string& name) {
  return absl::StrCat("tests/integration/specs/", name, ".json");
}

// A muon-coordinator daemon on 127.0.0.1, port picked by the kernel.
class Daemon {
 public:
  explicit Daemon(const std::string& job_id, int world_size) {
    absl::StatusOr<std::string> dir = MakeTempDir("daemon-");
    if (!dir.ok()) return;
    port_file_ = *dir + "/port";
    absl::StatusOr<pid_t> pid = SpawnProcess(
        {"server/muon-coordinator", "--port=0", "--port_file=" + port_file_,
         absl::StrCat("--world_size=", world_size), "--job_id=" + job_id});
    if (!pid.ok()) return;
    pid_ = *pid;
    absl::StatusOr<int> port =
        WaitForPortFile(port_file_, pid_, absl::Seconds(30));
    if (port.ok()) address_ = absl::StrCat("127.0.0.1:", *port);
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      WaitAll({pid_}, absl::Seconds(10));
    }
  }
  const std::string& address() const { return address_; }

 private:
  std::string port_file_;
  pid_t pid_ = -1;
  std::string address_;
};

class MultiProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MultiProcessTest,
       EmbeddedCoordinator_FourRanks_BitwiseEqualToSingleDevice) {
  CommandResult r =
      RunCommand(absl::StrCat("tools/muonctl validate --spec ",
                              Spec(GetParam()), " --steps 3 --seed 7"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("coordinator embedded in rank 0"));
  EXPECT_THAT(r.output, HasSubstr("max_abs_diff=0 tolerance=0"));
  EXPECT_THAT(r.output, HasSubstr(": OK")) << r.output;
}

TEST_P(MultiProcessTest, SeparateDaemon_FourRanks_BitwiseEqualToSingleDevice) {
  Daemon daemon(GetParam() == "fsdp_dim0"   ? "fsdp-dim0"
                : GetParam() == "fsdp_dim1" ? "fsdp-dim1"
                                            : GetParam(),
                4);
  ASSERT_FALSE(daemon.address().empty()) << "muon-coordinator did not start";
  CommandResult r = RunCommand(
      absl::StrCat("tools/muonctl validate --spec ", Spec(GetParam()),
                   " --steps 3 --seed 11 --coordinator ", daemon.address()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("coordinator ", daemon.address())));
  EXPECT_THAT(r.output, HasSubstr("max_abs_diff=0 tolerance=0"));
  EXPECT_THAT(r.output, HasSubstr(": OK")) << r.output;

  // The daemon still holds the job: muonctl reads it live.
  CommandResult status =
      RunCommand("tools/muonctl status --coordinator " + daemon.address());
  EXPECT_EQ(status.exit_code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("4/4 ranks joined"));
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(status.output, HasSubstr(absl::StrCat("\n", rank, " ")));
  }
  CommandResult assignments = RunCommand(
      "tools/muonctl assignments --json --coordinator " + daemon.address());
  EXPECT_EQ(assignments.exit_code, 0) << assignments.output;
  EXPECT_THAT(assignments.output, HasSubstr("\"ranks\""));

  // The ranks' step reports reached the daemon: timings, trace, schedule.
  CommandResult timings =
      RunCommand("tools/muonctl timings --coordinator " + daemon.address());
  EXPECT_EQ(timings.exit_code, 0) << timings.output;
  EXPECT_THAT(timings.output, HasSubstr("12 reports"));  // 4 ranks x 3 steps
  for (const char* op : {"gather", "redistribute", "apply", "step"}) {
    EXPECT_THAT(timings.output, HasSubstr(op));
  }
  const std::string trace_path =
      absl::StrCat(::testing::TempDir(), "/", GetParam(), ".trace.json");
  CommandResult trace =
      RunCommand(absl::StrCat("tools/muonctl trace --coordinator ",
                              daemon.address(), " --out ", trace_path));
  EXPECT_EQ(trace.exit_code, 0) << trace.output;
  EXPECT_THAT(trace.output, HasSubstr("of 3 steps on 4 ranks"));
  std::ifstream trace_file(trace_path);
  const std::string trace_json((std::istreambuf_iterator<char>(trace_file)),
                               std::istreambuf_iterator<char>());
  EXPECT_THAT(trace_json, HasSubstr("\"traceEvents\""));
  EXPECT_THAT(trace_json, HasSubstr("\"ph\":\"X\""));
  EXPECT_THAT(trace_json, HasSubstr("\"rank 3\""));
  CommandResult schedule =
      RunCommand("tools/muonctl schedule --coordinator " + daemon.address());
  EXPECT_EQ(schedule.exit_code, 0) << schedule.output;
  EXPECT_THAT(schedule.output, HasSubstr("g0@s0"));
  EXPECT_THAT(schedule.output, HasSubstr("rank 3\n"));
}

INSTANTIATE_TEST_SUITE_P(Layouts, MultiProcessTest,
                         ::testing::Values("fsdp_dim0", "fsdp_dim1", "ddp",
                                           "uneven"));

// Zero redundancy: the matrices and Newton-Schulz FLOPs orthogonalized, summed
// over the ranks, equal the single-device figures exactly.
void ExpectZeroRedundancy(const std::string& output) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      output, m,
      std::regex("matrices_orthogonalized distributed=([0-9]+) single=([0-9]+) "
                 "ns_flops distributed=([0-9]+) single=([0-9]+) ")))
      << output;
  EXPECT_EQ(m[1], m[2]) << "matrices orthogonalized over all ranks";
  EXPECT_EQ(m[3], m[4]) << "NS FLOPs over all ranks";
  EXPECT_GT(std::stoll(m[2]), 0);
}

// The shipped specs (examples/specs, one per parallelism layout), each
// bitwise equal to single-device with zero redundancy (the counts over all
// ranks equal the single-device counts).
class MatrixRowTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MatrixRowTest, Validate_ShippedSpec_BitwiseEqualAndZeroRedundancy) {
  CommandResult r =
      RunCommand(absl::StrCat("tools/muonctl validate --spec examples/specs/",
                              GetParam(), ".json --steps 3 --seed 5"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("max_abs_diff=0 tolerance=0"));
  ExpectZeroRedundancy(r.output);
  EXPECT_THAT(r.output, HasSubstr(": OK"));
}

INSTANTIATE_TEST_SUITE_P(
    SeedMatrix, MatrixRowTest,
    ::testing::Values("none_single_gpu", "ddp", "fsdp", "tp_dim_0", "tp_dim_1",
                      "hsdp", "tp_fsdp", "tp_hsdp", "ep_expert_parallel",
                      "ep_tp_tp_sharded_experts", "cp", "pp_2_stages",
                      "pp_4_stages", "pp_tp", "pp_fsdp", "ep_tp", "cp_tp",
                      "pp_tp_hsdp", "row_blocks"));

// `spec` with its mesh rescaled to `world` ranks: the pp dim keeps its number
// of stages (parameters stay on their stages) and the factor left is spread
// in powers of two over the other dims, innermost (tp) first. nullopt when
// `world` cannot be laid out that way (e.g. 8 ranks for a pp-only mesh).
std::optional<v1::JobSpec> RescaleMesh(v1::JobSpec spec, int world) {
  int fixed = 1;
  std::vector<int> free_dims;
  for (int d = 0; d < spec.mesh().dims_size(); ++d) {
    if (spec.mesh().dims(d).name() == "pp") {
      fixed *= spec.mesh().dims(d).size();
    } else {
      free_dims.push_back(d);
      spec.mutable_mesh()->mutable_dims(d)->set_size(1);
    }
  }
  if (world % fixed != 0) return std::nullopt;
  int factor = world / fixed;
  for (size_t k = 0; factor > 1 && !free_dims.empty(); ++k) {
    auto* dim = spec.mutable_mesh()->mutable_dims(
        free_dims[free_dims.size() - 1 - k % free_dims.size()]);
    dim->set_size(dim->size() * 2);
    factor /= 2;
  }
  if (factor != 1) return std::nullopt;
  return spec;
}

// Every row at world sizes 1, 2, 4 and 8 where its mesh can take them.
TEST_P(MatrixRowTest,
       Validate_RowAtWorldSizes1248_BitwiseEqualAndZeroRedundancy) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec(absl::StrCat("examples/specs/", GetParam(), ".json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::string> dir = MakeTempDir("rescaled-");
  ASSERT_TRUE(dir.ok());
  int ran = 0;
  for (int world : {1, 2, 4, 8}) {
    std::optional<v1::JobSpec> scaled = RescaleMesh(*spec, world);
    if (!scaled.has_value()) continue;
    SCOPED_TRACE(absl::StrCat("world ", world));
    const std::string path =
        absl::StrCat(*dir, "/", GetParam(), "_", world, ".json");
    std::ofstream(path) << JobSpecToJson(*scaled);
    CommandResult r = RunCommand(absl::StrCat(
        "tools/muonctl validate --spec ", path, " --steps 2 --seed ", world));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat("world=", world, " ")));
    EXPECT_THAT(r.output, HasSubstr("max_abs_diff=0 tolerance=0"));
    ExpectZeroRedundancy(r.output);
    std::remove(path.c_str());
    ++ran;
  }
  rmdir(dir->c_str());
  const bool pipeline_only =
      GetParam() == "pp_2_stages" || GetParam() == "pp_4_stages";
  EXPECT_GE(ran, pipeline_only ? 1 : 3) << "world sizes exercised";
}

TEST(MuonctlPlanTest, Plan_UnevenSpec_PrintsOwnersShapesAndBothPolicies) {
  CommandResult r = RunCommand("tools/muonctl plan --spec " + Spec("uneven"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[10, 7]"));
  EXPECT_THAT(r.output, HasSubstr("[3, 7] [1, 7]"));  // torch.chunk shards
  EXPECT_THAT(r.output,
              HasSubstr("[1, 9] (2/4)"));  // 2 ranks hold empty shards
  EXPECT_THAT(r.output, HasSubstr("policy lpt"));
  EXPECT_THAT(r.output, HasSubstr("policy round_robin"));
}

TEST(MuonctlPlanTest, Plan_Json_IsThePlanMessage) {
  CommandResult r =
      RunCommand("tools/muonctl plan --json --spec " + Spec("fsdp_dim0"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"matrices\""));
  EXPECT_THAT(r.output, HasSubstr("\"hash\""));
}

// Replays initial parameters and gradients from .npy files and dumps both
// runs' final parameters.
TEST(MuonctlValidateTest, Validate_InitAndGradsFromNpy_DumpsEqualParameters) {
  absl::StatusOr<std::string> dir = MakeTempDir("replay-");
  ASSERT_TRUE(dir.ok());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> params = {
      {"w1", {16, 12}},
      {"w2", {12, 20}},
      {"uneven", {10, 7}},
      {"small", {3, 5}}};
  const int steps = 2;
  ASSERT_EQ(mkdir((*dir + "/init").c_str(), 0755), 0);
  for (int s = 0; s < steps; ++s) {
    ASSERT_EQ(mkdir(absl::StrCat(*dir, "/grads/").c_str(), 0755) == 0 || s > 0,
              true);
    ASSERT_EQ(mkdir(absl::StrCat(*dir, "/grads/", s).c_str(), 0755), 0);
  }
  std::map<std::string, std::vector<float>> init;
  for (const auto& [name, shape] : params) {
    const int64_t n = shape[0] * shape[1];
    std::vector<float> w(n), g(n);
    for (int64_t i = 0; i < n; ++i)
      w[i] = 0.01f * static_cast<float>((i * 37) % 11 - 5);
    init[name] = w;
    ASSERT_TRUE(
        WriteNpy(absl::StrCat(*dir, "/init/", name, ".npy"), shape, w.data())
            .ok());
    for (int s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < n; ++i)
        g[i] = static_cast<float>((i * 13 + s * 7) % 17) - 8.0f;
      ASSERT_TRUE(WriteNpy(absl::StrCat(*dir, "/grads/", s, "/", name, ".npy"),
                           shape, g.data())
                      .ok());
    }
  }
  CommandResult r = RunCommand(
      absl::StrCat("tools/muonctl validate --spec ", Spec("fsdp_dim0"),
                   " --steps ", steps, " --init ", *dir, "/init --grads ", *dir,
                   "/grads --dump ", *dir, "/out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Progress per step, from rank 0 and from the single-device run.
  EXPECT_THAT(r.output, HasSubstr("distributed step 1/2 done"));
  EXPECT_THAT(r.output, HasSubstr("distributed step 2/2 done"));
  EXPECT_THAT(r.output, HasSubstr("single-device step 2/2 done"));
  for (const auto& [name, shape] : params) {
    absl::StatusOr<NpyArray> d =
        ReadNpy(absl::StrCat(*dir, "/out/distributed/", name, ".npy"));
    absl::StatusOr<NpyArray> s =
        ReadNpy(absl::StrCat(*dir, "/out/single/", name, ".npy"));
    ASSERT_TRUE(d.ok() && s.ok()) << name;
    EXPECT_EQ(d->shape, shape);
    EXPECT_EQ(d->data, s->data) << name;  // bitwise (no NaN here)
    EXPECT_NE(s->data, init[name]) << name << ": the steps changed nothing";
  }
  // A missing gradient file is an error naming it.
  ASSERT_EQ(std::remove(absl::StrCat(*dir, "/grads/1/w2.npy").c_str()), 0);
  CommandResult bad = RunCommand(absl::StrCat(
      "tools/muonctl validate --spec ", Spec("fsdp_dim0"), " --steps ", steps,
      " --init ", *dir, "/init --grads ", *dir, "/grads"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("grads/1/w2.npy"));
  // Checked before any rank process starts (the run's header line and the
  // ranks' progress never appear).
  EXPECT_THAT(bad.output, ::testing::Not(HasSubstr("rank processes")));
  EXPECT_THAT(bad.output, ::testing::Not(HasSubstr("distributed step")));
  // A file of the wrong shape likewise, naming both shapes.
  const std::vector<float> wrong(12 * 20 + 1, 0.0f);
  ASSERT_TRUE(
      WriteNpy(absl::StrCat(*dir, "/grads/1/w2.npy"), {1, 241}, wrong.data())
          .ok());
  bad = RunCommand(absl::StrCat(
      "tools/muonctl validate --spec ", Spec("fsdp_dim0"), " --steps ", steps,
      " --init ", *dir, "/init --grads ", *dir, "/grads"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("[1, 241]"));
  EXPECT_THAT(bad.output, ::testing::Not(HasSubstr("rank processes")));
}

TEST(MuonctlValidateTest, Validate_MissingSpec_FailsWithUsage) {
  CommandResult r = RunCommand("tools/muonctl validate --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--spec is required"));
}

// `muonctl validate --checkpoint_at J [--resume_spec FILE]`: run to step J,
// save (optimizer and parameters, safetensors per rank), load in fresh rank
// processes of another layout or world size, continue to K; bitwise equal
// to the uninterrupted single-device run.
struct ResumeCase {
  std::string name;
  std::string spec;
  std::string resume_spec;  // empty = the same layout
};

class CheckpointResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(CheckpointResumeTest,
       Validate_CheckpointAt2Of4_ResumedBitwiseEqualToUninterrupted) {
  const ResumeCase& c = GetParam();
  std::string command = absl::StrCat("tools/muonctl validate --spec ", c.spec,
                                     " --steps 4 --checkpoint_at 2");
  if (!c.resume_spec.empty()) command += " --resume_spec " + c.resume_spec;
  CommandResult r = RunCommand(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("checkpoint after step 2"));
  EXPECT_THAT(r.output, HasSubstr("max_abs_diff=0 "));
  EXPECT_THAT(r.output, HasSubstr("checkpoint_at=2: OK"));
}

INSTANTIATE_TEST_SUITE_P(
    Reshard, CheckpointResumeTest,
    ::testing::Values(ResumeCase{"FsdpOver4ToFsdpOver2",
                                 "examples/specs/fsdp.json",
                                 Spec("fsdp_over_2")},
                      ResumeCase{"FsdpToTpTimesFsdp",
                                 "examples/specs/fsdp.json",
                                 "examples/specs/tp_fsdp.json"},
                      ResumeCase{"DdpToFsdp", "examples/specs/ddp.json",
                                 "examples/specs/fsdp.json"},
                      ResumeCase{"ExpertStacksSameLayout",
                                 "examples/specs/ep_expert_parallel.json", ""},
                      ResumeCase{"PipelineStagesSameLayout",
                                 "examples/specs/pp_2_stages.json", ""}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) {
      return info.param.name;
    });

TEST(MuonctlCheckpointTest, Inspect_DumpedCheckpoint_ListsStepMeshAndShards) {
  absl::StatusOr<std::string> dir = MakeTempDir("muonctl-ckpt-");
  ASSERT_TRUE(dir.ok());
  CommandResult r = RunCommand(absl::StrCat(
      "tools/muonctl validate --spec examples/specs/tp_fsdp.json --steps 3 "
      "--checkpoint_at 1 --dump ",
      *dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  CommandResult inspect = RunCommand(absl::StrCat(
      "tools/muonctl checkpoint inspect ", *dir, "/checkpoint/optim"));
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_THAT(inspect.output, HasSubstr("version 1"));
  EXPECT_THAT(inspect.output, HasSubstr("step 1"));
  EXPECT_THAT(inspect.output, HasSubstr("mesh dp_shard=2 x tp=2"));
  EXPECT_THAT(inspect.output,
              HasSubstr("attn.wo.momentum_buffer: F32 [12, 10]"));
  EXPECT_THAT(inspect.output, HasSubstr("rank 3: box [6:12, 5:10], 120 bytes"));
  // A file cut short is named, with a non-zero exit.
  const std::string file = *dir + "/checkpoint/optim/rank_2.safetensors";
  ASSERT_EQ(truncate(file.c_str(), 100), 0);
  CommandResult bad = RunCommand(absl::StrCat(
      "tools/muonctl checkpoint inspect ", *dir, "/checkpoint/optim"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_THAT(bad.output, HasSubstr("rank_2.safetensors"));
  RunCommand("rm -rf " + *dir);
}

TEST(MuonctlCheckpointTest,
     Validate_ResumeSpecWithOtherParameters_InvalidArgument) {
  CommandResult r = RunCommand(
      "tools/muonctl validate --spec examples/specs/fsdp.json --steps 3 "
      "--checkpoint_at 1 --resume_spec examples/specs/pp_2_stages.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("--resume_spec examples/specs/pp_2_stages.json"));
}

TEST(MuonctlCheckpointTest, Validate_CheckpointAtLastStep_InvalidArgument) {
  CommandResult r = RunCommand(
      "tools/muonctl validate --spec examples/specs/fsdp.json --steps 3 "
      "--checkpoint_at 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output,
              HasSubstr("--checkpoint_at 3 must be between 1 and --steps - 1"));
}

}  // namespace
}  // namespace muon
