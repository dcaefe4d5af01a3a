// device/cuda_runtime.h in builds without --config=cuda: no CUDA device.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_runtime.h"

namespace muon {
namespace device {

absl::StatusOr<Runtime*> CudaRuntime(int ordinal) {
  return absl::UnimplementedError(
      absl::StrCat("cuda:", ordinal,
                   " requested but this build has no CUDA support (build "
                   "with --config=cuda)"));
}

CudaDeviceGuard::CudaDeviceGuard(int) {}
CudaDeviceGuard::~CudaDeviceGuard() = default;
absl::Status CudaDeviceGuard::status() const {
  return absl::UnimplementedError(
      "CudaDeviceGuard: built without CUDA support (build with --config=cuda)");
}

int CudaDeviceCount(std::string* reason) {
  if (reason != nullptr) {
    *reason = "built without CUDA support (build with --config=cuda)";
  }
  return 0;
}

absl::StatusOr<std::string> CudaDeviceDescription(int ordinal) {
  return absl::UnimplementedError(
      absl::StrCat("cuda:", ordinal,
                   ": built without CUDA support (build with --config=cuda)"));
}

absl::StatusOr<int> CudaStreamPriority(Stream*) {
  return absl::UnimplementedError(
      "CudaStreamPriority: built without CUDA support (build with "
      "--config=cuda)");
}

absl::Status CudaErrorToStatus(int cuda_error, const char* expr) {
  if (cuda_error == 0) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      expr, ": CUDA error ", cuda_error, " in a build without CUDA support"));
}

}  // namespace device
}  // namespace muon
