// Non-finite gradients (MuonOptions::check_finite, on by default): a NaN or
// Inf in any rank's gradient fails the step on every rank, before the
// momentum pass and before any data collective, with parameters and
// momentum unchanged everywhere; the error names the parameter, the rank
// and the step. Single device, bf16 gradients, and 4 thread ranks over Gloo
// with a NaN on one rank only.
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/parameter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/muon_update.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::RandomValues;
using ::muon::testing::RunOnRanks;
using ::muon::testing::ThreadWorld;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kFailedPrecondition =
    absl::StatusCode::kFailedPrecondition;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(FirstNonFiniteTest, FirstNonFinite_FindsFirstNanOrInf) {
  std::vector<float> x(10000, 1.0f);
  EXPECT_EQ(kernels::FirstNonFinite(x.data(), x.size()), -1);
  EXPECT_EQ(kernels::FirstNonFinite(x.data(), 0), -1);
  x[9000] = -kInf;
  x[5000] = kNaN;
  EXPECT_EQ(kernels::FirstNonFinite(x.data(), x.size()), 5000);
  x[5000] = std::numeric_limits<float>::max();  // finite
  x[4999] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(kernels::FirstNonFinite(x.data(), x.size()), 9000);
  std::vector<kernels::bf16_t> b(300, kernels::FloatToBf16(2.0f));
  EXPECT_EQ(kernels::FirstNonFinite(b.data(), b.size()), -1);
  b[257] = kernels::FloatToBf16(kInf);
  EXPECT_EQ(kernels::FirstNonFinite(b.data(), b.size()), 257);
}

// Two parameters of one rank (local shards of rows x 6 and rows x 4).
struct Params {
  Parameter a, b;
  Params(int64_t global_rows, int64_t local_rows, uint32_t seed) {
    a.name = "fc1.weight";
    a.global_shape = {global_rows, 6};
    a.local_shape = {local_rows, 6};
    a.data = RandomValues(local_rows * 6, seed);
    a.grad = RandomValues(local_rows * 6, seed + 1);
    b.name = "fc2.weight";
    b.global_shape = {global_rows, 4};
    b.local_shape = {local_rows, 4};
    b.data = RandomValues(local_rows * 4, seed + 2);
    b.grad = RandomValues(local_rows * 4, seed + 3);
  }
  std::vector<Parameter*> Pointers() { return {&a, &b}; }
};

// Bitwise snapshot of the parameters and momentum buffers.
struct Snapshot {
  std::vector<std::vector<float>> data, momentum;
  Snapshot(Params& p, const Muon& opt) {
    data = {p.a.data, p.b.data};
    momentum = {opt.momentum_buffer(0), opt.momentum_buffer(1)};
  }
  bool operator==(const Snapshot& o) const {
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() &&
             std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    for (size_t i = 0; i < data.size(); ++i) {
      if (!same(data[i], o.data[i]) || !same(momentum[i], o.momentum[i])) {
        return false;
      }
    }
    return true;
  }
};

TEST(MuonFiniteTest, Step_NanOrInfGradient_FailsNamingParamAndStepUnchanged) {
  Params p(8, 8, 1);
  absl::StatusOr<std::unique_ptr<Muon>> opt = Muon::Create(p.Pointers());
  ASSERT_THAT(opt, IsOk());
  ASSERT_THAT((*opt)->Step(), IsOk());  // momentum is nonzero from here
  for (float bad : {kNaN, kInf, -kInf}) {
    const Snapshot before(p, **opt);
    const float saved = p.b.grad[13];
    p.b.grad[13] = bad;
    EXPECT_THAT(
        (*opt)->Step(),
        StatusIs(kFailedPrecondition,
                 AllOf(HasSubstr("rank 0"), HasSubstr("\"fc2.weight\""),
                       HasSubstr("local index 13"), HasSubstr("at step 2"),
                       HasSubstr(std::isnan(bad) ? "nan" : "inf"))))
        << bad;
    EXPECT_TRUE(Snapshot(p, **opt) == before) << bad;
    EXPECT_EQ((*opt)->step_count(), 1);
    p.b.grad[13] = saved;
  }
  EXPECT_THAT((*opt)->Step(), IsOk());
  EXPECT_EQ((*opt)->step_count(), 2);
}

TEST(MuonFiniteTest, Step_CheckFiniteOff_NanPropagates) {
  Params p(8, 8, 1);
  MuonOptions o;
  o.check_finite = false;
  absl::StatusOr<std::unique_ptr<Muon>> opt = Muon::Create(p.Pointers(), o);
  ASSERT_THAT(opt, IsOk());
  p.a.grad[0] = kNaN;
  EXPECT_THAT((*opt)->Step(), IsOk());
  EXPECT_TRUE(std::isnan((*opt)->momentum_buffer(0)[0]));
}

TEST(MuonFiniteTest, Step_Bf16InfGradient_FailsUnchanged) {
  std::vector<float> w = RandomValues(6 * 5, 3);
  const std::vector<float> w0 = w;
  std::vector<kernels::bf16_t> g(6 * 5, kernels::FloatToBf16(0.5f));
  g[7] = kernels::FloatToBf16(kInf);
  ParamView v;
  v.name = "blocks.0.w";
  v.data = w.data();
  v.grad = g.data();
  v.grad_dtype = DType::kBFloat16;
  v.local_shape = {6, 5};
  v.global_shape = {6, 5};
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(std::vector<ParamView>{v});
  ASSERT_THAT(opt, IsOk());
  EXPECT_THAT((*opt)->Step(),
              StatusIs(kFailedPrecondition, AllOf(HasSubstr("\"blocks.0.w\""),
                                                  HasSubstr("local index 7"),
                                                  HasSubstr("at step 1"))));
  EXPECT_EQ(w, w0);
  EXPECT_EQ((*opt)->momentum_buffer(0), std::vector<float>(30, 0.0f));
}

// Rank `rank`'s optimizer over `p` (FSDP Shard(0) over the world's group),
// after one step, so that its momentum is nonzero.
absl::StatusOr<std::unique_ptr<Muon>> SteppedFsdpRank(ThreadWorld& world,
                                                      int rank, Params& p,
                                                      const MuonOptions& o) {
  AutoConfigOptions ao;
  ao.fsdp = world.comm(rank);
  ao.fsdp_shard_dim = 0;
  ao.coordinator = world.client(rank);
  absl::StatusOr<DistributedConfig> config =
      CreateAutoConfig(ViewsOf(p.Pointers()), ao);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(p.Pointers(), o, *std::move(config));
  if (!opt.ok()) return opt.status();
  if (absl::Status s = (*opt)->Step(); !s.ok()) return s;
  return opt;
}

TEST(MuonFiniteTest, Step_NanOnOneOfFourRanks_EveryRankFailsUnchanged) {
  constexpr int kWorld = 4;
  ThreadWorld world(kWorld);
  ASSERT_TRUE(world.Connect());
  std::vector<absl::Status> bad_step(kWorld), next_step(kWorld);
  // Not vector<bool>: each rank's thread writes its own element.
  std::vector<char> unchanged(kWorld, 0);
  std::vector<absl::Status> statuses =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        Params p(8, 2, 10 + 7 * rank);  // FSDP Shard(0): 2 rows per rank
        absl::StatusOr<std::unique_ptr<Muon>> opt =
            SteppedFsdpRank(world, rank, p, MuonOptions{});
        if (!opt.ok()) return opt.status();
        const Snapshot before(p, **opt);
        const float saved = p.a.grad[3];
        if (rank == 2) p.a.grad[3] = kNaN;
        bad_step[rank] = (*opt)->Step();
        unchanged[rank] = Snapshot(p, **opt) == before;
        p.a.grad[3] = saved;
        // The ranks are still in step: the next step runs everywhere.
        next_step[rank] = (*opt)->Step();
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_THAT(statuses[r], IsOk()) << "rank " << r;
    EXPECT_TRUE(unchanged[r]) << "rank " << r;
    EXPECT_THAT(next_step[r], IsOk()) << "rank " << r;
    if (r == 2) {
      EXPECT_THAT(bad_step[r],
                  StatusIs(kFailedPrecondition,
                           AllOf(HasSubstr("rank 2: parameter \"fc1.weight\""),
                                 HasSubstr("nan at local index 3"),
                                 HasSubstr("at step 2"))));
    } else {
      EXPECT_THAT(
          bad_step[r],
          StatusIs(kFailedPrecondition,
                   AllOf(HasSubstr(absl::StrCat("rank ", r,
                                                ": rank 2 "
                                                "has a non-finite")),
                         HasSubstr("parameter #0"), HasSubstr("at step 2"))))
          << "rank " << r;
    }
  }
}

// A rank whose step inputs are refused (a missing gradient, or the
// trainer's own check through RefuseStep) fails the step on every rank,
// before anything is modified and without any rank waiting out a
// collective: with check_finite the refusal rides on the finite check's
// agreement, without it on one of its own. The others name the rank;
// every rank then steps on together.
TEST(MuonFiniteTest, Step_RefusedOnOneOfFourRanks_EveryRankFailsUnchanged) {
  constexpr int kWorld = 4;
  struct Case {
    bool check_finite;
    bool refuse;  // RefuseStep on rank 1, else a missing gradient there
  };
  for (const Case c : {Case{true, false}, Case{false, false}, Case{true, true},
                       Case{false, true}}) {
    const bool check_finite = c.check_finite;
    ThreadWorld world(kWorld);
    ASSERT_TRUE(world.Connect());
    std::vector<absl::Status> bad_step(kWorld), next_step(kWorld);
    // Not vector<bool>: each rank's thread writes its own element.
    std::vector<char> unchanged(kWorld, 0);
    std::vector<absl::Status> statuses =
        RunOnRanks(kWorld, [&](int rank) -> absl::Status {
          Params p(8, 2, 10 + 7 * rank);  // FSDP Shard(0): 2 rows per rank
          MuonOptions o;
          o.check_finite = check_finite;
          absl::StatusOr<std::unique_ptr<Muon>> opt =
              SteppedFsdpRank(world, rank, p, o);
          if (!opt.ok()) return opt.status();
          const Snapshot before(p, **opt);
          std::vector<float> saved = p.b.grad;
          if (rank == 1 && !c.refuse) p.b.grad.clear();
          const absl::Time start = absl::Now();
          bad_step[rank] = rank == 1 && c.refuse
                               ? (*opt)->RefuseStep("gradient 1 is float64")
                               : (*opt)->Step();
          // Far below any collective or join timeout (minutes).
          if (absl::Now() - start > absl::Seconds(20)) {
            return absl::DeadlineExceededError("the refused step waited");
          }
          unchanged[rank] = Snapshot(p, **opt) == before;
          p.b.grad = std::move(saved);
          next_step[rank] = (*opt)->Step();
          return absl::OkStatus();
        });
    for (int r = 0; r < kWorld; ++r) {
      SCOPED_TRACE(absl::StrCat("check_finite ", check_finite, ", refuse ",
                                c.refuse, ", rank ", r));
      ASSERT_THAT(statuses[r], IsOk());
      EXPECT_TRUE(unchanged[r]);
      EXPECT_THAT(next_step[r], IsOk());
      if (r == 1) {
        EXPECT_THAT(
            bad_step[r],
            StatusIs(kFailedPrecondition,
                     HasSubstr(c.refuse ? "rank 1: gradient 1 is float64"
                                        : "rank 1: parameter \"fc2.weight\" "
                                          "has no gradient")));
      } else {
        EXPECT_THAT(
            bad_step[r],
            StatusIs(kFailedPrecondition,
                     AllOf(HasSubstr(absl::StrCat(
                               "rank ", r, ": rank 1 refused step 2's inputs")),
                           HasSubstr("unchanged on every rank"))));
      }
    }
  }
}

TEST(MuonLimitsTest, Create_HugeExpertStack_ReturnsInvalidArgument) {
  // A 3-D stack claiming 2^40 experts: an error naming the parameter, never
  // an allocation of 2^40 per-expert tables (bad_alloc, SIGABRT before).
  std::vector<float> w(4), g(4);
  ParamView v;
  v.name = "moe.experts.w1";
  v.data = w.data();
  v.grad = g.data();
  v.expert_stack = true;
  v.local_shape = {1, 2, 2};
  v.global_shape = {int64_t{1} << 40, 2, 2};
  EXPECT_THAT(Muon::Create(std::vector<ParamView>{v}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe.experts.w1")));
}

}  // namespace
}  // namespace muon
