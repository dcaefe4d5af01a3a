// Starting the step during backward (execution.overlap_backward,
// Muon::MarkReady): each rank marks its parameters ready last-to-first, as
// backward makes their gradients final, with work of its own in between;
// the buckets (ordered last matrix first) run on the executor's streams
// meanwhile. The result is bitwise the single device's and the same job's
// without overlap, in the sequential (debug) and the async schedule; a
// gradient changed after MarkReady is named in debug mode; with
// check_finite a NaN gradient on one rank fails the step on every rank and
// leaves everything as before it; the options it cannot run with are
// refused.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/distributed_world.h"
#include "tests/client/single_device_reference.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::CutShards;
using ::muon::testing::ExpectEachMatrixOrthogonalizedOnce;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::MatricesProblem;
using ::muon::testing::MeshConfig;
using ::muon::testing::OneDimLayout;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RunOnRanks;
using ::muon::testing::RunSingleDevice;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::World;
using ::testing::HasSubstr;

MuonOptions OverlapOptions() {
  MuonOptions o;
  o.lr = 0.02;
  o.check_finite = false;  // as unset under overlap_backward
  return o;
}

void Overlap(DistributedConfig& c, bool async) {
  c.execution.set_overlap_backward(true);
  c.execution.set_async_gpu_parallelism(async);
  c.execution.set_prefetch_count(async ? 1 : 0);
  c.execution.set_bucket_size_bytes(256);  // about one matrix per bucket
}

// A world of one with overlap_backward, for one whole parameter.
DistributedConfig OverlapConfigOfOne() {
  DistributedConfig config;
  config.state.mesh = Mesh::OneDim(1);
  config.state.param_placements = {ParamPlacement{{Placement::Replicate()}}};
  config.execution.set_overlap_backward(true);
  return config;
}

// Runs the problem's steps on 4 ranks with overlap_backward: per step each
// rank cuts its gradients, marks parameters ready from the last to the
// first with a little work between (a backward's layers), then steps.
// (*step_called)[rank][step]: when Step was called, seconds since the Unix
// epoch (as OpRecord's times). Rank `idle_rank` marks nothing and leaves
// every parameter to Step.
std::vector<absl::Status> RunOverlapped(
    const Problem& problem, const ProblemLayout& layout, bool async,
    World* world, std::vector<std::vector<double>>* step_called,
    int idle_rank = -1) {
  step_called->assign(world->size(), {});
  return RunOnRanks(world->size(), [&](int rank) -> absl::Status {
    MUON_ASSIGN_OR_RETURN(world->run.shards[rank],
                          CutShards(problem, layout, rank));
    MUON_RETURN_IF_ERROR(world->CreateMuon(
        rank, MeshConfig(layout), OverlapOptions(),
        [async](DistributedConfig& c) { Overlap(c, async); }));
    Muon& muon = *world->run.muons[rank];
    world->run.stats[rank].clear();
    const int n = static_cast<int>(muon.params().size());
    for (int step = 0; step < problem.steps(); ++step) {
      world->run.shards[rank].SetGrads(problem, step);
      for (int i = n - 1; i >= 0 && rank != idle_rank; --i) {
        absl::SleepFor(absl::Milliseconds(20));  // the layer's backward
        MUON_RETURN_IF_ERROR(muon.MarkReady(i));
      }
      (*step_called)[rank].push_back(
          absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
      MUON_RETURN_IF_ERROR(muon.Step());
      world->run.stats[rank].push_back(muon.last_step_stats());
    }
    return absl::OkStatus();
  });
}

// FSDP Shard(0) over 4 ranks, uneven and empty shards, one matrix per
// bucket: bitwise the single device (parameters and momentum on every
// rank), every matrix orthogonalized once; the plan's first bucket holds
// the last matrix.
TEST(OverlapBackwardTest,
     Step_MarkReadyLastToFirst_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, OverlapOptions());
  ASSERT_THAT(single, IsOk());
  const ProblemLayout fsdp =
      OneDimLayout(4, Placement::Shard(0), problem.specs.size());
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sequential");
    World world(4);
    ASSERT_TRUE(world.Connect());
    std::vector<std::vector<double>> step_called;
    const std::vector<absl::Status> st =
        RunOverlapped(problem, fsdp, async, &world, &step_called);
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    }
    ExpectShardsMatchSingleDevice(problem, *single, world.run);
    ExpectEachMatrixOrthogonalizedOnce(problem, *single, world.run);
    // The overlap itself: on every rank and step the first bucket's gather
    // started before Step was called (during the "backward").
    for (int r = 0; r < 4; ++r) {
      for (size_t k = 0; k < world.run.stats[r].size(); ++k) {
        double first_gather = 1e300;
        for (const OpRecord& op : world.run.stats[r][k].ops) {
          if (op.op == v1::OP_KIND_GATHER) {
            first_gather = std::min(first_gather, op.start_s);
          }
        }
        EXPECT_LT(first_gather, step_called[r][k])
            << "rank " << r << " step " << k + 1;
      }
    }
    const v1::Plan& plan = world.run.muons[0]->plan();
    ASSERT_GT(plan.buckets_size(), 1);
    EXPECT_THAT(plan.buckets(0).matrices(),
                ::testing::Contains(plan.matrices_size() - 1));
  }
}

// Without check_finite (overlap's default), a rank that marks nothing
// takes Step's whole path while its peers finish their begun steps: both
// make the same collectives (the buckets' exchanges, no agreement), so the
// run is still bitwise the single device's.
TEST(OverlapBackwardTest,
     Step_OneRankMarksNothingWithoutCheckFinite_MatchesSingleDeviceBitwise) {
  const Problem problem = MatricesProblem();
  const absl::StatusOr<SingleDeviceResult> single =
      RunSingleDevice(problem, OverlapOptions());
  ASSERT_THAT(single, IsOk());
  const ProblemLayout fsdp =
      OneDimLayout(4, Placement::Shard(0), problem.specs.size());
  World world(4);
  ASSERT_TRUE(world.Connect());
  std::vector<std::vector<double>> step_called;
  const std::vector<absl::Status> st =
      RunOverlapped(problem, fsdp, /*async=*/true, &world, &step_called,
                    /*idle_rank=*/3);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  }
  ExpectShardsMatchSingleDevice(problem, *single, world.run);
}

// Debug mode: a gradient written after its parameter was marked ready is
// reported by Step, naming the parameter (the step used the old values).
TEST(OverlapBackwardTest, Step_GradientChangedAfterMarkReady_NamedInDebugMode) {
  Parameter p;
  p.name = "layers.0.weight";
  p.local_shape = {6, 4};
  p.data = ::muon::testing::RandomValues(24, 1);
  p.grad = ::muon::testing::RandomValues(24, 2);
  const DistributedConfig config = OverlapConfigOfOne();
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&p}, OverlapOptions(), config);
  ASSERT_TRUE(muon.ok()) << muon.status();
  ASSERT_TRUE((*muon)->MarkReady(0).ok());
  EXPECT_THAT((*muon)->MarkReady(0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("marked ready twice")));
  // The executor's threads read the rule during the step.
  EXPECT_THAT((*muon)->SetParamHyperparameters(0, 0.5, 0.0, 0.95),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("before the first MarkReady")));
  p.grad[3] += 1.0f;
  EXPECT_THAT((*muon)->Step(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("the gradient of parameter "
                                 "\"layers.0.weight\" changed after "
                                 "MarkReady")));
  // The next step works as usual.
  ASSERT_TRUE((*muon)->MarkReady(0).ok());
  EXPECT_TRUE((*muon)->Step().ok());
}

// Runs a step expected to fail (`run`), its status into *failed.
// Internal when the step was counted or a parameter or its momentum
// changed: a failed step leaves everything as before it.
absl::Status FailedStepChangesNothing(Muon& muon,
                                      const std::vector<Parameter>& params,
                                      const std::function<absl::Status()>& run,
                                      absl::Status* failed) {
  const int n = static_cast<int>(params.size());
  const int64_t steps = muon.step_count();
  std::vector<std::vector<float>> data, momentum;
  for (int i = 0; i < n; ++i) {
    data.push_back(params[i].data);
    momentum.push_back(muon.momentum_buffer(i));
  }
  *failed = run();
  if (muon.step_count() != steps) {
    return absl::InternalError("the failed step was counted");
  }
  for (int i = 0; i < n; ++i) {
    if (params[i].data != data[i] || muon.momentum_buffer(i) != momentum[i]) {
      return absl::InternalError(
          absl::StrCat("parameter ", i, " or its momentum changed"));
    }
  }
  return absl::OkStatus();
}

// A job of 4 FSDP ranks (Shard(0)) with overlap_backward and check_finite
// whose step kBadStep fails: the problem, its single-device result
// (without check_finite, which changes no result), and per rank the
// failed step's status.
struct FailingStepJob {
  static constexpr int kBadStep = 1;
  // Rank `rank`'s backward: marks the parameters it marks (`bad`: in the
  // step and on the rank that break it) and may break their gradients.
  using Backward = std::function<absl::Status(
      int rank, Muon& muon, std::vector<Parameter>& params, bool bad)>;

  FailingStepJob()
      : problem(MatricesProblem()),
        fsdp(OneDimLayout(4, Placement::Shard(0), problem.specs.size())) {
    options = OverlapOptions();
    single = RunSingleDevice(problem, options);
    options.check_finite = true;
  }

  // Runs the job on `world` (Connect()ed): every step, each rank sets its
  // gradients, runs `backward` and steps; step kBadStep must fail changing
  // nothing on every rank (its status in failed[rank]). With
  // `coordinated` false the ranks run without the World's coordinator.
  // With `job_fails` the job ends after the failed step (a rank's own
  // failure fails a coordinated job), otherwise every step runs. Returns
  // each rank's error outside the failed step.
  std::vector<absl::Status> Run(World& world, bool async, bool coordinated,
                                bool job_fails, int bad_rank,
                                const Backward& backward) {
    failed.assign(4, absl::OkStatus());
    return RunOnRanks(4, [&](int rank) -> absl::Status {
      MUON_ASSIGN_OR_RETURN(world.run.shards[rank],
                            CutShards(problem, fsdp, rank));
      MUON_RETURN_IF_ERROR(world.CreateMuon(rank, MeshConfig(fsdp), options,
                                            [&](DistributedConfig& c) {
                                              Overlap(c, async);
                                              if (!coordinated)
                                                c.state.coordinator = nullptr;
                                            }));
      Muon& muon = *world.run.muons[rank];
      std::vector<Parameter>& params = world.params(rank);
      auto run_step = [&](int step, bool bad) -> absl::Status {
        world.run.shards[rank].SetGrads(problem, step);
        MUON_RETURN_IF_ERROR(backward(rank, muon, params, bad));
        return muon.Step();
      };
      for (int step = 0; step < problem.steps(); ++step) {
        if (step == kBadStep) {
          MUON_RETURN_IF_ERROR(FailedStepChangesNothing(
              muon, params, [&] { return run_step(step, rank == bad_rank); },
              &failed[rank]));
          if (job_fails) return absl::OkStatus();
        }
        MUON_RETURN_IF_ERROR(run_step(step, false));
      }
      return absl::OkStatus();
    });
  }

  Problem problem;
  ProblemLayout fsdp;
  MuonOptions options;
  absl::StatusOr<SingleDeviceResult> single;
  std::vector<absl::Status> failed;
};

// check_finite under overlap: in step 2 rank 2 marks a gradient holding a
// NaN mid-backward (the other buckets' collectives already under way);
// rank 3 marks nothing and leaves every parameter to Step. Step fails on
// every rank, naming rank 2 (rank 2 naming the parameter), with
// parameters, momentum and step count as before the step; step 2 then runs
// again with finite gradients, and the whole run is bitwise the single
// device's, which never saw the NaN.
TEST(OverlapBackwardTest,
     CheckFinite_NanOnOneRank_EveryRankFailsNothingChanged) {
  FailingStepJob job;
  ASSERT_THAT(job.single, IsOk());
  constexpr int kBadRank = 2;
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sequential");
    World world(4);
    ASSERT_TRUE(world.Connect());
    const std::vector<absl::Status> st = job.Run(
        world, async, /*coordinated=*/true, /*job_fails=*/false, kBadRank,
        [&](int rank, Muon& muon, std::vector<Parameter>& params, bool poison) {
          const int n = static_cast<int>(params.size());
          for (int i = n - 1; i >= 0 && rank != 3; --i) {
            if (poison && i == n / 2 && !params[i].grad.empty()) {
              params[i].grad.back() = std::nanf("");
            }
            MUON_RETURN_IF_ERROR(muon.MarkReady(i));
          }
          return absl::OkStatus();
        });
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
      EXPECT_THAT(job.failed[r],
                  StatusIs(absl::StatusCode::kFailedPrecondition,
                           HasSubstr(r == kBadRank ? "has a non-finite gradient"
                                                   : "rank 2 has a non-finite "
                                                     "gradient")))
          << "rank " << r;
    }
    ExpectShardsMatchSingleDevice(job.problem, *job.single, world.run);
  }
}

// With check_finite, a rank whose Step finds a parameter left without a
// gradient (after its peers' buckets ran) names it and every rank is as
// before the step. Without a coordinator the others fail in the agreement
// naming that rank, and the next steps are the single device's; with one,
// the rank's failure fails the job, naming it on every rank.
TEST(OverlapBackwardTest,
     CheckFinite_GradientMissingAtStep_EveryRankFailsNothingChanged) {
  FailingStepJob job;
  ASSERT_THAT(job.single, IsOk());
  constexpr int kBadRank = 1;
  // The bad rank marks all but its first parameter with a local shard,
  // whose gradient it drops before Step.
  const auto backward = [](int /*rank*/, Muon& muon,
                           std::vector<Parameter>& params,
                           bool drop) -> absl::Status {
    const int n = static_cast<int>(params.size());
    int dropped = -1;
    for (int i = 0; i < n && dropped < 0; ++i) {
      if (!params[i].data.empty()) dropped = i;
    }
    if (dropped < 0) return absl::InternalError("no local shard");
    for (int i = n - 1; i >= 0; --i) {
      if (drop && i == dropped) continue;
      MUON_RETURN_IF_ERROR(muon.MarkReady(i));
    }
    if (drop) params[dropped].grad.clear();
    return absl::OkStatus();
  };
  for (const bool coordinated : {false, true}) {
    for (const bool async : {false, true}) {
      SCOPED_TRACE(absl::StrCat(async ? "async" : "sequential",
                                coordinated ? ", coordinator" : ""));
      World world(4);
      ASSERT_TRUE(world.Connect());
      const std::vector<absl::Status> st =
          job.Run(world, async, coordinated, /*job_fails=*/coordinated,
                  kBadRank, backward);
      // A peer learns of it from the agreement or, when the coordinator
      // is quicker, from the job's failure.
      const auto from_agreement =
          HasSubstr("rank 1 could not check its gradients");
      const auto from_rank = HasSubstr(
          "rank 1: parameter \"layers.0.weight\" was marked ready without "
          "a gradient");
      for (int r = 0; r < 4; ++r) {
        ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
        EXPECT_FALSE(job.failed[r].ok()) << "rank " << r;
        if (r == kBadRank) {
          EXPECT_THAT(job.failed[r].message(), from_rank);
        } else if (coordinated) {
          EXPECT_THAT(job.failed[r].message(),
                      ::testing::AnyOf(from_agreement, from_rank))
              << "rank " << r;
        } else {
          EXPECT_THAT(job.failed[r].message(), from_agreement) << "rank " << r;
        }
      }
      EXPECT_THAT(job.failed[kBadRank].message(), HasSubstr("undone"));
      if (!coordinated) {
        ExpectShardsMatchSingleDevice(job.problem, *job.single, world.run);
      }
    }
  }
}

// A 4x4 parameter of ones with a gradient of halves.
Parameter FourByFour() {
  Parameter p;
  p.name = "w";
  p.local_shape = {4, 4};
  p.data.assign(16, 1.0f);
  p.grad.assign(16, 0.5f);
  return p;
}

// CPU parameters take no stream: MarkReadyOnStream with one is refused
// naming it, before the step begins (the parameter can still be marked).
TEST(OverlapBackwardTest,
     MarkReadyOnStream_CpuParams_InvalidArgumentNothingBegun) {
  Parameter p = FourByFour();
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(
      std::vector<Parameter*>{&p}, OverlapOptions(), OverlapConfigOfOne());
  ASSERT_TRUE(muon.ok()) << muon.status();
  int not_a_stream = 0;
  EXPECT_THAT((*muon)->MarkReadyOnStream(0, &not_a_stream),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rank 0: a stream was given for MarkReady but "
                                 "the parameters are on cpu")));
  EXPECT_THAT((*muon)->momentum_buffer(0), ::testing::Each(0.0f));
  ASSERT_TRUE((*muon)->MarkReadyOnStream(0, nullptr).ok());
  ASSERT_TRUE((*muon)->Step().ok());
  EXPECT_EQ((*muon)->step_count(), 1);
}

// Between MarkReady and Step the executor's threads write the momentum:
// Save, Load and load_state_dict are refused naming the call and change
// nothing (the step then ends as if they had not been called); after Step
// they work.
TEST(OverlapBackwardTest,
     SaveLoadDuringMarkedStep_FailedPreconditionUnchanged) {
  Parameter p = FourByFour();
  absl::StatusOr<std::unique_ptr<Muon>> muon = Muon::Create(
      std::vector<Parameter*>{&p}, OverlapOptions(), OverlapConfigOfOne());
  ASSERT_TRUE(muon.ok()) << muon.status();
  Muon& m = **muon;
  const std::string dir = ::testing::TempDir() + "overlap_save";
  ASSERT_TRUE(m.Save(dir).ok());  // step 0: zeros
  const OptimizerStateDict zeros = m.state_dict();
  ASSERT_TRUE(m.MarkReady(0).ok());
  ASSERT_TRUE(m.in_overlapped_step());
  const auto refused = [](absl::string_view what) {
    return StatusIs(absl::StatusCode::kFailedPrecondition,
                    HasSubstr(absl::StrCat("rank 0: ", what,
                                           " during a step begun by "
                                           "MarkReady")));
  };
  EXPECT_THAT(m.Save(dir), refused("Save"));
  EXPECT_THAT(m.Load(dir), refused("Load"));
  EXPECT_THAT(m.load_state_dict(zeros), refused("load_state_dict"));
  ASSERT_TRUE(m.Step().ok());
  EXPECT_EQ(m.step_count(), 1);
  EXPECT_THAT(m.momentum_buffer(0), ::testing::Not(::testing::Each(0.0f)));
  ASSERT_TRUE(m.Load(dir).ok());
  EXPECT_EQ(m.step_count(), 0);
  EXPECT_THAT(m.momentum_buffer(0), ::testing::Each(0.0f));
}

// A step begun by MarkReady keeps each parameter's gradient pointer for
// Nesterov's update from the moment it is made ready. A failed step
// (begun by parameter 2, failing at parameter 0, which has no gradient)
// never makes parameter 1 ready; its bucket still runs, and used to read
// step 1's gradient of parameter 1 through the pointer kept from then
// (freed memory in a trainer; NaN here). It forms the update from the
// momentum instead: everything stays finite.
TEST(OverlapBackwardTest,
     Step_FailedBeforeAParameterIsReady_NeverReadsItsLastStepGradient) {
  std::vector<Parameter> params(3, FourByFour());
  params[1].name = "v";
  params[2].name = "u";
  DistributedConfig config = OverlapConfigOfOne();
  config.state.param_placements.assign(
      3, ParamPlacement{{Placement::Replicate()}});
  absl::StatusOr<std::unique_ptr<Muon>> muon =
      Muon::Create(std::vector<Parameter*>{&params[0], &params[1], &params[2]},
                   OverlapOptions(), config);
  ASSERT_TRUE(muon.ok()) << muon.status();
  Muon& m = **muon;
  ASSERT_TRUE(m.options().nesterov);
  for (int i = 2; i >= 0; --i) ASSERT_TRUE(m.MarkReady(i).ok());
  ASSERT_TRUE(m.Step().ok());
  // Step 2: parameter 0 lost its gradient; parameter 1's old gradient
  // storage now holds NaN (as reused memory would hold anything).
  params[0].grad.clear();
  std::fill(params[1].grad.begin(), params[1].grad.end(),
            std::numeric_limits<float>::quiet_NaN());
  ASSERT_TRUE(m.MarkReady(2).ok());
  EXPECT_THAT(m.Step(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                 HasSubstr("\"w\" was marked ready without "
                                           "a gradient")));
  for (const Parameter& p : params) {
    for (float x : p.data) ASSERT_TRUE(std::isfinite(x)) << p.name;
  }
}

TEST(OverlapBackwardTest, Create_WithTransactional_Refused) {
  Parameter p;
  p.name = "w";
  p.local_shape = {4, 4};
  p.data.assign(16, 1.0f);
  MuonOptions o = OverlapOptions();
  o.transactional_step = true;
  const DistributedConfig config = OverlapConfigOfOne();
  EXPECT_THAT(Muon::Create(std::vector<Parameter*>{&p}, o, config),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("transactional_step")));
  absl::StatusOr<std::unique_ptr<Muon>> plain =
      Muon::Create(std::vector<Parameter*>{&p});
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT((*plain)->MarkReady(0),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("overlap_backward")));
}

}  // namespace
}  // namespace muon
