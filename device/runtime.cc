#include "device/runtime.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "device/cuda_runtime.h"
#include "device/host_stream.h"

namespace muon {
namespace device {
namespace {

class HostRuntimeImpl final : public Runtime {
 public:
  Device device() const override { return Device::Host(); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(
      const std::string& name) override {
    return std::unique_ptr<Stream>(new HostStream(name));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent(
      const std::string& name) override {
    return std::unique_ptr<Event>(new HostEvent(name));
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateTimingEvent(
      const std::string& name) override {
    return CreateEvent(name);
  }
  Allocator* allocator() override { return HostAllocator(); }
  absl::StatusOr<std::unique_ptr<Stream>> WrapStream(
      void*, const std::string& name) override {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot adopt stream \"", name,
        "\" on the host: host streams have no native handle (pass no "
        "stream for CPU tensors)"));
  }
  absl::Status CopyToHost(void* host_dst, const void* src,
                          int64_t bytes) override {
    absl::Status s = CheckCopyArguments("CopyToHost", host_dst, src, bytes);
    if (s.ok() && bytes > 0) std::memcpy(host_dst, src, bytes);
    return s;
  }
  absl::Status CopyFromHost(void* dst, const void* host_src,
                            int64_t bytes) override {
    absl::Status s = CheckCopyArguments("CopyFromHost", dst, host_src, bytes);
    if (s.ok() && bytes > 0) std::memcpy(dst, host_src, bytes);
    return s;
  }
  absl::Status Zero(void* dst, int64_t bytes) override {
    absl::Status s = CheckCopyArguments("Zero", dst, dst, bytes);
    if (s.ok() && bytes > 0) std::memset(dst, 0, bytes);
    return s;
  }
};

}  // namespace

absl::Status CheckCopyArguments(const char* what, const void* dst,
                                const void* src, int64_t bytes) {
  if (bytes < 0 || (bytes > 0 && (dst == nullptr || src == nullptr))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", bytes, " bytes from ",
                     src == nullptr ? "null" : "a pointer", " to ",
                     dst == nullptr ? "null" : "a pointer",
                     " (bytes must be >= 0 and pointers non-null)"));
  }
  return absl::OkStatus();
}

Runtime* HostRuntime() {
  static Runtime* const runtime = new HostRuntimeImpl();
  return runtime;
}

absl::StatusOr<Runtime*> GetRuntime(const Device& device) {
  if (device.is_host()) return HostRuntime();
  return CudaRuntime(device.ordinal);
}

}  // namespace device
}  // namespace muon
