#include "device/runtime.h"

#include "absl/status/status.h"
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
  Allocator* allocator() override { return HostAllocator(); }
};

}  // namespace

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
