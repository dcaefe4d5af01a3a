// MuonOptions::transactional_step: when a step fails on any rank, every
// rank's parameters (fp32 and bf16), momentum buffers and step count are
// bitwise as before the step, and the next successful step gives the same
// numbers as a run that never failed. FSDP Shard(0) over 4 thread ranks
// (Gloo on 127.0.0.1, one in-process coordinator). Faults are injected
// through Muon::SetPostUpdateFaultForTesting (this rank fails after its
// parameters were updated, past the last data collective) and through a
// communicator wrapper that fails one rank's collective.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/tensor_view.h"
#include "comm/communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/ns_engine.h"
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

constexpr int kWorld = 4;
constexpr int kFaultRank = 2;

// Forwards to another communicator; once armed, fails this rank's n-th
// call of one collective (counted from Arm) with Internal, before
// forwarding it (the peers are left waiting in theirs) or after (the peers'
// call completed).
class FaultyCommunicator : public Communicator {
 public:
  explicit FaultyCommunicator(Communicator* inner) : inner_(inner) {}
  void Arm(std::string op, int n, bool after_forwarding) {
    op_ = std::move(op);
    countdown_ = n;
    after_ = after_forwarding;
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  absl::Status AllToAllV(const float* send,
                         const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override {
    return Call("AllToAllV", [&] {
      return inner_->AllToAllV(send, send_counts, recv, recv_counts);
    });
  }
  absl::Status AllGatherV(const float* send, int64_t send_count, float* recv,
                          const std::vector<int64_t>& recv_counts) override {
    return Call("AllGatherV", [&] {
      return inner_->AllGatherV(send, send_count, recv, recv_counts);
    });
  }
  absl::Status Broadcast(float* data, int64_t count, int root) override {
    return inner_->Broadcast(data, count, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort() override { inner_->Abort(); }

 private:
  absl::Status Call(const char* op, const std::function<absl::Status()>& fn) {
    if (op_ != op || countdown_-- != 0) return fn();
    if (after_) {
      if (absl::Status s = fn(); !s.ok()) return s;
    }
    return absl::InternalError(
        absl::StrCat("rank ", rank(), ": injected ", op, " failure"));
  }

  Communicator* inner_;  // Not owned.
  std::string op_;
  int countdown_ = -1;
  bool after_ = false;
};

// One rank's two FSDP Shard(0) parameters (global [8, 6] and [8, 4], 2
// rows per rank) in fp32 or bf16, with fp32 gradients.
struct Shards {
  DType dtype;
  std::vector<std::vector<char>> data;  // raw bytes of each local shard
  std::vector<std::vector<float>> grad;
  Shards(DType dt, int rank) : dtype(dt) {
    const int64_t cols[2] = {6, 4};
    for (int i = 0; i < 2; ++i) {
      const int64_t n = 2 * cols[i];
      const uint32_t seed = 10 + 7 * rank + 3 * i;
      std::vector<float> v = RandomValues(n, seed);
      data.emplace_back(n * DTypeSize(dt));
      for (int64_t k = 0; k < n; ++k) {
        if (dt == DType::kBFloat16) {
          const kernels::bf16_t b = kernels::FloatToBf16(v[k]);
          std::memcpy(data[i].data() + 2 * k, &b, 2);
        } else {
          std::memcpy(data[i].data() + 4 * k, &v[k], 4);
        }
      }
      grad.push_back(RandomValues(n, seed + 1));
    }
  }
  std::vector<ParamView> Views() {
    std::vector<ParamView> views(2);
    const int64_t cols[2] = {6, 4};
    for (int i = 0; i < 2; ++i) {
      views[i].name = i == 0 ? "fc1.weight" : "fc2.weight";
      views[i].data = data[i].data();
      views[i].grad = grad[i].data();
      views[i].dtype = dtype;
      views[i].local_shape = {2, cols[i]};
      views[i].global_shape = {8, cols[i]};
    }
    return views;
  }
};

// What a rank can observe of the optimizer: parameter bytes, momentum
// (state_dict) and the step count.
struct Observed {
  std::vector<std::vector<char>> data;
  std::vector<std::vector<float>> momentum;
  int64_t step = -1;
  Observed() = default;
  Observed(const Shards& s, const Muon& opt) : data(s.data) {
    const OptimizerStateDict sd = opt.state_dict();
    for (const ParamState& p : sd.params) momentum.push_back(p.momentum_buffer);
    step = opt.step_count();
  }
  bool operator==(const Observed& o) const {
    if (step != o.step || data.size() != o.data.size() ||
        momentum.size() != o.momentum.size()) {
      return false;
    }
    for (size_t i = 0; i < data.size(); ++i) {
      if (data[i] != o.data[i]) return false;  // bytes: bitwise
      if (momentum[i].size() != o.momentum[i].size() ||
          std::memcmp(momentum[i].data(), o.momentum[i].data(),
                      momentum[i].size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  }
};

// The scenario every test runs on 4 ranks: step 1 succeeds; step 2 is
// given `arm` (fault injection, per rank; none = no faulty step); then one
// more step succeeds. `arm` == nullptr: the reference run (steps 1 and 2
// succeed).
struct RankOutcome {
  absl::Status faulty_step;  // step 2's status
  Observed before;           // just before step 2
  Observed after_fault;      // just after step 2
  Observed final;            // after the last step
  absl::Status last_step;
};

using ArmFn = std::function<void(int rank, Muon& opt, FaultyCommunicator& c)>;

std::vector<RankOutcome> RunScenario(DType dtype, bool transactional,
                                     const ArmFn& arm,
                                     bool coordinated = true) {
  ThreadWorld world(kWorld);
  EXPECT_TRUE(world.Connect());
  std::vector<RankOutcome> out(kWorld);
  std::vector<absl::Status> statuses =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        Shards s(dtype, rank);
        FaultyCommunicator comm(world.comm(rank));
        AutoConfigOptions ao;
        ao.fsdp = &comm;
        ao.fsdp_shard_dim = 0;
        ao.coordinator = coordinated ? world.client(rank) : nullptr;
        absl::StatusOr<DistributedConfig> config =
            CreateAutoConfig(s.Views(), ao);
        if (!config.ok()) return config.status();
        MuonOptions o;
        o.transactional_step = transactional;
        absl::StatusOr<std::unique_ptr<Muon>> opt =
            Muon::Create(s.Views(), o, *std::move(config));
        if (!opt.ok()) return opt.status();
        Muon& m = **opt;
        if (absl::Status st = m.Step(); !st.ok()) return st;
        RankOutcome& r = out[rank];
        if (arm != nullptr) {
          r.before = Observed(s, m);
          arm(rank, m, comm);
          r.faulty_step = m.Step();
          r.after_fault = Observed(s, m);
          m.SetPostUpdateFaultForTesting(nullptr);
        }
        r.last_step = m.Step();
        r.final = Observed(s, m);
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_THAT(statuses[r], IsOk()) << "rank " << r;
  }
  return out;
}

// Rank 2 fails step 2 after its parameters were updated (past the last
// data collective).
void FailAfterUpdateOnRank2(int rank, Muon& opt, FaultyCommunicator&) {
  if (rank != kFaultRank) return;
  opt.SetPostUpdateFaultForTesting([](int64_t step) {
    return absl::InternalError(
        absl::StrCat("injected apply failure at step ", step));
  });
}

void ExpectEveryRankRolledBackThenMatchesReference(DType dtype) {
  const std::vector<RankOutcome> faulty =
      RunScenario(dtype, /*transactional=*/true, FailAfterUpdateOnRank2);
  const std::vector<RankOutcome> reference =
      RunScenario(dtype, /*transactional=*/true, nullptr);
  for (int r = 0; r < kWorld; ++r) {
    const RankOutcome& f = faulty[r];
    if (r == kFaultRank) {
      EXPECT_THAT(f.faulty_step,
                  StatusIs(absl::StatusCode::kInternal,
                           HasSubstr("injected apply failure at step 2")));
    } else {
      EXPECT_THAT(f.faulty_step,
                  StatusIs(absl::StatusCode::kAborted,
                           AllOf(HasSubstr(absl::StrCat("rank ", r,
                                                        ": rank 2 failed "
                                                        "step 2")),
                                 HasSubstr("rolled back"))))
          << "rank " << r;
    }
    EXPECT_EQ(f.before.step, 1) << "rank " << r;
    EXPECT_TRUE(f.after_fault == f.before) << "rank " << r;
    EXPECT_THAT(f.last_step, IsOk()) << "rank " << r;
    EXPECT_THAT(reference[r].last_step, IsOk()) << "rank " << r;
    EXPECT_EQ(f.final.step, 2) << "rank " << r;
    EXPECT_TRUE(f.final == reference[r].final) << "rank " << r;
  }
}

TEST(
    TransactionalStepTest,
    Step_Fp32FailureAfterUpdateOnOneOfFourRanks_EveryRankRestoresBitwise_NextStepMatchesUnfailedRun) {
  ExpectEveryRankRolledBackThenMatchesReference(DType::kFloat32);
}

TEST(
    TransactionalStepTest,
    Step_Bf16FailureAfterUpdateOnOneOfFourRanks_EveryRankRestoresBitwise_NextStepMatchesUnfailedRun) {
  ExpectEveryRankRolledBackThenMatchesReference(DType::kBFloat16);
}

TEST(TransactionalStepTest,
     Step_CollectiveFailsOnOneOfFourRanks_EveryRankFailsAndRestoresBitwise) {
  // Rank 2's first exchange of step 2 fails before it joins: the others
  // are left in their all-to-all until the coordinator aborts it (or it
  // times out). The world is then broken (the next step fails too), but
  // nobody kept a partial step.
  const std::vector<RankOutcome> out =
      RunScenario(DType::kFloat32, /*transactional=*/true,
                  [](int rank, Muon&, FaultyCommunicator& comm) {
                    if (rank == kFaultRank) comm.Arm("AllToAllV", 0, false);
                  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(out[r].faulty_step.ok()) << "rank " << r;
    EXPECT_TRUE(out[r].after_fault == out[r].before) << "rank " << r;
  }
  EXPECT_THAT(out[kFaultRank].faulty_step,
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("injected AllToAllV failure")));
}

TEST(
    TransactionalStepTest,
    Step_CommitAgreementFailsOnOneRankAfterCompleting_EachRankCommitsOrRestoresWhole) {
  // The documented window: rank 2's commit all-gather completes, then
  // reports an error (call 1 of step 2: call 0 is check_finite's). Rank 2
  // rolls back; a rank whose agreement succeeded keeps the step. Either
  // way no rank is left with half a step.
  const std::vector<RankOutcome> out =
      RunScenario(DType::kFloat32, /*transactional=*/true,
                  [](int rank, Muon&, FaultyCommunicator& comm) {
                    if (rank == kFaultRank) comm.Arm("AllGatherV", 1, true);
                  });
  const std::vector<RankOutcome> reference =
      RunScenario(DType::kFloat32, /*transactional=*/true, nullptr);
  EXPECT_THAT(out[kFaultRank].faulty_step,
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("injected AllGatherV failure")));
  for (int r = 0; r < kWorld; ++r) {
    if (out[r].faulty_step.ok()) {
      // Committed: the state after step 2 of the unfailed run.
      EXPECT_EQ(out[r].after_fault.step, 2) << "rank " << r;
      EXPECT_TRUE(out[r].after_fault.data == reference[r].final.data)
          << "rank " << r;
    } else {
      EXPECT_TRUE(out[r].after_fault == out[r].before) << "rank " << r;
    }
  }
}

// Without a coordinator, rank 2's last exchange of step 2 completes and
// then fails on rank 2 alone: its peers finished the step and wait in the
// commit agreement. Rank 2 used to return without joining it, so the
// peers' agreement paired with rank 2's next step's first all-gather and
// they committed a step rank 2 had rolled back. Rank 2 now aborts its
// communicator: every rank fails step 2 and keeps the state before it.
TEST(TransactionalStepTest,
     Step_UncoordinatedRankFailsAfterItsExchanges_NoRankCommits) {
  const std::vector<RankOutcome> out = RunScenario(
      DType::kFloat32, /*transactional=*/true,
      [](int rank, Muon& opt, FaultyCommunicator& comm) {
        const int last = 2 * opt.plan().buckets_size() - 1;
        if (rank == kFaultRank) comm.Arm("AllToAllV", last, true);
      },
      /*coordinated=*/false);
  EXPECT_THAT(out[kFaultRank].faulty_step,
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("injected AllToAllV failure")));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(out[r].faulty_step.ok()) << "rank " << r;
    EXPECT_EQ(out[r].after_fault.step, 1) << "rank " << r;
    EXPECT_TRUE(out[r].after_fault == out[r].before) << "rank " << r;
  }
}

// The CPU engine, failing every Orthogonalize.
class FailingEngine final : public kernels::NsEngine {
 public:
  absl::Status Orthogonalize(const float*, int64_t, int64_t,
                             const kernels::NewtonSchulzOptions&,
                             float*) override {
    return absl::InternalError("injected Newton-Schulz failure");
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return "failing"; }

 private:
  std::unique_ptr<kernels::NsEngine> inner_ = kernels::MakeCpuNsEngine();
};

// Without a coordinator, in the sequential (debug) schedule, an owner's
// Newton-Schulz fails (every rank's engine fails; the first owner's turn
// comes first): it used to return and leave its peers in the owners'
// barrier turns until the Gloo timeout (5 s here). It aborts its
// communicator: every peer's step fails at once (in about 25 ms here),
// with or without transactional_step.
TEST(TransactionalStepTest,
     Step_UncoordinatedOwnerNewtonSchulzFails_PeersFailAtOnce) {
  for (const bool transactional : {false, true}) {
    SCOPED_TRACE(transactional ? "transactional" : "plain");
    ThreadWorld world(kWorld);
    ASSERT_TRUE(world.Connect());
    std::vector<absl::Status> step(kWorld);
    std::vector<absl::Duration> took(kWorld);
    std::vector<absl::Status> statuses =
        RunOnRanks(kWorld, [&](int rank) -> absl::Status {
          Shards s(DType::kFloat32, rank);
          AutoConfigOptions ao;
          ao.fsdp = world.comm(rank);
          ao.fsdp_shard_dim = 0;
          absl::StatusOr<DistributedConfig> config =
              CreateAutoConfig(s.Views(), ao);
          if (!config.ok()) return config.status();
          {
            config->ns_engine_factory =
                []() -> absl::StatusOr<std::unique_ptr<kernels::NsEngine>> {
              return std::make_unique<FailingEngine>();
            };
          }
          MuonOptions o;
          o.transactional_step = transactional;
          absl::StatusOr<std::unique_ptr<Muon>> opt =
              Muon::Create(s.Views(), o, *std::move(config));
          if (!opt.ok()) return opt.status();
          const absl::Time start = absl::Now();
          step[rank] = (*opt)->Step();
          took[rank] = absl::Now() - start;
          return absl::OkStatus();
        });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_THAT(statuses[r], IsOk()) << "rank " << r;
      EXPECT_FALSE(step[r].ok()) << "rank " << r;
      // Not the Gloo timeout's DeadlineExceeded (5 s), and well before it.
      EXPECT_NE(step[r].code(), absl::StatusCode::kDeadlineExceeded)
          << "rank " << r << ": " << step[r];
      EXPECT_LT(took[r], absl::Seconds(4)) << "rank " << r;
    }
    int owners_failed = 0;
    for (int r = 0; r < kWorld; ++r) {
      owners_failed += step[r].code() == absl::StatusCode::kInternal &&
                       absl::StrContains(step[r].message(),
                                         "injected Newton-Schulz failure");
    }
    EXPECT_GE(owners_failed, 1);
  }
}

TEST(
    TransactionalStepTest,
    Step_OptionOff_FailureAfterUpdateOnOneRank_LeavesThatRankUpdatedAndOthersCommitted) {
  // The old behaviour, deterministic here: without the commit agreement the
  // other ranks finish step 2 (OK), and rank 2 returns its error with its
  // parameters and momentum already updated (its step count not).
  const std::vector<RankOutcome> out = RunScenario(
      DType::kFloat32, /*transactional=*/false, FailAfterUpdateOnRank2);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_FALSE(out[r].after_fault == out[r].before) << "rank " << r;
    if (r == kFaultRank) {
      EXPECT_THAT(out[r].faulty_step,
                  StatusIs(absl::StatusCode::kInternal,
                           HasSubstr("injected apply failure")));
      EXPECT_EQ(out[r].after_fault.step, 1);
      EXPECT_FALSE(out[r].after_fault.data == out[r].before.data);
    } else {
      EXPECT_THAT(out[r].faulty_step, IsOk()) << "rank " << r;
      EXPECT_EQ(out[r].after_fault.step, 2) << "rank " << r;
    }
  }
}

TEST(TransactionalStepTest, Step_SingleDeviceFailure_RestoresBitwise) {
  Shards s(DType::kBFloat16, 0);
  std::vector<ParamView> views = s.Views();
  for (ParamView& v : views) v.global_shape.clear();  // not sharded
  MuonOptions o;
  o.transactional_step = true;
  absl::StatusOr<std::unique_ptr<Muon>> opt = Muon::Create(views, o);
  ASSERT_THAT(opt, IsOk());
  ASSERT_THAT((*opt)->Step(), IsOk());
  const Observed before(s, **opt);
  (*opt)->SetPostUpdateFaultForTesting(
      [](int64_t) { return absl::InternalError("injected"); });
  EXPECT_THAT((*opt)->Step(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("injected")));
  EXPECT_TRUE(Observed(s, **opt) == before);
}

}  // namespace
}  // namespace muon
