// A warm optimizer step allocates nothing on the stepping thread: the step
// executor preallocates its buffers and timing records, and step reports
// are filled into pooled objects whose storage is reused. (Gloo's own
// collectives may allocate inside the library; this test uses a world of
// one, where no collective runs.)
#include <cblas.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/local_communicator.h"
#include "client/muon.h"
#include "gtest/gtest.h"
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
  CoordinatorService::Options so;
  so.job_id = "alloc";
  so.world_size = 1;
  CoordinatorService service(so);
  LocalCoordinationClient client(&service);
  std::unique_ptr<Communicator> comm = LocalCommunicator::Create();
  Model m = MakeModel();
  std::vector<ParamPlacement> placements(
      m.ptrs.size(), ParamPlacement{{Placement::Replicate()}, {}});
  absl::StatusOr<DistributedConfig> config = CreateMeshConfig(
      Mesh{{"dp_replicate"}, {1}}, placements, comm.get(), &client);
  ASSERT_TRUE(config.ok()) << config.status();
  config->async_gpu_parallelism = true;
  config->prefetch_count = 1;
  {
    absl::StatusOr<std::unique_ptr<Muon>> opt =
        Muon::Create(m.ptrs, MuonOptions{}, *config);
    ASSERT_TRUE(opt.ok()) << opt.status();
    // The counter sees allocations: the first step fills a fresh pooled
    // report, whose fields get their storage then.
    EXPECT_GT(CountStepAllocations(**opt, 0), 0);
    // Warm every pooled report (capacity 64 + 1) once.
    EXPECT_EQ(CountStepAllocations(**opt, 80), 0);
  }
  service.Shutdown();
}

}  // namespace
}  // namespace muon
