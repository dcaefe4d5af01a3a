// NcclCommunicator in the default build (no --config=cuda): Create returns
// Unimplemented and NcclDeviceCount returns 0, so code that can use NCCL
// compiles, links and falls back (e.g. to Gloo) without the CUDA toolkit.
// No NcclCommunicator is ever constructed here; the members below exist for
// the linker only.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/nccl_communicator.h"

namespace muon {
namespace {

constexpr char kNotBuilt[] =
    "NCCL communicator: built without CUDA; build with --config=cuda";

absl::Status NotBuilt(absl::string_view op) {
  return absl::UnimplementedError(absl::StrCat(kNotBuilt, " (", op, ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int rank, int world_size, CoordinationClient* store,
    const NcclOptions& options) {
  (void)rank;
  (void)world_size;
  (void)store;
  (void)options;
  return absl::UnimplementedError(kNotBuilt);
}

NcclCommunicator::NcclCommunicator(int rank, int world_size,
                                   const NcclOptions& options,
                                   std::vector<int> root_ranks,
                                   std::string group_name)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      root_ranks_(std::move(root_ranks)),
      group_name_(std::move(group_name)) {}

NcclCommunicator::~NcclCommunicator() = default;

absl::Status NcclCommunicator::AllToAllV(const float*,
                                         const std::vector<int64_t>&, float*,
                                         const std::vector<int64_t>&) {
  return NotBuilt("AllToAllV");
}

absl::Status NcclCommunicator::AllToAllVOnStream(device::Stream*, const float*,
                                                 const std::vector<int64_t>&,
                                                 float*,
                                                 const std::vector<int64_t>&) {
  return NotBuilt("AllToAllVOnStream");
}

absl::Status NcclCommunicator::AsyncError() { return NotBuilt("AsyncError"); }

absl::Status NcclCommunicator::AllGatherV(const float*, int64_t, float*,
                                          const std::vector<int64_t>&) {
  return NotBuilt("AllGatherV");
}

absl::Status NcclCommunicator::Broadcast(float*, int64_t, int) {
  return NotBuilt("Broadcast");
}

absl::Status NcclCommunicator::Barrier() { return NotBuilt("Barrier"); }

absl::Status NcclCommunicator::Send(const float*, int64_t, int, uint32_t) {
  return NotBuilt("Send");
}

absl::Status NcclCommunicator::Recv(float*, int64_t, int, uint32_t) {
  return NotBuilt("Recv");
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(
    const std::vector<int>&) {
  return NotBuilt("Split");
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::SplitByColor(int, int) {
  return NotBuilt("SplitByColor");
}

void NcclCommunicator::Abort() { aborted_.store(true); }

}  // namespace muon
