// One device's factory of streams, events and memory (XLA's
// StreamExecutor for one device; PyTorch's c10::impl::DeviceGuardImpl).
// The host runtime always exists; a CUDA runtime exists in builds with
// --config=cuda on a machine with that device.
#ifndef MUON_DEVICE_RUNTIME_H_
#define MUON_DEVICE_RUNTIME_H_

#include <cstdint>
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
  // A new stream whose work the device schedules before normal streams'
  // when both wait for free multiprocessors (CUDA: cudaStreamNonBlocking
  // at the greatest priority of cudaDeviceGetStreamPriorityRange, as
  // PyTorch's torch.cuda.Stream(priority=-1) and the high-priority
  // communication streams of FSDP and NCCL process groups). Priorities
  // change the order in which ready work runs, never its results. The
  // host has no priorities: the same as CreateStream. Errors: the CUDA
  // error.
  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateHighPriorityStream(
      const std::string& name) {
    return CreateStream(name);
  }
  // A new event (CUDA: cudaEventDisableTiming). Errors: the CUDA error.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent(
      const std::string& name) = 0;
  // A new event that also times (Event::SecondsSince; CUDA: with timing,
  // cudaEventDefault, which makes its records a little slower). Host:
  // the same as CreateEvent (host events always time).
  // Errors: the CUDA error.
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateTimingEvent(
      const std::string& name) = 0;
  // The device's allocator (not owned; lives as long as the process).
  virtual Allocator* allocator() = 0;
  // An allocator of page-locked host memory for staging copies to and from
  // this device (not owned; lives as long as the process), as PyTorch's
  // Tensor.pin_memory(). Its buffers are host memory (its device() is the
  // host), 64-byte aligned and zero-filled as HostAllocator's. CUDA
  // (cudaHostAlloc with cudaHostAllocPortable; cudaFreeHost): the copies
  // move them by DMA at the bus's rate, with no bounce through the
  // driver's pageable staging. Host: HostAllocator().
  virtual Allocator* pinned_host_allocator() = 0;

  // A Stream over a stream created elsewhere, e.g. torch's current stream
  // (torch.cuda.current_stream().cuda_stream): `native` is a cudaStream_t
  // of this device (nullptr = CUDA's legacy default stream). Work launched
  // on it and events recorded on it act on that stream; it is neither
  // synchronized nor destroyed when the wrapper is.
  // Errors: InvalidArgument on the host (host streams have no native
  // handle to adopt).
  virtual absl::StatusOr<std::unique_ptr<Stream>> WrapStream(
      void* native, const std::string& name) = 0;

  // Copies `bytes` bytes from this device's memory `src` to host memory
  // `host_dst` (CopyToHost), or from host memory `host_src` to this
  // device's memory `dst` (CopyFromHost), blocking until done. Not ordered
  // after any stream: synchronize the streams that write or read the
  // device memory first. Host: memcpy.
  // Errors: InvalidArgument (bytes < 0, null pointer with bytes > 0); the
  // CUDA error.
  virtual absl::Status CopyToHost(void* host_dst, const void* src,
                                  int64_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src,
                                    int64_t bytes) = 0;
  // The same copies ordered on `stream` (a stream of this device): enqueued
  // after the stream's earlier work, and done when later work on the
  // stream starts (CUDA: cudaMemcpyAsync on the stream; host: memcpy on
  // the stream's thread). The host memory must stay valid, and unchanged
  // for CopyFromHostOnStream, until the stream has run the copy
  // (synchronize the stream, or an event recorded after the copy).
  // Errors: InvalidArgument (null stream, a stream of another device,
  // bytes < 0, null pointer with bytes > 0); the stream's (Stream::Launch).
  virtual absl::Status CopyToHostOnStream(Stream* stream, void* host_dst,
                                          const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyFromHostOnStream(Stream* stream, void* dst,
                                            const void* host_src,
                                            int64_t bytes) = 0;
  // Sets `bytes` bytes of this device's memory at `dst` to zero, blocking
  // until done (CUDA: cudaMemset on the device, no host buffer; host:
  // memset). Not ordered after any stream, as the copies.
  // Errors: InvalidArgument (bytes < 0, null pointer with bytes > 0); the
  // CUDA error.
  virtual absl::Status Zero(void* dst, int64_t bytes) = 0;
};

// The argument check both runtimes' copies share (bytes >= 0, non-null
// pointers when bytes > 0). Errors: InvalidArgument naming `what`.
absl::Status CheckCopyArguments(const char* what, const void* dst,
                                const void* src, int64_t bytes);

// The argument check of the stream-ordered copies (CheckCopyArguments, and
// a non-null `stream` on `device`). Errors: InvalidArgument naming `what`,
// the stream and both devices.
absl::Status CheckStreamCopyArguments(const char* what, const Device& device,
                                      const Stream* stream, const void* dst,
                                      const void* src, int64_t bytes);

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
