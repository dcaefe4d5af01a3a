// The step executor on streams: async mode orders its two streams with
// events, and the suite sees a missing dependency. With every wait in
// place, the comm stream redistributes a bucket only after the compute
// stream's Newton-Schulz has finished, and Newton-Schulz reads a slot only
// after its gather. With one wait dropped on purpose
// (StepExecutor::DropEventWaitForTesting), the overlap happens and is
// caught: as a wrong order in every build, and as a data race reported by
// ThreadSanitizer in the --config=tsan build (tools/run_tests.sh runs it).
//
// The probes make the violation deterministic instead of a matter of
// timing: the side that must come second waits (bounded, 500 ms) for the
// side that must come first to have started; with the wait in place that
// never happens and the bound passes, without it the two overlap at once.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/owner_transform.h"
#include "client/step_executor.h"
#include "comm/gloo_communicator.h"
#include "common/layout.h"
#include "device/cuda_runtime.h"
#include "device/host_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/ns_engine.h"
#include "plan/manifest_validation.h"
#include "plan/planner.h"
#include "plan/schedule.h"
#include "tests/client/rank_threads.h"
#include "tests/comm/fake_cuda_stream.h"
#include "tests/comm/in_memory_store_client.h"
#include "tests/server/test_specs.h"
#include "tests/status_matchers.h"
#include "tests/tsan_death_test.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;

using ::muon::testing::RandomValues;
using ::testing::HasSubstr;

constexpr int64_t kRows = 24;
constexpr int64_t kCols = 16;
constexpr absl::Duration kProbeWait = absl::Milliseconds(500);

// A matrix of a world of one (its rank holds it whole).
MatrixGeometry WholeMatrix(const std::string& name, int64_t rows, int64_t cols,
                           int param_index = 0) {
  MatrixGeometry g;
  g.param = name;
  g.param_index = param_index;
  g.rows = rows;
  g.cols = cols;
  g.boxes = {Box{Range{0, rows}, Range{0, cols}}};
  return g;
}

// Polls `flag` until it is set or `bound` passes; returns whether it was set.
bool AwaitFlag(const std::atomic<bool>& flag, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!flag.load()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// What the probes observed in one step.
struct Probe {
  std::atomic<bool> gather_done{false};
  std::atomic<bool> ns_started{false};
  std::atomic<bool> ns_done{false};
  std::atomic<bool> redistribute_called{false};
  // The order violations: NS started before its gather finished; a
  // redistribute ran before NS finished.
  std::atomic<bool> ns_before_gather{false};
  std::atomic<bool> redistribute_before_ns{false};
  // Which side delays to invite the overlap.
  bool slow_gather = false;
  bool slow_ns = false;
};

// The CPU engine, reporting to the probe (and, with slow_ns, waiting for a
// redistribute to start before it orthogonalizes).
class ProbeEngine final : public kernels::NsEngine {
 public:
  explicit ProbeEngine(Probe* probe)
      : inner_(kernels::MakeCpuNsEngine()), probe_(probe) {}
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const kernels::NewtonSchulzOptions& options,
                             float* out) override {
    probe_->ns_started = true;
    if (!probe_->gather_done.load()) probe_->ns_before_gather = true;
    // Read u and write out here, in instrumented code: the CPU engine's
    // OpenBLAS is not built with ThreadSanitizer, which would not see its
    // accesses to the bucket's buffers.
    const std::vector<float> u_copy(u, u + rows * cols);
    std::vector<float> result(rows * cols);
    if (probe_->slow_ns) AwaitFlag(probe_->redistribute_called, kProbeWait);
    absl::Status s = inner_->Orthogonalize(u_copy.data(), rows, cols, options,
                                           result.data());
    std::copy(result.begin(), result.end(), out);
    probe_->ns_done = true;
    return s;
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return "probe/" + inner_->name(); }

 private:
  std::unique_ptr<kernels::NsEngine> inner_;
  Probe* probe_;  // Not owned.
};

// w [24, 16] in a world of one, planned for the async (default) or the
// sequential schedule.
v1::Plan PlanOfOne(bool async) {
  const v1::JobSpec spec = testing::MakeSpec(
      {{"dp_shard", 1}}, {{"w", kRows, kCols, {"Replicate()"}}});
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(testing::Manifests(spec));
  EXPECT_TRUE(layout.ok()) << layout.status();
  PlannerOptions options;
  options.async = async;
  options.prefetch_count = 0;
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

v1::Plan AsyncPlanOfOne() { return PlanOfOne(true); }

// One async step of a world of one on w [24, 16] with a custom gather and
// redistribute (which report to the probe), the `dropped` wait removed.
// Returns the updated parameter.
std::vector<float> RunStep(Probe* probe, StepExecutor::EventWait dropped) {
  const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
  const int64_t n = kRows * kCols;
  GatherFn gather = [probe, n](int, int, int, const float* shard, float* full) {
    if (probe->slow_gather) AwaitFlag(probe->ns_started, kProbeWait);
    for (int64_t i = 0; i < n; ++i) full[i] = shard[i];
    probe->gather_done = true;
    return absl::OkStatus();
  };
  RedistributeFn redistribute = [probe](int, int, int, const float*, float*) {
    probe->redistribute_called = true;
    if (!probe->ns_done.load()) probe->redistribute_before_ns = true;
    return absl::OkStatus();
  };
  auto engine = std::make_shared<ProbeEngine>(probe);
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
      0, 1, AsyncPlanOfOne(), {g}, nullptr, gather, redistribute, engine);
  EXPECT_TRUE(ex.ok()) << ex.status();
  if (!ex.ok()) return {};
  EXPECT_TRUE((*ex)->async());
  (*ex)->DropEventWaitForTesting(dropped);
  const std::vector<float> update = RandomValues(n, 7);
  std::vector<float> param = RandomValues(n, 8);
  StepStats stats;
  UpdateRule rule;
  rule.lr = 0.02;
  ParamView view;
  view.name = "w";
  view.data = param.data();
  view.local_shape = {kRows, kCols};
  absl::Status s = (*ex)->Run({update.data()}, {view}, rule, &stats);
  EXPECT_TRUE(s.ok()) << s;
  return param;
}

TEST(ExecutorStreamsTest, Async_EveryWait_RedistributeAfterNewtonSchulz) {
  Probe probe;
  probe.slow_ns = true;
  RunStep(&probe, StepExecutor::EventWait::kNone);
  EXPECT_TRUE(probe.ns_done);
  EXPECT_TRUE(probe.redistribute_called);
  EXPECT_FALSE(probe.redistribute_before_ns);
}

TEST(ExecutorStreamsTest, Async_EveryWait_NewtonSchulzAfterGather) {
  Probe probe;
  probe.slow_gather = true;
  RunStep(&probe, StepExecutor::EventWait::kNone);
  EXPECT_TRUE(probe.gather_done);
  EXPECT_TRUE(probe.ns_started);
  EXPECT_FALSE(probe.ns_before_gather);
}

TEST(ExecutorStreamsTest, Async_SlowSides_SameBitsAsPromptSides) {
  Probe prompt;
  const std::vector<float> expected =
      RunStep(&prompt, StepExecutor::EventWait::kNone);
  Probe slow;
  slow.slow_gather = true;
  slow.slow_ns = true;
  EXPECT_TRUE(
      BitwiseEqual(RunStep(&slow, StepExecutor::EventWait::kNone), expected));
}

// Runs a step with `dropped` removed in a child process and exits with 0
// when the probe saw the order violation (1 when it did not). Under
// ThreadSanitizer a report of the race on the bucket's buffer may stop the
// child first (exit 66).
void RunDroppedAndExit(StepExecutor::EventWait dropped) {
  Probe probe;
  probe.slow_gather =
      dropped == StepExecutor::EventWait::kGatheredBeforeOrthogonalize;
  probe.slow_ns =
      dropped == StepExecutor::EventWait::kOrthogonalizedBeforeRedistribute;
  RunStep(&probe, dropped);
  const bool caught = probe.slow_gather ? probe.ns_before_gather.load()
                                        : probe.redistribute_before_ns.load();
  std::_Exit(caught ? 0 : 1);
}

// Exited 0 (the probe saw the overlap) or, under ThreadSanitizer, 66 (its
// report of the race on the bucket's buffer). The probe is deterministic;
// TSan reports the race in most runs but not all (in some interleavings
// the probe's own atomics order the two accesses it would flag).
// tests/device/host_stream_test's MissingWait death test shows TSan
// catching a missing event wait deterministically.
bool CaughtByProbeOrThreadSanitizer(int status) {
  if (!WIFEXITED(status)) return false;
  const int code = WEXITSTATUS(status);
  return code == 0 || (testing::kThreadSanitizer && code == 66);
}

TEST(ExecutorStreamsDeathTest, OrthogonalizedWaitDropped_OverlapCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunDroppedAndExit(
                  StepExecutor::EventWait::kOrthogonalizedBeforeRedistribute),
              CaughtByProbeOrThreadSanitizer, "");
}

TEST(ExecutorStreamsDeathTest, GatheredWaitDropped_OverlapCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      RunDroppedAndExit(StepExecutor::EventWait::kGatheredBeforeOrthogonalize),
      CaughtByProbeOrThreadSanitizer, "");
}

// Two ranks over Gloo (loopback; ranks as threads), three matrices sharded
// on either dim and replicated: the executor's streams with a real
// communicator (under --config=tsan, TSan watches the comm stream, the
// compute stream and Gloo's threads). Async with prefetch 1 and sequential
// give the bits of one device.
struct Matrix {
  std::string name;
  int64_t rows, cols;
  Placement placement;
};

// Eight matrices: four buckets of one matrix per owner, so that with
// prefetch 1 (two slots) every slot is gathered into twice per step.
std::vector<Matrix> TwoRankMatrices() {
  return {{"w0", 24, 16, Placement::Shard(0)},
          {"w1", 10, 7, Placement::Shard(1)},
          {"w2", 6, 8, Placement::Replicate()},
          {"w3", 16, 24, Placement::Shard(0)},
          {"w4", 9, 13, Placement::Shard(1)},
          {"w5", 20, 12, Placement::Shard(0)},
          {"w6", 7, 7, Placement::Replicate()},
          {"w7", 12, 18, Placement::Shard(1)}};
}

constexpr int kTwoRankSteps = 2;

// How RunWorld plans and orthogonalizes.
struct WorldOptions {
  std::vector<Matrix> matrices = TwoRankMatrices();
  int64_t bucket_size_bytes = 0;  // PlannerOptions::bucket_size_bytes
  // The Newton-Schulz engine of each rank (empty: the CPU engine).
  std::function<std::unique_ptr<kernels::NsEngine>(int rank)> engine;
};

// Runs kTwoRankSteps steps of `world` ranks (threads), each executor
// reused, and returns each matrix reassembled from the ranks' shards.
std::vector<std::vector<float>> RunWorld(
    int world, bool async, int prefetch, testing::InMemoryStoreClient* store,
    const std::string& prefix, const WorldOptions& wo = WorldOptions()) {
  const std::vector<Matrix>& mats = wo.matrices;
  const Mesh mesh{{"dp_shard"}, {world}};
  std::vector<testing::TestParam> spec_params;
  for (const Matrix& m : mats) {
    spec_params.push_back(
        {m.name,
         m.rows,
         m.cols,
         {m.placement.is_shard() ? absl::StrCat("Shard(", m.placement.dim, ")")
                                 : "Replicate()"}});
  }
  absl::StatusOr<JobLayout> layout = ValidateManifests(testing::Manifests(
      testing::MakeSpec({{"dp_shard", world}}, spec_params)));
  EXPECT_TRUE(layout.ok()) << layout.status();
  PlannerOptions options;
  options.async = async;
  options.prefetch_count = prefetch;
  options.bucket_size_bytes = wo.bucket_size_bytes;
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<float>> out(mats.size());
  for (size_t i = 0; i < mats.size(); ++i) {
    out[i].assign(mats[i].rows * mats[i].cols, 0.0f);
  }
  std::vector<absl::Status> st =
      testing::RunOnRanks(world, [&](int rank) -> absl::Status {
        std::unique_ptr<Communicator> comm;
        if (world > 1) {
          GlooOptions gloo;
          gloo.timeout = absl::Seconds(20);
          gloo.prefix = prefix;
          absl::StatusOr<std::unique_ptr<GlooCommunicator>> made =
              GlooCommunicator::Create(rank, world, store, gloo);
          if (!made.ok()) return made.status();
          comm = *std::move(made);
        }
        std::vector<MatrixGeometry> geometry;
        std::vector<std::vector<float>> updates, params;
        for (size_t i = 0; i < mats.size(); ++i) {
          const Matrix& m = mats[i];
          MatrixGeometry g;
          g.param = m.name;
          g.param_index = static_cast<int>(i);
          g.rows = m.rows;
          g.cols = m.cols;
          absl::StatusOr<std::vector<Box>> boxes =
              AllBoxes(m.rows, m.cols, {m.placement}, mesh);
          if (!boxes.ok()) return boxes.status();
          g.boxes = *boxes;
          const Box whole{Range{0, m.rows}, Range{0, m.cols}};
          const Box& mine = g.boxes[rank];
          const std::vector<float> u = RandomValues(whole.numel(), 100 + i);
          const std::vector<float> w = RandomValues(whole.numel(), 200 + i);
          updates.emplace_back(mine.numel());
          params.emplace_back(mine.numel());
          CopyRegion(u.data(), whole, updates.back().data(), mine, mine);
          CopyRegion(w.data(), whole, params.back().data(), mine, mine);
          geometry.push_back(std::move(g));
        }
        std::shared_ptr<kernels::NsEngine> engine =
            wo.engine ? wo.engine(rank) : kernels::MakeCpuNsEngine();
        absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
            rank, world, *plan, geometry, comm.get(), nullptr, nullptr, engine);
        if (!ex.ok()) return ex.status();
        std::vector<const float*> u_ptrs;
        std::vector<ParamView> views;
        for (size_t i = 0; i < mats.size(); ++i) {
          u_ptrs.push_back(updates[i].data());
          ParamView v;
          v.name = mats[i].name;
          v.data = params[i].data();
          views.push_back(v);
        }
        UpdateRule rule;
        rule.lr = 0.02;
        for (int step = 0; step < kTwoRankSteps; ++step) {
          StepStats stats;
          absl::Status s = (*ex)->Run(u_ptrs, views, rule, &stats);
          if (!s.ok()) return s;
        }
        for (size_t i = 0; i < mats.size(); ++i) {
          const Box whole{Range{0, mats[i].rows}, Range{0, mats[i].cols}};
          const Box& mine = geometry[i].boxes[rank];
          // Replicas agree: the first rank holding a box writes it.
          bool first = true;
          for (int r = 0; r < rank; ++r)
            first &= !(geometry[i].boxes[r] == mine);
          if (first) {
            CopyRegion(params[i].data(), mine, out[i].data(), whole, mine);
          }
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  }
  return out;
}

TEST(ExecutorStreamsTest, TwoRanksGloo_AsyncAndSequential_BitsOfOneDevice) {
  testing::InMemoryStoreClient store;
  {
    // The premise: more buckets than async slots, so slots are reused.
    const std::vector<Matrix> mats = TwoRankMatrices();
    std::vector<testing::TestParam> spec_params;
    for (const Matrix& m : mats) {
      spec_params.push_back({m.name, m.rows, m.cols, {"Replicate()"}});
    }
    absl::StatusOr<JobLayout> layout = ValidateManifests(
        testing::Manifests(testing::MakeSpec({{"dp_shard", 2}}, spec_params)));
    ASSERT_TRUE(layout.ok()) << layout.status();
    PlannerOptions options;
    options.async = true;
    options.prefetch_count = 1;
    absl::StatusOr<v1::Plan> plan = MakePlan(*layout, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_GT(plan->buckets_size(), plan->schedule().slots());
  }
  const std::vector<std::vector<float>> one =
      RunWorld(1, /*async=*/false, 0, &store, "one");
  const std::vector<std::vector<float>> seq =
      RunWorld(2, /*async=*/false, 0, &store, "seq");
  const std::vector<std::vector<float>> async =
      RunWorld(2, /*async=*/true, 1, &store, "async");
  ASSERT_EQ(seq.size(), one.size());
  ASSERT_EQ(async.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(seq[i], one[i])) << "matrix " << i;
    EXPECT_TRUE(BitwiseEqual(async[i], one[i])) << "matrix " << i;
  }
}

// The CPU engine, logging where each matrix it orthogonalizes lies.
class AddressLoggingEngine final : public kernels::NsEngine {
 public:
  struct Call {
    const float* u;
    float* out;
  };
  explicit AddressLoggingEngine(std::vector<Call>* log)
      : inner_(kernels::MakeCpuNsEngine()), log_(log) {}
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const kernels::NewtonSchulzOptions& options,
                             float* out) override {
    log_->push_back({u, out});
    return inner_->Orthogonalize(u, rows, cols, options, out);
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return inner_->name(); }

 private:
  std::unique_ptr<kernels::NsEngine> inner_;
  std::vector<Call>* log_;  // Not owned.
};

// One bucket holding four same-shape matrices sharded over two ranks: each
// rank owns two, whose full U (and O) lie one after another in the slot,
// so that one batched Newton-Schulz call serves them (one strided-batched
// cuBLAS iteration on CUDA; on the host the engine still sees one matrix
// at a time, at consecutive addresses). Same bits as one device.
TEST(ExecutorStreamsTest, SameShapeOwnedMatrices_ContiguousInSlot_BitsKept) {
  WorldOptions wo;
  wo.matrices = {{"a", 12, 8, Placement::Shard(0)},
                 {"b", 12, 8, Placement::Shard(0)},
                 {"c", 12, 8, Placement::Shard(0)},
                 {"d", 12, 8, Placement::Shard(0)}};
  wo.bucket_size_bytes = 1 << 20;  // one bucket
  std::vector<std::vector<AddressLoggingEngine::Call>> calls(2);
  wo.engine = [&calls](int rank) -> std::unique_ptr<kernels::NsEngine> {
    return std::make_unique<AddressLoggingEngine>(&calls[rank]);
  };
  testing::InMemoryStoreClient store;
  WorldOptions one = wo;
  one.engine = nullptr;
  const auto want = RunWorld(1, /*async=*/false, 0, &store, "batch-one", one);
  const auto got = RunWorld(2, /*async=*/true, 0, &store, "batch-two", wo);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(got[i], want[i])) << "matrix " << i;
  }
  for (int rank = 0; rank < 2; ++rank) {
    // kTwoRankSteps steps, two matrices per step.
    ASSERT_EQ(calls[rank].size(), 2u * kTwoRankSteps) << "rank " << rank;
    for (int step = 0; step < kTwoRankSteps; ++step) {
      const auto& first = calls[rank][2 * step];
      const auto& second = calls[rank][2 * step + 1];
      EXPECT_EQ(second.u, first.u + 12 * 8) << "rank " << rank;
      EXPECT_EQ(second.out, first.out + 12 * 8) << "rank " << rank;
    }
  }
}

// A variant behind the OwnerTransform seam, written here: it zeroes O and
// writes its row state (row r: r + 1), recording the shape it saw.
class ZeroingTransform final : public OwnerTransform {
 public:
  std::string name() const override { return "zeroing"; }
  RowStateSpec row_state() const override { return RowStateSpec{"rows"}; }
  std::vector<std::pair<std::string, double>> params() const override {
    return {};
  }
  absl::Status Apply(kernels::StepKernels&, device::Stream*, float* o,
                     int64_t rows, int64_t cols, float* v) const override {
    seen_rows = rows;
    seen_cols = cols;
    for (int64_t i = 0; i < rows * cols; ++i) o[i] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) v[r] = static_cast<float>(r + 1);
    return absl::OkStatus();
  }
  mutable int64_t seen_rows = -1;
  mutable int64_t seen_cols = -1;
};

// The executor runs a variant given as ExecutorOptions::owner_transform on
// the owner after Newton-Schulz, with the matrix's row state: O zeroed
// leaves the parameter bitwise as it was (weight decay 0), where the plain
// step changes it, and the transform's row state lands in the bound
// buffer; without a bound row state the step is refused, naming the
// variant.
TEST(ExecutorStreamsTest, OwnerTransform_RunsOnOwnerWithItsRowState) {
  for (const bool async : {false, true}) {
    const v1::Plan plan = PlanOfOne(async);
    const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
    const int64_t n = kRows * kCols;
    UpdateRule rule;
    rule.lr = 0.02;
    rule.weight_decay = 0.0;
    const std::vector<float> u = RandomValues(n, 9);
    const std::vector<float> before = RandomValues(n, 10);
    auto transform = std::make_shared<ZeroingTransform>();
    ExecutorOptions options;
    options.owner_transform = transform;
    for (const bool with_transform : {false, true}) {
      absl::StatusOr<std::unique_ptr<StepExecutor>> ex =
          StepExecutor::Create(0, 1, plan, {g}, nullptr, nullptr, nullptr,
                               kernels::MakeCpuNsEngine(),
                               with_transform ? options : ExecutorOptions());
      ASSERT_TRUE(ex.ok()) << ex.status();
      std::vector<float> param = before;
      ParamView view;
      view.name = "w";
      view.data = param.data();
      StepStats stats;
      if (with_transform) {
        EXPECT_THAT((*ex)->Run({u.data()}, {view}, rule, &stats),
                    StatusIs(absl::StatusCode::kFailedPrecondition,
                             HasSubstr("zeroing has no row state")));
      }
      std::vector<float> v(kRows, -1.0f);
      (*ex)->BindRowState({v.data()});
      ASSERT_TRUE((*ex)->Run({u.data()}, {view}, rule, &stats).ok());
      if (with_transform) {
        EXPECT_EQ(param, before) << "async " << async;
        EXPECT_EQ(transform->seen_rows, kRows);
        EXPECT_EQ(transform->seen_cols, kCols);
        for (int64_t r = 0; r < kRows; ++r) EXPECT_EQ(v[r], r + 1.0f) << r;
      } else {
        EXPECT_NE(param, before) << "async " << async;
      }
    }
  }
}

// `param` after one Run of `plan` on w with update `u` (the reference of
// the stream-ordered tests below).
std::vector<float> RunOnce(const v1::Plan& plan, const MatrixGeometry& g,
                           std::shared_ptr<kernels::NsEngine> engine,
                           const UpdateRule& rule, const std::vector<float>& u,
                           std::vector<float> param) {
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex =
      StepExecutor::Create(0, 1, plan, {g}, nullptr, nullptr, nullptr, engine);
  EXPECT_TRUE(ex.ok()) << ex.status();
  if (!ex.ok()) return {};
  ParamView view;
  view.name = "w";
  view.data = param.data();
  StepStats stats;
  const absl::Status st = (*ex)->Run({u.data()}, {view}, rule, &stats);
  EXPECT_TRUE(st.ok()) << st;
  return param;
}

// Enqueues on `stream` work that copies `src` into *dst once `gate` is
// open, failing with `what` if it is not within 10 s (the code under test
// waited for the stream instead of ordering on it).
absl::Status LaunchGatedWrite(device::HostStream& stream,
                              std::shared_future<void> gate,
                              std::vector<float>* dst,
                              const std::vector<float>& src,
                              const std::string& what) {
  return stream.Launch([gate, dst, &src, what]() -> absl::Status {
    if (gate.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return absl::DeadlineExceededError(what);
    }
    *dst = src;
    return absl::OkStatus();
  });
}

// A step ordered on the caller's (host) stream: the caller's earlier work
// writes the update, the step reads it, the caller's later work reads the
// parameter; Enqueue returns without waiting. Plain memory throughout, so
// only the events order it (ThreadSanitizer checks under --config=tsan);
// the result has the bits of Run on the same inputs.
TEST(ExecutorStreamsTest, Enqueue_CallerStream_StepBetweenCallersWork) {
  const v1::Plan plan = AsyncPlanOfOne();
  const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
  const int64_t n = kRows * kCols;
  std::shared_ptr<kernels::NsEngine> engine = kernels::MakeCpuNsEngine();
  UpdateRule rule;
  rule.lr = 0.02;
  const std::vector<float> u0 = RandomValues(n, 7);
  // Reference: Run on the same inputs.
  const std::vector<float> want =
      RunOnce(plan, g, engine, rule, u0, RandomValues(n, 8));
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex =
      StepExecutor::Create(0, 1, plan, {g}, nullptr, nullptr, nullptr, engine);
  ASSERT_TRUE(ex.ok()) << ex.status();
  std::vector<float> update(n, 0.0f);
  std::vector<float> param = RandomValues(n, 8);
  std::vector<float> seen;
  device::HostStream caller("caller");
  // The caller's earlier work is held until Enqueue has returned: Enqueue
  // must not wait for it (bounded: 10 s, then the step fails).
  std::promise<void> release;
  ASSERT_TRUE(LaunchGatedWrite(caller, release.get_future().share(), &update,
                               u0, "Enqueue waited for the caller's stream")
                  .ok());
  ParamView view;
  view.name = "w";
  view.data = param.data();
  const std::vector<const float*> updates = {update.data()};
  const std::vector<ParamView> views = {view};
  ASSERT_TRUE((*ex)->Enqueue(updates, views, rule, &caller).ok());
  release.set_value();
  // In flight: a second step is refused until Finish.
  EXPECT_EQ((*ex)->Enqueue(updates, views, rule, &caller).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(caller
                  .Launch([&] {
                    seen = param;
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(caller.Synchronize(absl::Seconds(30)).ok());
  StepStats stats;
  ASSERT_TRUE((*ex)->Finish(&stats).ok());
  EXPECT_EQ(stats.matrices_orthogonalized, 1);
  EXPECT_TRUE(BitwiseEqual(seen, want));
  EXPECT_EQ((*ex)->Finish(&stats).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A step begun by Begin and fed bucket by bucket (overlap_backward), its
// update written by work held on a producer stream (the momentum pass on
// the stream that produced a gradient): OrderAfter returns without
// waiting, the gather reads the producer's write, and the result has the
// bits of Run on the same inputs, in both schedules. Plain memory, so only
// the event orders it (ThreadSanitizer checks under --config=tsan).
TEST(ExecutorStreamsTest, OrderAfter_ProducerStream_GatherReadsItsWork) {
  const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
  const int64_t n = kRows * kCols;
  std::shared_ptr<kernels::NsEngine> engine = kernels::MakeCpuNsEngine();
  UpdateRule rule;
  rule.lr = 0.02;
  const std::vector<float> u0 = RandomValues(n, 7);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sequential");
    const std::vector<float> want =
        RunOnce(PlanOfOne(async), g, engine, rule, u0, RandomValues(n, 8));
    absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
        0, 1, PlanOfOne(async), {g}, nullptr, nullptr, nullptr, engine);
    ASSERT_TRUE(ex.ok()) << ex.status();
    std::vector<float> update(n, 0.0f);
    std::vector<float> param = RandomValues(n, 8);
    ParamView view;
    view.name = "w";
    view.data = param.data();
    std::vector<UpdateSource> sources(1);
    sources[0].momentum = update.data();
    const std::vector<ParamView> views = {view};
    EXPECT_THAT((*ex)->OrderAfter(nullptr),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("outside a step")));
    ASSERT_TRUE((*ex)->Begin(sources, views, rule, nullptr).ok());
    device::HostStream producer("backward");
    std::promise<void> release;
    ASSERT_TRUE(LaunchGatedWrite(producer, release.get_future().share(),
                                 &update, u0,
                                 "OrderAfter waited for the producer's stream")
                    .ok());
    ASSERT_TRUE((*ex)->OrderAfter(&producer).ok());
    testing::FakeCudaStream other("torch-current");
    EXPECT_THAT((*ex)->OrderAfter(&other),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("torch-current")));
    ASSERT_TRUE((*ex)->EnqueueReady(1).ok());
    release.set_value();
    StepStats stats;
    ASSERT_TRUE((*ex)->Finish(&stats).ok());
    ASSERT_TRUE(producer.Synchronize(absl::Seconds(30)).ok());
    EXPECT_EQ(stats.matrices_orthogonalized, 1);
    EXPECT_TRUE(BitwiseEqual(param, want));
  }
}

TEST(ExecutorStreamsTest, Enqueue_CallerStreamOfAnotherDevice_InvalidArgument) {
  const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
  std::shared_ptr<kernels::NsEngine> engine = kernels::MakeCpuNsEngine();
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
      0, 1, AsyncPlanOfOne(), {g}, nullptr, nullptr, nullptr, engine);
  ASSERT_TRUE(ex.ok()) << ex.status();
  testing::FakeCudaStream stream("torch-current");
  std::vector<float> update(kRows * kCols), param(kRows * kCols);
  ParamView view;
  view.data = param.data();
  const absl::Status s =
      (*ex)->Enqueue({update.data()}, {view}, UpdateRule(), &stream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("torch-current"));
  // Nothing was enqueued: the executor still runs.
  StepStats stats;
  EXPECT_TRUE((*ex)->Run({update.data()}, {view}, UpdateRule(), &stats).ok());
}

// Without that CUDA device (or without CUDA support), an executor on it is
// refused naming the device, before anything is allocated.
TEST(ExecutorStreamsTest, Create_OnCudaWithoutThatDevice_RefusedNamingIt) {
  const int count = device::CudaDeviceCount();
  const MatrixGeometry g = WholeMatrix("w", kRows, kCols);
  ExecutorOptions options;
  options.device = device::Device::Cuda(count);
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
      0, 1, AsyncPlanOfOne(), {g}, nullptr, nullptr, nullptr, nullptr, options);
  ASSERT_FALSE(ex.ok());
  EXPECT_THAT(std::string(ex.status().message()),
              ::testing::HasSubstr(absl::StrCat("cuda:", count)));
}

// An explicit schedule whose compute stream orthogonalizes the buckets in
// another order than its comm stream redistributes them is refused: the
// executor's event waits rely on that order.
TEST(ExecutorStreamsTest, Create_ComputeOrderOtherThanRedistribute_Refused) {
  const v1::JobSpec spec = testing::MakeSpec(
      {{"dp_shard", 1}},
      {{"a", 8, 6, {"Replicate()"}}, {"b", 6, 4, {"Replicate()"}}});
  absl::StatusOr<JobLayout> layout =
      ValidateManifests(testing::Manifests(spec));
  ASSERT_TRUE(layout.ok()) << layout.status();
  PlannerOptions options;
  options.async = true;
  options.prefetch_count = 1;
  absl::StatusOr<v1::Plan> plan = MakePlan(*layout, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->buckets_size(), 2);
  v1::RankSchedule mine = MakeRankSchedule(*plan, 0);
  // Swap the two orthogonalize ops (both on the compute stream).
  std::vector<int> ns;
  for (int k = 0; k < mine.ops_size(); ++k) {
    if (mine.ops(k).op() == v1::OP_KIND_ORTHOGONALIZE) ns.push_back(k);
  }
  ASSERT_EQ(ns.size(), 2u);
  mine.mutable_ops()->SwapElements(ns[0], ns[1]);
  *plan->mutable_schedule()->add_ranks() = mine;
  std::vector<MatrixGeometry> geometry;
  for (const auto& [name, rows, cols] :
       std::vector<std::tuple<std::string, int64_t, int64_t>>{{"a", 8, 6},
                                                              {"b", 6, 4}}) {
    geometry.push_back(
        WholeMatrix(name, rows, cols, static_cast<int>(geometry.size())));
  }
  std::shared_ptr<kernels::NsEngine> engine = kernels::MakeCpuNsEngine();
  absl::StatusOr<std::unique_ptr<StepExecutor>> ex = StepExecutor::Create(
      0, 1, *plan, geometry, nullptr, nullptr, nullptr, engine);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ex.status().message()),
              ::testing::HasSubstr("orthogonalizes buckets"));
}

}  // namespace
}  // namespace muon
