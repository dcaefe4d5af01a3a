// A warm optimizer step allocates nothing on the stepping thread: the step
// executor preallocates its buffers and timing records, and step reports
// are filled into pooled objects whose storage is reused. (Gloo's own
// collectives may allocate inside the library; this test uses a world of
// one, where no collective runs.) Also: the Newton-Schulz engine is
// reserved for each owned shape, not for max rows x max cols; and what the
// optimizer holds (OptimizerMemory): torch.optim.Muon's momentum bytes per
// parameter as state, and step buffers of at most (prefetch_count + 1)
// buckets.
#include <cblas.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/tensor_view.h"
#include "comm/local_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/bfloat16.h"
#include "kernels/ns_engine.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"
#include "tests/client/rank_threads.h"

namespace {
// Counts operator new calls made by a thread while its flag is set.
thread_local bool counting = false;
std::atomic<int64_t> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (counting) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace muon {
namespace {

using ::muon::testing::RandomValues;

struct Model {
  std::vector<Parameter> params;
  std::vector<Parameter*> ptrs;
};

Model MakeModel() {
  Model m;
  const int64_t shapes[][2] = {{24, 16}, {16, 40}, {10, 7}, {33, 9}};
  for (int i = 0; i < 4; ++i) {
    Parameter p;
    p.name = absl::StrCat("w", i);
    p.global_shape = {shapes[i][0], shapes[i][1]};
    p.local_shape = p.global_shape;
    p.data = RandomValues(shapes[i][0] * shapes[i][1], i + 1);
    p.grad = RandomValues(shapes[i][0] * shapes[i][1], i + 100);
    m.params.push_back(std::move(p));
  }
  for (Parameter& p : m.params) m.ptrs.push_back(&p);
  return m;
}

// A world of one with an in-process coordinator; Config() places every
// parameter Replicate() on a 1-rank dp_replicate mesh.
class WorldOfOne {
 public:
  explicit WorldOfOne(const std::string& job_id)
      : service_(ServiceOptions(job_id)),
        client_(&service_),
        comm_(LocalCommunicator::Create()) {}
  ~WorldOfOne() { service_.Shutdown(); }

  absl::StatusOr<DistributedConfig> Config(size_t num_params) {
    std::vector<ParamPlacement> placements(
        num_params, ParamPlacement{{Placement::Replicate()}, {}});
    return CreateMeshConfig(Mesh{{"dp_replicate"}, {1}}, placements,
                            comm_.get(), &client_);
  }

 private:
  static CoordinatorService::Options ServiceOptions(const std::string& id) {
    CoordinatorService::Options so;
    so.job_id = id;
    so.world_size = 1;
    return so;
  }

  CoordinatorService service_;
  LocalCoordinationClient client_;
  std::unique_ptr<Communicator> comm_;
};

int64_t CountStepAllocations(Muon& opt, int warm_steps) {
  for (int s = 0; s < warm_steps; ++s) EXPECT_TRUE(opt.Step().ok());
  allocations = 0;
  counting = true;
  absl::Status status = opt.Step();
  counting = false;
  EXPECT_TRUE(status.ok()) << status;
  return allocations.load();
}

TEST(StepAllocTest, Step_SingleDeviceWarm_AllocatesNothing) {
  openblas_set_num_threads(1);
  Model m = MakeModel();
  absl::StatusOr<std::unique_ptr<Muon>> opt = Muon::Create(m.ptrs);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(CountStepAllocations(**opt, 2), 0);
}

TEST(StepAllocTest,
     Step_WorldOfOneWithCoordinatorAndAsync_AllocatesNothingOnceWarm) {
  openblas_set_num_threads(1);
  WorldOfOne world("alloc");
  Model m = MakeModel();
  absl::StatusOr<DistributedConfig> config = world.Config(m.ptrs.size());
  ASSERT_TRUE(config.ok()) << config.status();
  config->execution.set_async_gpu_parallelism(true);
  config->execution.set_prefetch_count(1);
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(m.ptrs, MuonOptions{}, *config);
  ASSERT_TRUE(opt.ok()) << opt.status();
  // The counter sees allocations: the first step fills a fresh pooled
  // report, whose fields get their storage then.
  EXPECT_GT(CountStepAllocations(**opt, 0), 0);
  // Warm every pooled report (capacity 64 + 1) once.
  EXPECT_EQ(CountStepAllocations(**opt, 80), 0);
}

// torch.optim.Muon keeps one momentum buffer per parameter in the
// parameter's dtype (torch.zeros_like(grad)): 2 bytes per bf16 parameter,
// 4 per fp32 one. Nothing else persists here but the finite check's one
// int64 per parameter.
TEST(StepAllocTest, Memory_StateBytesPerParameter_EqualTorchMomentumBuffers) {
  const int64_t n16 = 64 * 32, n32 = 48 * 16;
  std::vector<kernels::bf16_t> w16(n16), g16(n16);
  const std::vector<float> v = RandomValues(n16, 3);
  for (int64_t i = 0; i < n16; ++i) {
    w16[i] = kernels::FloatToBf16(v[i]);
    g16[i] = kernels::FloatToBf16(v[n16 - 1 - i]);
  }
  std::vector<float> w32 = RandomValues(n32, 4), g32 = RandomValues(n32, 5);
  ParamView p16;
  p16.name = "bf16";
  p16.data = w16.data();
  p16.grad = g16.data();
  p16.dtype = p16.grad_dtype = DType::kBFloat16;
  p16.local_shape = {64, 32};
  ParamView p32;
  p32.name = "fp32";
  p32.data = w32.data();
  p32.grad = g32.data();
  p32.local_shape = {48, 16};
  struct Case {
    MomentumDType dtype;
    int64_t momentum_bytes;
  };
  for (const Case& c : {Case{MomentumDType::kParam, 2 * n16 + 4 * n32},
                        Case{MomentumDType::kFloat32, 4 * (n16 + n32)}}) {
    MuonOptions options;
    options.momentum_dtype = c.dtype;
    absl::StatusOr<std::unique_ptr<Muon>> opt =
        Muon::Create({p16, p32}, options);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (int step = 0; step < 2; ++step) {
      const OptimizerMemory mem = (*opt)->memory();
      EXPECT_EQ(mem.momentum_bytes, c.momentum_bytes);
      EXPECT_EQ(mem.state_bytes, c.momentum_bytes + 2 * 8);
      EXPECT_EQ(mem.snapshot_bytes, 0);
      // Nothing but the state and the step buffers was ever allocated.
      EXPECT_EQ(mem.peak_bytes, mem.state_bytes + mem.buffer_bytes);
      ASSERT_TRUE((*opt)->Step().ok());
    }
  }
}

// U (Nesterov's look-ahead) and O live only in the executor's bucket
// slots: in a world of one each slot holds its bucket's U and O (8 bytes
// per element), and there are prefetch_count + 1 slots (1 in sequential
// mode; never more than buckets), so the step buffers shrink with the
// bucket size.
TEST(StepAllocTest, Memory_StepBuffers_AtMostPrefetchPlusOneBuckets) {
  for (int64_t bucket_bytes : {int64_t{4096}, int64_t{1} << 20}) {
    for (int prefetch : {-1, 0, 2}) {  // -1: sequential
      WorldOfOne world(absl::StrCat("memory", bucket_bytes, prefetch));
      Model m = MakeModel();
      absl::StatusOr<DistributedConfig> config = world.Config(m.ptrs.size());
      ASSERT_TRUE(config.ok()) << config.status();
      config->execution.set_bucket_size_bytes(bucket_bytes);
      if (prefetch >= 0) {
        config->execution.set_async_gpu_parallelism(true);
        config->execution.set_prefetch_count(prefetch);
      }
      absl::StatusOr<std::unique_ptr<Muon>> opt =
          Muon::Create(m.ptrs, MuonOptions{}, *config);
      ASSERT_TRUE(opt.ok()) << opt.status();
      ASSERT_TRUE((*opt)->Step().ok());
      const v1::Plan& plan = (*opt)->plan();
      int64_t largest = 0;  // elements of the largest bucket
      for (const v1::Bucket& b : plan.buckets()) {
        int64_t numel = 0;
        for (int mi : b.matrices()) {
          numel += plan.matrices(mi).rows() * plan.matrices(mi).cols();
        }
        largest = std::max(largest, numel);
      }
      // No more slots than buckets.
      const int slots =
          prefetch >= 0 ? std::min(prefetch + 1, plan.buckets_size()) : 1;
      EXPECT_EQ(plan.schedule().slots(), slots);
      const OptimizerMemory mem = (*opt)->memory();
      SCOPED_TRACE(absl::StrCat("bucket_size_bytes ", bucket_bytes,
                                ", prefetch ", prefetch, ", ",
                                plan.buckets_size(), " buckets"));
      EXPECT_EQ(mem.buffer_bytes, slots * 8 * largest);
      EXPECT_EQ(mem.state_bytes, mem.momentum_bytes + 8 * 4);
      EXPECT_EQ(mem.peak_bytes, mem.state_bytes + mem.buffer_bytes);
      EXPECT_EQ((*opt)->last_step_stats().buffer_bytes, mem.buffer_bytes);
      if (bucket_bytes == 4096) {
        EXPECT_GT(plan.buckets_size(), 1);
      }
    }
  }
}

// The CPU engine, recording the shapes it is asked to reserve for.
class ReserveRecordingEngine final : public kernels::NsEngine {
 public:
  explicit ReserveRecordingEngine(std::set<std::pair<int64_t, int64_t>>* log)
      : inner_(kernels::MakeCpuNsEngine()), log_(log) {}
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const kernels::NewtonSchulzOptions& options,
                             float* out) override {
    return inner_->Orthogonalize(u, rows, cols, options, out);
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    log_->insert({rows, cols});
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return inner_->name(); }

 private:
  std::unique_ptr<kernels::NsEngine> inner_;
  std::set<std::pair<int64_t, int64_t>>* log_;
};

TEST(StepAllocTest, Create_ReservesEachOwnedShape_NotMaxRowsTimesMaxCols) {
  WorldOfOne world("reserve");
  // A 24 x 80 and an 80 x 24 matrix (as 4096 x 11008 and 11008 x 4096):
  // max rows x max cols would be 80 x 80.
  std::vector<Parameter> params(2);
  std::vector<Parameter*> ptrs;
  for (int i = 0; i < 2; ++i) {
    params[i].name = absl::StrCat("w", i);
    params[i].global_shape =
        i == 0 ? std::vector<int64_t>{24, 80} : std::vector<int64_t>{80, 24};
    params[i].local_shape = params[i].global_shape;
    params[i].data = RandomValues(24 * 80, i + 1);
    params[i].grad = RandomValues(24 * 80, i + 10);
    ptrs.push_back(&params[i]);
  }
  absl::StatusOr<DistributedConfig> config = world.Config(ptrs.size());
  ASSERT_TRUE(config.ok()) << config.status();
  std::set<std::pair<int64_t, int64_t>> reserved;
  config->ns_engine_factory =
      [&]() -> absl::StatusOr<std::unique_ptr<kernels::NsEngine>> {
    return std::make_unique<ReserveRecordingEngine>(&reserved);
  };
  absl::StatusOr<std::unique_ptr<Muon>> opt =
      Muon::Create(ptrs, MuonOptions{}, *config);
  ASSERT_TRUE(opt.ok()) << opt.status();
  using Shape = std::pair<int64_t, int64_t>;
  EXPECT_THAT(reserved, ::testing::ElementsAre(Shape{24, 80}, Shape{80, 24}));
  EXPECT_TRUE((*opt)->Step().ok());
}

// The CPU engine, counting what its Orthogonalize calls allocate.
class AllocationCountingEngine final : public kernels::NsEngine {
 public:
  explicit AllocationCountingEngine(int64_t* orthogonalize_allocations)
      : inner_(kernels::MakeCpuNsEngine()), count_(orthogonalize_allocations) {}
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const kernels::NewtonSchulzOptions& options,
                             float* out) override {
    allocations = 0;
    counting = true;
    absl::Status status = inner_->Orthogonalize(u, rows, cols, options, out);
    counting = false;
    *count_ += allocations.load();
    return status;
  }
  absl::Status Reserve(int64_t rows, int64_t cols,
                       const kernels::NewtonSchulzOptions& options) override {
    return inner_->Reserve(rows, cols, options);
  }
  std::string name() const override { return inner_->name(); }

 private:
  std::unique_ptr<kernels::NsEngine> inner_;
  int64_t* count_;
};

// Create reserves the engine for the method each owned shape runs, so the
// first step's Gram iterations (its two extra m x m buffers) allocate
// nothing either.
TEST(StepAllocTest, Create_GramMethod_FirstStepNewtonSchulzAllocatesNothing) {
  openblas_set_num_threads(1);
  for (kernels::NewtonSchulzMethod method :
       {kernels::NewtonSchulzMethod::kGram,
        kernels::NewtonSchulzMethod::kAuto}) {
    WorldOfOne world("reserve-gram");
    Model m = MakeModel();
    absl::StatusOr<DistributedConfig> config = world.Config(m.ptrs.size());
    ASSERT_TRUE(config.ok()) << config.status();
    int64_t orthogonalize_allocations = 0;
    config->ns_engine_factory =
        [&]() -> absl::StatusOr<std::unique_ptr<kernels::NsEngine>> {
      return std::make_unique<AllocationCountingEngine>(
          &orthogonalize_allocations);
    };
    MuonOptions options;
    options.ns_method = method;
    absl::StatusOr<std::unique_ptr<Muon>> opt =
        Muon::Create(m.ptrs, options, *config);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ASSERT_TRUE((*opt)->Step().ok());
    EXPECT_EQ(orthogonalize_allocations, 0)
        << kernels::NewtonSchulzMethodName(method);
  }
}

}  // namespace
}  // namespace muon
