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
  Allocator* pinned_host_allocator() override { return HostAllocator(); }
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
  absl::Status CopyToHostOnStream(Stream* stream, void* host_dst,
                                  const void* src, int64_t bytes) override {
    return MemcpyOnStream("CopyToHostOnStream", stream, host_dst, src, bytes);
  }
  absl::Status CopyFromHostOnStream(Stream* stream, void* dst,
                                    const void* host_src,
                                    int64_t bytes) override {
    return MemcpyOnStream("CopyFromHostOnStream", stream, dst, host_src, bytes);
  }
  absl::Status Zero(void* dst, int64_t bytes) override {
    absl::Status s = CheckCopyArguments("Zero", dst, dst, bytes);
    if (s.ok() && bytes > 0) std::memset(dst, 0, bytes);
    return s;
  }

 private:
  // memcpy as work of the host stream `stream`.
  absl::Status MemcpyOnStream(const char* what, Stream* stream, void* dst,
                              const void* src, int64_t bytes) {
    absl::Status s =
        CheckStreamCopyArguments(what, Device::Host(), stream, dst, src, bytes);
    if (!s.ok() || bytes == 0) return s;
    return stream->Launch([dst, src, bytes] {
      std::memcpy(dst, src, static_cast<size_t>(bytes));
      return absl::OkStatus();
    });
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

absl::Status CheckStreamCopyArguments(const char* what, const Device& device,
                                      const Stream* stream, const void* dst,
                                      const void* src, int64_t bytes) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the stream is null"));
  }
  if (stream->device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": stream \"", stream->name(), "\" is on ",
        stream->device().ToString(), ", not on ", device.ToString()));
  }
  return CheckCopyArguments(what, dst, src, bytes);
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
