// CUDA streams, events and memory behind device/stream.h and
// device/memory.h (nvcc, --config=cuda only).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "device/cuda_check.cuh"
#include "device/cuda_runtime.h"
#include "device/runtime.h"

namespace muon {
namespace device {
namespace {

// Polls `query` (cudaEventQuery / cudaStreamQuery) until it is not
// cudaErrorNotReady or `timeout` passes, backing off from 10 us to 1 ms.
template <typename Query>
absl::Status PollUntilReady(Query query, absl::Duration timeout,
                            const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(10);
  while (true) {
    const cudaError_t e = query();
    if (e != cudaErrorNotReady) {
      if (e == cudaSuccess) return absl::OkStatus();
      (void)cudaGetLastError();
      return CudaErrorToStatus(static_cast<int>(e), what.c_str());
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": not finished within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(1));
  }
}

class CudaStream;

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event, std::string name, bool timing)
      : ordinal_(ordinal),
        event_(event),
        name_(std::move(name)),
        timing_(timing) {}
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }

  absl::Status Record(Stream* stream) override;
  bool Query() override { return cudaEventQuery(event_) != cudaErrorNotReady; }
  absl::Status Synchronize(absl::Duration timeout) override {
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    return PollUntilReady([this] { return cudaEventQuery(event_); }, timeout,
                          absl::StrCat("event \"", name_, "\""));
  }
  absl::StatusOr<double> SecondsSince(Event* earlier) override;
  const std::string& name() const override { return name_; }
  cudaEvent_t handle() const { return event_; }
  int ordinal() const { return ordinal_; }
  bool timing() const { return timing_; }

 private:
  const int ordinal_;
  const cudaEvent_t event_;  // Owned.
  const std::string name_;
  const bool timing_;  // Created without cudaEventDisableTiming.
};

absl::StatusOr<double> CudaEvent::SecondsSince(Event* earlier) {
  auto* other = dynamic_cast<CudaEvent*>(earlier);
  if (other == nullptr || other->ordinal() != ordinal_) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA event \"", name_, "\" on cuda:", ordinal_,
                     " timed against \"", earlier ? earlier->name() : "null",
                     "\", not a CUDA event of that device"));
  }
  if (!timing_ || !other->timing()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA events \"", other->name(), "\" and \"", name_,
        "\": both must be timing events (Runtime::CreateTimingEvent)"));
  }
  CudaDeviceGuard guard(ordinal_);
  if (!guard.status().ok()) return guard.status();
  float ms = 0.0f;
  const cudaError_t err = cudaEventElapsedTime(&ms, other->handle(), event_);
  if (err == cudaErrorNotReady || err == cudaErrorInvalidResourceHandle) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA events \"", other->name(), "\" and \"", name_,
        "\": not both recorded and complete (cudaEventElapsedTime: ",
        cudaGetErrorName(err), ")"));
  }
  MUON_CUDA_RETURN_IF_ERROR(err);
  return static_cast<double>(ms) * 1e-3;
}

class CudaStream final : public Stream {
 public:
  // `owned`: created here (synchronized and destroyed with the wrapper);
  // else adopted (Runtime::WrapStream) and left alone.
  CudaStream(int ordinal, cudaStream_t stream, std::string name,
             bool owned = true)
      : ordinal_(ordinal),
        stream_(stream),
        name_(std::move(name)),
        owned_(owned) {}
  ~CudaStream() override {
    if (!owned_) return;
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::Cuda(ordinal_); }
  const std::string& name() const override { return name_; }
  absl::Status Launch(StreamFn fn) override {
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    return fn();
  }
  absl::Status WaitFor(Event* event) override {
    auto* cuda = dynamic_cast<CudaEvent*>(event);
    if (cuda == nullptr || cuda->ordinal() != ordinal_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA stream \"", name_, "\" on cuda:", ordinal_,
          " told to wait for event \"", event ? event->name() : "null",
          "\", not a CUDA event of that device"));
    }
    // The device current for the call: a wrapped handle 0 is the legacy
    // default stream of the current device.
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    MUON_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, cuda->handle(), 0));
    return absl::OkStatus();
  }
  absl::Status Synchronize(absl::Duration timeout) override {
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    return PollUntilReady([this] { return cudaStreamQuery(stream_); }, timeout,
                          absl::StrCat("stream \"", name_, "\""));
  }
  void* native_handle() const override { return stream_; }
  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
  const cudaStream_t stream_;  // Owned when owned_.
  const std::string name_;
  const bool owned_;
};

absl::Status CudaEvent::Record(Stream* stream) {
  auto* cuda = dynamic_cast<CudaStream*>(stream);
  if (cuda == nullptr || cuda->ordinal() != ordinal_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA event \"", name_, "\" of cuda:", ordinal_,
        " recorded on stream \"", stream ? stream->name() : "null", "\" of ",
        stream ? stream->device().ToString() : "no device"));
  }
  CudaDeviceGuard guard(ordinal_);
  if (!guard.status().ok()) return guard.status();
  MUON_CUDA_RETURN_IF_ERROR(cudaEventRecord(
      event_, static_cast<cudaStream_t>(cuda->native_handle())));
  return absl::OkStatus();
}

// Memory from the CUDA runtime for device `ordinal`, allocated and freed
// with it current: device memory (kDevice: cudaMalloc, cudaFree) or
// page-locked host memory (kPinnedHost: cudaHostAlloc, portable, so that
// it is pinned for every device's context; zero-filled; cudaFreeHost).
class CudaAllocator final : public Allocator {
 public:
  enum class Kind { kDevice, kPinnedHost };
  CudaAllocator(int ordinal, Kind kind) : ordinal_(ordinal), kind_(kind) {}
  Device device() const override {
    return kind_ == Kind::kDevice ? Device::Cuda(ordinal_) : Device::Host();
  }
  absl::StatusOr<void*> AllocateRaw(int64_t bytes) override {
    const char* call = kind_ == Kind::kDevice ? "cudaMalloc" : "cudaHostAlloc";
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a negative allocation of ", bytes, " bytes for cuda:", ordinal_,
          " (", call, " not called)"));
    }
    if (bytes == 0) return nullptr;
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    void* p = nullptr;
    const size_t n = static_cast<size_t>(bytes);
    const cudaError_t e = kind_ == Kind::kDevice
                              ? cudaMalloc(&p, n)
                              : cudaHostAlloc(&p, n, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      const std::string what =
          absl::StrCat(call, "(", bytes, " bytes) for cuda:", ordinal_);
      return CudaErrorToStatus(static_cast<int>(e), what.c_str());
    }
    if (kind_ == Kind::kPinnedHost) std::memset(p, 0, n);
    return p;
  }
  void DeallocateRaw(void* ptr) override {
    if (ptr == nullptr) return;
    CudaDeviceGuard guard(ordinal_);
    if (kind_ == Kind::kDevice) {
      (void)cudaFree(ptr);
    } else {
      (void)cudaFreeHost(ptr);
    }
  }

 private:
  const int ordinal_;
  const Kind kind_;
};

class CudaRuntimeImpl final : public Runtime {
 public:
  explicit CudaRuntimeImpl(int ordinal)
      : ordinal_(ordinal),
        allocator_(ordinal, CudaAllocator::Kind::kDevice),
        pinned_(ordinal, CudaAllocator::Kind::kPinnedHost) {}
  Device device() const override { return Device::Cuda(ordinal_); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(
      const std::string& name) override {
    return NewStream(name, /*high_priority=*/false);
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateHighPriorityStream(
      const std::string& name) override {
    return NewStream(name, /*high_priority=*/true);
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent(
      const std::string& name) override {
    return NewEvent(name, /*timing=*/false);
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateTimingEvent(
      const std::string& name) override {
    return NewEvent(name, /*timing=*/true);
  }
  Allocator* allocator() override { return &allocator_; }
  Allocator* pinned_host_allocator() override { return &pinned_; }
  absl::StatusOr<std::unique_ptr<Stream>> WrapStream(
      void* native, const std::string& name) override {
    return std::unique_ptr<Stream>(new CudaStream(
        ordinal_, static_cast<cudaStream_t>(native), name, /*owned=*/false));
  }
  absl::Status CopyToHost(void* host_dst, const void* src,
                          int64_t bytes) override {
    return Copy(host_dst, src, bytes, cudaMemcpyDeviceToHost, "CopyToHost");
  }
  absl::Status CopyFromHost(void* dst, const void* host_src,
                            int64_t bytes) override {
    return Copy(dst, host_src, bytes, cudaMemcpyHostToDevice, "CopyFromHost");
  }
  absl::Status CopyToHostOnStream(Stream* stream, void* host_dst,
                                  const void* src, int64_t bytes) override {
    return CopyOnStream(stream, host_dst, src, bytes, cudaMemcpyDeviceToHost,
                        "CopyToHostOnStream");
  }
  absl::Status CopyFromHostOnStream(Stream* stream, void* dst,
                                    const void* host_src,
                                    int64_t bytes) override {
    return CopyOnStream(stream, dst, host_src, bytes, cudaMemcpyHostToDevice,
                        "CopyFromHostOnStream");
  }
  absl::Status Zero(void* dst, int64_t bytes) override {
    if (absl::Status s = CheckCopyArguments("Zero", dst, dst, bytes); !s.ok()) {
      return s;
    }
    if (bytes == 0) return absl::OkStatus();
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    // cudaMemset is asynchronous for device memory: wait for the legacy
    // stream that carries it, as the copies do.
    MUON_CUDA_RETURN_IF_ERROR(cudaMemset(dst, 0, static_cast<size_t>(bytes)));
    MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
    return absl::OkStatus();
  }

 private:
  // A CUDA event on this device: cudaEventDisableTiming unless `timing`.
  absl::StatusOr<std::unique_ptr<Event>> NewEvent(const std::string& name,
                                                  bool timing) {
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    cudaEvent_t e = nullptr;
    MUON_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
        &e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e, name, timing));
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes,
                    cudaMemcpyKind kind, const char* what) {
    if (absl::Status s = CheckCopyArguments(what, dst, src, bytes); !s.ok()) {
      return s;
    }
    if (bytes == 0) return absl::OkStatus();
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    MUON_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, src, static_cast<size_t>(bytes), kind));
    // A copy from pageable host memory may return before its DMA has
    // landed (CUDA's "API synchronization behavior"); wait for the legacy
    // stream that carries it, so that work on non-blocking streams sees
    // the data.
    if (kind == cudaMemcpyHostToDevice) {
      MUON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
    }
    return absl::OkStatus();
  }

  // cudaMemcpyAsync on `stream`, as the stream's work.
  absl::Status CopyOnStream(Stream* stream, void* dst, const void* src,
                            int64_t bytes, cudaMemcpyKind kind,
                            const char* what) {
    if (absl::Status s =
            CheckStreamCopyArguments(what, device(), stream, dst, src, bytes);
        !s.ok()) {
      return s;
    }
    if (bytes == 0) return absl::OkStatus();
    return stream->Launch([=]() -> absl::Status {
      CudaDeviceGuard guard(ordinal_);
      if (!guard.status().ok()) return guard.status();
      MUON_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind,
                          static_cast<cudaStream_t>(stream->native_handle())));
      return absl::OkStatus();
    });
  }

  // A non-blocking stream at priority 0 (cudaStreamCreateWithFlags' default)
  // or at the device's greatest (the lowest number of
  // cudaDeviceGetStreamPriorityRange).
  absl::StatusOr<std::unique_ptr<Stream>> NewStream(const std::string& name,
                                                    bool high_priority) {
    CudaDeviceGuard guard(ordinal_);
    if (!guard.status().ok()) return guard.status();
    int least = 0, greatest = 0;
    if (high_priority) {
      MUON_CUDA_RETURN_IF_ERROR(
          cudaDeviceGetStreamPriorityRange(&least, &greatest));
    }
    cudaStream_t s = nullptr;
    MUON_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, s, name));
  }

  const int ordinal_;
  CudaAllocator allocator_;
  CudaAllocator pinned_;
};

}  // namespace

CudaDeviceGuard::CudaDeviceGuard(int ordinal) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    (void)cudaGetLastError();
    current = -1;
  }
  previous_ = current;
  if (current != ordinal) {
    const cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      error_ = static_cast<int>(e);
    }
  }
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int current = -1;
  if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess &&
      current != previous_) {
    (void)cudaSetDevice(previous_);
  }
}

absl::Status CudaDeviceGuard::status() const {
  return CudaErrorToStatus(error_, "cudaSetDevice");
}

absl::Status CudaErrorToStatus(int cuda_error, const char* expr) {
  const cudaError_t err = static_cast<cudaError_t>(cuda_error);
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(expr, ": ", cudaGetErrorName(err), " (", cuda_error,
                   "): ", cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

int CudaDeviceCount(std::string* reason) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (reason != nullptr) {
      *reason = CudaErrorToStatus(static_cast<int>(e), "cudaGetDeviceCount")
                    .ToString();
    }
    return 0;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device is visible";
  return count;
}

absl::StatusOr<std::string> CudaDeviceDescription(int ordinal) {
  cudaDeviceProp prop;
  MUON_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  return absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ",
                      prop.multiProcessorCount, " SMs, ",
                      prop.totalGlobalMem >> 20, " MiB)");
}

absl::StatusOr<int> CudaStreamPriority(Stream* stream) {
  auto* cuda = dynamic_cast<CudaStream*>(stream);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaStreamPriority: stream \"", stream ? stream->name() : "null",
        "\" of ", stream ? stream->device().ToString() : "no device",
        " is not a CUDA stream"));
  }
  int priority = 0;
  MUON_CUDA_RETURN_IF_ERROR(cudaStreamGetPriority(
      static_cast<cudaStream_t>(cuda->native_handle()), &priority));
  return priority;
}

absl::StatusOr<Runtime*> CudaRuntime(int ordinal) {
  std::string reason;
  const int count = CudaDeviceCount(&reason);
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda:", ordinal, " requested but ", count,
        " CUDA device(s) are visible", reason.empty() ? "" : ": ", reason));
  }
  static std::mutex mu;
  static std::vector<std::unique_ptr<CudaRuntimeImpl>>* runtimes =
      new std::vector<std::unique_ptr<CudaRuntimeImpl>>();
  std::lock_guard<std::mutex> lock(mu);
  if (runtimes->size() < static_cast<size_t>(count)) runtimes->resize(count);
  auto& slot = (*runtimes)[ordinal];
  if (slot == nullptr) slot = std::make_unique<CudaRuntimeImpl>(ordinal);
  return slot.get();
}

}  // namespace device
}  // namespace muon
