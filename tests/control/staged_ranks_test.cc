// Several ranks on one device over a Gloo process group, each layout
// bitwise equal to one device: ranks as threads of this test, each joining
// the group through InitProcessGroup (rank 0 embeds the coordinator), their
// parameters in the test device's memory. With a GPU the device is cuda:0
// and every rank's parameters are CUDA memory on that one GPU: Muon then
// stages each exchange through host memory (c10d's Gloo backend on CUDA
// tensors), which is how several rank processes share a GPU. Without one
// the same tests run with host parameters. Layouts: FSDP with uneven and
// empty shards, TP (column shards), HSDP, the async schedule with
// prefetch, and NorMuon (its row state travels with the exchange); fp32
// arithmetic on the GPU (gpu_precision "fp32", the CPU's bits). The bf16
// exchange, which rounds what the owner sends, cannot match one device:
// the 4 ranks on the test device are bitwise the same 4 ranks with host
// parameters, and differ from one device (the rounding took effect).
#include <cblas.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/muon_options.h"
#include "common/status_macros.h"
#include "control/process_group.h"
#include "device/cuda_runtime.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/single_device_reference.h"
#include "tests/control/process_group_test_util.h"
#include "tests/gpu_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::CutShards;
using ::muon::testing::DistributedRun;
using ::muon::testing::ExpectShardsMatchSingleDevice;
using ::muon::testing::MakeProblem;
using ::muon::testing::Problem;
using ::muon::testing::ProblemLayout;
using ::muon::testing::RankShards;
using ::muon::testing::RunOnRanks;
using ::muon::testing::SingleDeviceResult;
using ::muon::testing::UniformLayout;

// cuda:0 when a GPU is visible, else the host (a test failure instead
// under MUON_REQUIRE_GPU=1, where no GPU means a broken setup).
device::Device TestDevice() {
  std::string reason;
  if (device::CudaDeviceCount(&reason) > 0) return device::Device::Cuda(0);
  if (::muon::testing::GpuRequired()) {
    ADD_FAILURE() << "MUON_REQUIRE_GPU=1 but no CUDA device: " << reason;
  }
  return device::Device::Host();
}

// One rank's parameters copied into `dev` memory, and its optimizer over
// them. The buffers outlive the optimizer (declared first).
struct DeviceRank {
  std::vector<device::DeviceBuffer<float>> data;
  std::vector<device::DeviceBuffer<float>> grad;
  std::unique_ptr<Muon> muon;
};

// Makes rank `rank`'s parameters (its shards in *shards) on `rt`'s device
// and its optimizer with `config` (none: one device), then runs every step
// of `problem` (its gradients copied in before each) and copies the
// parameters back into *shards.
absl::Status StepOnDevice(const Problem& problem, device::Runtime* rt,
                          const MuonOptions& options,
                          std::optional<DistributedConfig> config,
                          RankShards* shards, DeviceRank* out) {
  std::vector<ParamView> views;
  for (Parameter& p : shards->params) {
    const int64_t n = static_cast<int64_t>(p.data.size());
    MUON_ASSIGN_OR_RETURN(
        device::DeviceBuffer<float> d,
        device::DeviceBuffer<float>::Allocate(rt->allocator(), n));
    MUON_ASSIGN_OR_RETURN(
        device::DeviceBuffer<float> g,
        device::DeviceBuffer<float>::Allocate(rt->allocator(), n));
    MUON_RETURN_IF_ERROR(rt->CopyFromHost(d.data(), p.data.data(), n * 4));
    ParamView v = p.View();
    v.data = d.data();
    v.grad = g.data();
    v.device = rt->device();
    views.push_back(v);
    out->data.push_back(std::move(d));
    out->grad.push_back(std::move(g));
  }
  MUON_ASSIGN_OR_RETURN(out->muon,
                        Muon::Create(views, options, std::move(config)));
  for (int s = 0; s < problem.steps(); ++s) {
    shards->SetGrads(problem, s);
    for (size_t k = 0; k < shards->params.size(); ++k) {
      const std::vector<float>& g = shards->params[k].grad;
      MUON_RETURN_IF_ERROR(rt->CopyFromHost(
          out->grad[k].data(), g.data(), static_cast<int64_t>(g.size()) * 4));
    }
    MUON_RETURN_IF_ERROR(out->muon->Step());
  }
  for (size_t k = 0; k < shards->params.size(); ++k) {
    std::vector<float>& d = shards->params[k].data;
    MUON_RETURN_IF_ERROR(rt->CopyToHost(d.data(), out->data[k].data(),
                                        static_cast<int64_t>(d.size()) * 4));
  }
  return absl::OkStatus();
}

struct Case {
  std::string name;
  ProblemLayout layout;
  v1::ExecutionOptions execution;
  bool normuon = false;
};

// 10 x 12 and 3 x 8 matrices: over 4 ranks, Shard(0) gives rows 3,3,3,1
// and 1,1,1,0 (an empty shard), Shard(1) columns 3,3,3,3 and 2,2,2,2.
std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back(
      {"fsdp_uneven_and_empty",
       UniformLayout(Mesh::OneDim(4, "dp_shard"), {Placement::Shard(0)}, 2),
       {}});
  cases.push_back(
      {"tp_column_shards",
       UniformLayout(Mesh::OneDim(4, "tp"), {Placement::Shard(1)}, 2),
       {}});
  Mesh hsdp;
  hsdp.names = {"dp_replicate", "dp_shard"};
  hsdp.sizes = {2, 2};
  cases.push_back(
      {"hsdp",
       UniformLayout(hsdp, {Placement::Replicate(), Placement::Shard(0)}, 2),
       {}});
  Case async{
      "fsdp_async_prefetch",
      UniformLayout(Mesh::OneDim(4, "dp_shard"), {Placement::Shard(0)}, 2),
      {}};
  async.execution.set_async_gpu_parallelism(true);
  async.execution.set_prefetch_count(2);
  async.execution.set_bucket_size_bytes(256);  // several buckets
  cases.push_back(async);
  Case normuon{
      "fsdp_normuon",
      UniformLayout(Mesh::OneDim(4, "dp_shard"), {Placement::Shard(0)}, 2),
      {}};
  normuon.normuon = true;
  cases.push_back(normuon);
  return cases;
}

// The 4 ranks of a run, in destruction order: the optimizers (run.muons)
// first, then their buffers, then the groups.
struct FourRanks {
  static constexpr int kWorld = 4;
  std::vector<std::unique_ptr<ProcessGroup>> groups{kWorld};
  std::vector<DeviceRank> ranks{kWorld};
  DistributedRun run{kWorld};
};

// Runs every step of `problem` on 4 ranks (threads) in `layout` with
// `execution`, each joining a Gloo group through InitProcessGroup (rank 0
// embeds the coordinator at a path named by `tag`), their parameters on
// `rt`'s device. Fails the test on any rank's error.
void RunFourRanks(const Problem& problem, device::Runtime* rt,
                  const MuonOptions& options, const ProblemLayout& layout,
                  const v1::ExecutionOptions& execution, const std::string& tag,
                  FourRanks* out) {
  // Per process: a file left by an earlier run (outside bazel, TempDir is
  // /tmp) would send the ranks to a dead coordinator.
  const std::string path = absl::StrCat(::testing::TempDir(), "/staged_", tag,
                                        "_coordinator.", getpid());
  std::vector<absl::Status> st = RunOnRanks(FourRanks::kWorld, [&](int rank) {
    MUON_ASSIGN_OR_RETURN(out->groups[rank], InitProcessGroup(LocalGroupOptions(
                                                 rank, FourRanks::kWorld, path,
                                                 "staged-ranks-secret")));
    std::vector<ParamPlacement> placements;
    for (const std::vector<Placement>& p : layout.placements) {
      placements.push_back(ParamPlacement{p});
    }
    MUON_ASSIGN_OR_RETURN(
        DistributedConfig config,
        CreateMeshConfig(layout.mesh, placements, out->groups[rank]->comm.get(),
                         out->groups[rank]->coordinator.get(),
                         out->groups[rank]->incarnation));
    config.execution = execution;
    MUON_ASSIGN_OR_RETURN(out->run.shards[rank],
                          CutShards(problem, layout, rank));
    MUON_RETURN_IF_ERROR(StepOnDevice(problem, rt, options, config,
                                      &out->run.shards[rank],
                                      &out->ranks[rank]));
    return absl::OkStatus();
  });
  for (int r = 0; r < FourRanks::kWorld; ++r) {
    ASSERT_THAT(st[r], IsOk()) << tag << " rank " << r;
    out->run.muons[r] = std::move(out->ranks[r].muon);
  }
}

class StagedRanksTest : public ::testing::TestWithParam<Case> {};

TEST_P(StagedRanksTest, FourRanksOnOneDevice_BitwiseOneDevice) {
  const Case& c = GetParam();
  const device::Device dev = TestDevice();
  std::cout << "device: " << dev.ToString() << "\n";
  absl::StatusOr<device::Runtime*> rt = device::GetRuntime(dev);
  ASSERT_THAT(rt, IsOk());
  const ScopedCudaVariantsForTesting allowed;
  MuonOptions options;
  options.gpu_precision = kernels::GpuPrecision::kFp32;
  options.normuon = c.normuon;
  const Problem problem = MakeProblem({{"a", {10, 12}}, {"b", {3, 8}}}, 2);
  openblas_set_num_threads(1);

  // One device: the whole tensors, no group.
  const ProblemLayout whole =
      UniformLayout(Mesh::OneDim(1, "dp_shard"), {Placement::Shard(0)}, 2);
  absl::StatusOr<RankShards> all = CutShards(problem, whole, 0);
  ASSERT_THAT(all, IsOk());
  DeviceRank one;
  ASSERT_THAT(StepOnDevice(problem, *rt, options, std::nullopt, &*all, &one),
              IsOk());
  SingleDeviceResult single;
  for (size_t k = 0; k < all->params.size(); ++k) {
    single.params.push_back(all->params[k].data);
    single.buffers.push_back(one.muon->momentum_buffer(static_cast<int>(k)));
  }

  FourRanks four;
  RunFourRanks(problem, *rt, options, c.layout, c.execution, c.name, &four);
  if (HasFatalFailure()) return;
  ExpectShardsMatchSingleDevice(problem, single, four.run);
}

// The bf16 exchange (the owner's result rounded to bf16 on the wire, every
// holder applying the same values), FSDP over 4 ranks: on the test device
// bitwise the same 4 ranks with host parameters, parameters and momentum,
// and not one device's fp32 result. On a GPU the host-parameter ranks run
// Newton-Schulz on the same GPU (host-staged): cuBLAS's fp32 bits are not
// OpenBLAS's, and the bf16 rounding would hide that only most of the time.
TEST(StagedRanksBf16Test, FourRanksBf16Exchange_BitwiseHostRanks) {
  const device::Device dev = TestDevice();
  std::cout << "device: " << dev.ToString() << "\n";
  absl::StatusOr<device::Runtime*> rt = device::GetRuntime(dev);
  ASSERT_THAT(rt, IsOk());
  MuonOptions options;
  options.gpu_precision = kernels::GpuPrecision::kFp32;
  const Problem problem = MakeProblem({{"a", {10, 12}}, {"b", {3, 8}}}, 2);
  openblas_set_num_threads(1);
  const ProblemLayout layout =
      UniformLayout(Mesh::OneDim(4, "dp_shard"), {Placement::Shard(0)}, 2);
  v1::ExecutionOptions bf16;
  bf16.set_exchange_dtype("bfloat16");
  FourRanks on_host, on_device, fp32;
  MuonOptions host_params = options;
  if (dev.is_cuda()) host_params.device = device::DeviceKind::kCuda;
  RunFourRanks(problem, device::HostRuntime(), host_params, layout, bf16,
               "bf16_host", &on_host);
  RunFourRanks(problem, *rt, options, layout, bf16, "bf16_device", &on_device);
  RunFourRanks(problem, device::HostRuntime(), options, layout, {}, "fp32_host",
               &fp32);
  if (HasFatalFailure()) return;
  bool any_differs_from_fp32 = false;
  for (int r = 0; r < FourRanks::kWorld; ++r) {
    const RankShards& h = on_host.run.shards[r];
    const RankShards& d = on_device.run.shards[r];
    ASSERT_EQ(h.params.size(), d.params.size());
    for (size_t k = 0; k < h.params.size(); ++k) {
      EXPECT_TRUE(BitwiseEqual(d.params[k].data, h.params[k].data))
          << "rank " << r << " parameter " << k;
      EXPECT_TRUE(BitwiseEqual(
          on_device.run.muons[r]->momentum_buffer(static_cast<int>(k)),
          on_host.run.muons[r]->momentum_buffer(static_cast<int>(k))))
          << "rank " << r << " parameter " << k;
      any_differs_from_fp32 |=
          h.params[k].data != fp32.run.shards[r].params[k].data;
    }
  }
  EXPECT_TRUE(any_differs_from_fp32) << "the bf16 exchange rounded nothing";
}

INSTANTIATE_TEST_SUITE_P(Layouts, StagedRanksTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace muon
