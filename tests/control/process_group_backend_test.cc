// InitProcessGroup's backends: Gloo alone (CPU tensors), or NCCL on a CUDA
// device with a Gloo group beside it for the control values; and Muon over
// CUDA parameters through such a group (world of one: the NCCL group is
// made, the control group carries the finite check and the commit). The
// NCCL cases need a GPU: without one they check the error instead (a
// build without CUDA, or no such device).
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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
#include "tests/control/process_group_test_util.h"
#include "tests/gpu_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::RandomValues;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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

// An IPv6 MASTER_ADDR (as torchrun accepts it) gives the embedded
// coordinator's address in brackets: without them it did not split into
// host and port, and the ranks fell back to loopback.
TEST(ProcessGroupOptionsFromEnvTest, Ipv6MasterAddr_CoordinatorInBrackets) {
  ASSERT_EQ(setenv("RANK", "1", 1), 0);
  ASSERT_EQ(setenv("WORLD_SIZE", "2", 1), 0);
  ASSERT_EQ(setenv("MASTER_ADDR", "::1", 1), 0);
  ASSERT_EQ(setenv("MASTER_PORT", "29500", 1), 0);
  absl::StatusOr<ProcessGroupOptions> o = ProcessGroupOptionsFromEnv();
  for (const char* name :
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->coordinator_address, "[::1]:29501");
}

// MASTER_PORT is checked before the coordinator's default port (MASTER_PORT
// + 1) is computed: INT_MAX is named as itself, not as a wrapped port, and
// 65535 names the coordinator port 65536 it would need.
TEST(ProcessGroupOptionsFromEnvTest, MasterPortOutOfRange_NamedUnwrapped) {
  ASSERT_EQ(setenv("RANK", "1", 1), 0);
  ASSERT_EQ(setenv("WORLD_SIZE", "2", 1), 0);
  ASSERT_EQ(setenv("MASTER_PORT", "2147483647", 1), 0);
  absl::StatusOr<ProcessGroupOptions> huge = ProcessGroupOptionsFromEnv();
  ASSERT_EQ(setenv("MASTER_PORT", "65535", 1), 0);
  absl::StatusOr<ProcessGroupOptions> last = ProcessGroupOptionsFromEnv();
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT"}) {
    unsetenv(name);
  }
  EXPECT_THAT(huge.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("MASTER_PORT=2147483647 is not a TCP "
                                       "port"),
                             Not(HasSubstr("-2147483648")))));
  EXPECT_THAT(last.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                      AllOf(HasSubstr("coordinator port 65536"),
                                            HasSubstr("MASTER_PORT=65535"))));
}

// An explicit job secret of only whitespace is refused, naming the field
// and the rank, before anything starts.
TEST(ProcessGroupBackendTest, BlankJobSecret_InvalidArgument) {
  ProcessGroupOptions options = WorldOfOne(ProcessGroupBackend::kGloo);
  options.job_secret = "   ";
  EXPECT_THAT(InitProcessGroup(options).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 0: "),
                             HasSubstr("ProcessGroupOptions.job_secret is only "
                                       "whitespace"))));
}

// A directory of this test under TEST_TMPDIR.
std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, ".", getpid());
  mkdir(dir.c_str(), 0700);
  return dir;
}

// Rank 0 writes its address to path.<generation>, numbered per process
// when no generation is given; a lookup of a generation nobody published
// times out naming the file, and a file holding no host:port is refused.
TEST(FileAddressExchangeTest, PublishThenLookup_NumberedPerProcess) {
  const std::string path = TestDir("exchange") + "/coordinator";
  ASSERT_THAT(FileAddressExchange(path).publish("127.0.0.1:1234"), IsOk());
  absl::StatusOr<std::string> first =
      FileAddressExchange(path, 1).lookup(absl::Seconds(5));
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(*first, "127.0.0.1:1234");
  EXPECT_THAT(FileAddressExchange(path, 2).lookup(absl::Milliseconds(100)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(path + ".2"),
                             HasSubstr("rank 0 did not publish"))));
  // The second exchange of this process on `path` is generation 2.
  ASSERT_THAT(FileAddressExchange(path).publish("[::1]:99"), IsOk());
  absl::StatusOr<std::string> second =
      FileAddressExchange(path, 2).lookup(absl::Seconds(5));
  ASSERT_THAT(second, IsOk());
  EXPECT_EQ(*second, "[::1]:99");
  {
    std::ofstream bad(path + ".7");
    bad << "no port here\n";
  }
  EXPECT_THAT(
      FileAddressExchange(path, 7).lookup(absl::Seconds(5)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not host:port")));
}

// Three ranks whose rank 0 embeds the coordinator at a port the kernel
// picks and hands its address over through the file: all join and pass a
// barrier. No fixed port is involved, so none can be taken.
TEST(FileAddressExchangeTest, InitProcessGroup_ThreeRanksFindKernelPickedPort) {
  const std::string path = TestDir("exchange3") + "/coordinator";
  constexpr int kWorld = 3;
  std::vector<absl::Status> statuses(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      absl::StatusOr<std::unique_ptr<ProcessGroup>> pg = InitProcessGroup(
          LocalGroupOptions(rank, kWorld, path, "exchange-test-secret"));
      statuses[rank] = pg.ok() ? (*pg)->comm->Barrier() : pg.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_THAT(statuses[rank], IsOk()) << "rank " << rank;
  }
}

// MUON_COORDINATOR_FILE (muonrun on one node) makes rank 0 bind a port the
// kernel picks and publish it there, whatever MASTER_PORT is; an explicit
// MUON_COORDINATOR_PORT keeps the fixed port.
TEST(ProcessGroupOptionsFromEnvTest,
     CoordinatorFile_KernelPickedPortAndExchange) {
  ASSERT_EQ(setenv("RANK", "1", 1), 0);
  ASSERT_EQ(setenv("WORLD_SIZE", "4", 1), 0);
  ASSERT_EQ(setenv("MASTER_PORT", "29500", 1), 0);
  ASSERT_EQ(setenv("MUON_COORDINATOR_FILE", "/nonexistent/coordinator", 1), 0);
  absl::StatusOr<ProcessGroupOptions> with_file = ProcessGroupOptionsFromEnv();
  ASSERT_EQ(setenv("MUON_COORDINATOR_PORT", "29600", 1), 0);
  absl::StatusOr<ProcessGroupOptions> fixed = ProcessGroupOptionsFromEnv();
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT",
                           "MUON_COORDINATOR_FILE", "MUON_COORDINATOR_PORT"}) {
    unsetenv(name);
  }
  ASSERT_THAT(with_file, IsOk());
  EXPECT_TRUE(with_file->embed_coordinator);
  EXPECT_EQ(with_file->embedded_port, 0);
  EXPECT_TRUE(with_file->address_exchange.enabled());
  EXPECT_EQ(with_file->coordinator_address, "");
  ASSERT_THAT(fixed, IsOk());
  EXPECT_EQ(fixed->embedded_port, 29600);
  EXPECT_FALSE(fixed->address_exchange.enabled());
  EXPECT_EQ(fixed->coordinator_address, "127.0.0.1:29600");
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
