// InitProcessGroup's backends: Gloo alone (CPU tensors), or NCCL on a CUDA
// device with a Gloo group beside it for the control values; and Muon over
// CUDA parameters through such a group (world of one: the NCCL group is
// made, the control group carries the finite check and the commit). The
// NCCL cases need a GPU: without one they check the error instead (a
// build without CUDA, or no such device).
#include <stdlib.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "control/process_group.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/embedded_coordinator.h"
#include "tests/client/rank_threads.h"
#include "tests/gpu_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::RandomValues;
using ::testing::AllOf;
using ::testing::HasSubstr;

ProcessGroupOptions WorldOfOne(ProcessGroupBackend backend) {
  ProcessGroupOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.embed_coordinator = true;
  o.start_embedded_coordinator = StartEmbeddedCoordinator;
  o.embedded_host = "127.0.0.1";
  o.embedded_port = 0;
  o.timeout = absl::Seconds(20);
  o.backend = backend;
  return o;
}

TEST(ProcessGroupBackendTest, Parse_TorchNames_OthersNamedInError) {
  absl::StatusOr<ProcessGroupBackend> gloo = ParseProcessGroupBackend("gloo");
  absl::StatusOr<ProcessGroupBackend> nccl = ParseProcessGroupBackend("nccl");
  ASSERT_THAT(gloo, IsOk());
  ASSERT_THAT(nccl, IsOk());
  EXPECT_EQ(*gloo, ProcessGroupBackend::kGloo);
  EXPECT_EQ(*nccl, ProcessGroupBackend::kNccl);
  EXPECT_THAT(ParseProcessGroupBackend("mpi"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"mpi\""), HasSubstr("\"nccl\""))));
}

TEST(ProcessGroupBackendTest, Gloo_NoSeparateControlGroup) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg =
      InitProcessGroup(WorldOfOne(ProcessGroupBackend::kGloo));
  ASSERT_THAT(pg, IsOk());
  EXPECT_EQ((*pg)->comm->backend(), "gloo");
  EXPECT_EQ((*pg)->control_comm, nullptr);
  EXPECT_EQ((*pg)->control(), (*pg)->comm.get());
}

TEST(ProcessGroupBackendTest, NegativeCudaDevice_InvalidArgument) {
  ProcessGroupOptions o = WorldOfOne(ProcessGroupBackend::kNccl);
  o.cuda_device = -2;
  EXPECT_THAT(InitProcessGroup(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("cuda_device -2 is negative")));
}

// MUON_COORDINATOR without a port is refused by name before anything
// connects (it used to surface as a Gloo rendezvous failure).
TEST(ProcessGroupOptionsFromEnvTest, CoordinatorWithoutPort_InvalidArgument) {
  ASSERT_EQ(setenv("RANK", "0", 1), 0);
  ASSERT_EQ(setenv("WORLD_SIZE", "2", 1), 0);
  ASSERT_EQ(setenv("MUON_COORDINATOR", "127.0.0.1:", 1), 0);
  absl::StatusOr<ProcessGroupOptions> o = ProcessGroupOptionsFromEnv();
  unsetenv("MUON_COORDINATOR");
  EXPECT_THAT(o.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("MUON_COORDINATOR=\"127.0.0.1:\""),
                             HasSubstr("is not host:port"))));
  ASSERT_EQ(setenv("MUON_COORDINATOR", "127.0.0.1:29400", 1), 0);
  o = ProcessGroupOptionsFromEnv();
  unsetenv("MUON_COORDINATOR");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->coordinator_address, "127.0.0.1:29400");
}

// Without a GPU: the NCCL group's error, naming the device. With one: an
// NCCL data path on cuda:0 and a Gloo control group.
TEST(ProcessGroupBackendTest, Nccl_MakesNcclGroupAndGlooControlGroup) {
  std::string reason;
  const bool gpu = device::CudaDeviceCount(&reason) > 0;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> pg =
      InitProcessGroup(WorldOfOne(ProcessGroupBackend::kNccl));
  if (!gpu) {
    EXPECT_FALSE(pg.ok());
    EXPECT_TRUE(absl::IsUnimplemented(pg.status()) ||
                absl::IsFailedPrecondition(pg.status()))
        << pg.status();
    EXPECT_THAT(pg.status().message(), HasSubstr("the NCCL group on cuda:0"));
    MUON_SKIP_OR_FAIL_UNLESS_GPU(true, reason);
  }
  ASSERT_THAT(pg, IsOk());
  EXPECT_EQ((*pg)->comm->backend(), "nccl");
  EXPECT_EQ((*pg)->comm->buffer_device(), device::Device::Cuda(0));
  ASSERT_NE((*pg)->control_comm, nullptr);
  EXPECT_EQ((*pg)->control_comm->backend(), "gloo");
  EXPECT_TRUE((*pg)->control()->buffer_device().is_host());
  EXPECT_THAT((*pg)->comm->Barrier(), IsOk());
}

// Muon over one CUDA parameter through an NCCL group of one, with the
// finite check and transactional steps on the control group: the same
// bits as the same optimizer without a group.
TEST(ProcessGroupBackendTest, Nccl_MuonOverCudaParams_SameBitsAsNoGroup) {
  MUON_SKIP_OR_FAIL_UNLESS_CUDA_DEVICE();
  absl::StatusOr<device::Runtime*> rt =
      device::GetRuntime(device::Device::Cuda(0));
  ASSERT_THAT(rt, IsOk());
  constexpr int64_t kRows = 64, kCols = 96, kN = kRows * kCols;
  MuonOptions options;
  options.transactional_step = true;
  options.gpu_precision = kernels::GpuPrecision::kFp32;
  std::vector<std::vector<float>> results;
  for (bool with_group : {false, true}) {
    std::unique_ptr<ProcessGroup> pg;
    std::optional<DistributedConfig> config;
    if (with_group) {
      absl::StatusOr<std::unique_ptr<ProcessGroup>> made =
          InitProcessGroup(WorldOfOne(ProcessGroupBackend::kNccl));
      ASSERT_THAT(made, IsOk());
      pg = *std::move(made);
      absl::StatusOr<DistributedConfig> c = CreateMeshConfig(
          Mesh::OneDim(1, "dp_shard"), {ParamPlacement{{Placement::Shard(0)}}},
          pg->comm.get(), pg->coordinator.get(), pg->incarnation);
      ASSERT_THAT(c, IsOk());
      c->state.control_communicator = pg->control();
      config = *std::move(c);
    }
    device::DeviceBuffer<float> w =
        *device::DeviceBuffer<float>::Allocate((*rt)->allocator(), kN);
    device::DeviceBuffer<float> g =
        *device::DeviceBuffer<float>::Allocate((*rt)->allocator(), kN);
    const std::vector<float> w0 = RandomValues(kN, 1);
    const std::vector<float> g0 = RandomValues(kN, 2);
    ASSERT_THAT((*rt)->CopyFromHost(w.data(), w0.data(), kN * 4), IsOk());
    ASSERT_THAT((*rt)->CopyFromHost(g.data(), g0.data(), kN * 4), IsOk());
    ParamView v;
    v.name = "w";
    v.data = w.data();
    v.grad = g.data();
    v.local_shape = {kRows, kCols};
    v.device = device::Device::Cuda(0);
    absl::StatusOr<std::unique_ptr<Muon>> muon =
        Muon::Create({v}, options, std::move(config));
    ASSERT_THAT(muon, IsOk());
    ASSERT_THAT((*muon)->Step(), IsOk());
    ASSERT_THAT((*muon)->Step(), IsOk());
    std::vector<float> out(kN);
    ASSERT_THAT((*rt)->CopyToHost(out.data(), w.data(), kN * 4), IsOk());
    results.push_back(out);
  }
  EXPECT_TRUE(BitwiseEqual(results[1], results[0]));
}

}  // namespace
}  // namespace muon
