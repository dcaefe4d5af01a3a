// One device's factory of streams, events and memory (XLA's
// StreamExecutor for one device; PyTorch's c10::impl::DeviceGuardImpl).
// The host runtime always exists; a CUDA runtime exists in builds with
// --config=cuda on a machine with that device.
#ifndef MUON_DEVICE_RUNTIME_H_
#define MUON_DEVICE_RUNTIME_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "device/device.h"
#include "device/memory.h"
#include "device/stream.h"

namespace muon {
namespace device {

// Thread-safe.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Device device() const = 0;
  // A new stream (CUDA: non-blocking, cudaStreamNonBlocking). `name` shows
  // in errors and traces. Errors: the CUDA error.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(
      const std::string& name) = 0;
  // A new event (CUDA: cudaEventDisableTiming). Errors: the CUDA error.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent(
      const std::string& name) = 0;
  // The device's allocator (not owned; lives as long as the process).
  virtual Allocator* allocator() = 0;
};

// The process-wide host runtime (host streams: device/host_stream.h).
Runtime* HostRuntime();

// The runtime of `device` (process-wide, created on first use).
// Errors: Unimplemented (CUDA in a build without --config=cuda);
// FailedPrecondition (no such CUDA device: names the count and CUDA's
// message).
absl::StatusOr<Runtime*> GetRuntime(const Device& device);

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_RUNTIME_H_
