// Memory on a device: an allocator per device and owning buffers tagged
// with the device they live on (XLA's DeviceMemoryAllocator and
// OwningDeviceMemory; PyTorch's c10::Allocator and DataPtr).
#ifndef MUON_DEVICE_MEMORY_H_
#define MUON_DEVICE_MEMORY_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "device/device.h"

namespace muon {
namespace device {

// Allocates and frees raw memory on one device. Thread-safe.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // `bytes` >= 0 bytes, aligned to at least 64 bytes (256 on CUDA); host
  // memory is zero-filled. Zero bytes gives nullptr.
  // Errors: InvalidArgument (bytes < 0); ResourceExhausted (out of memory,
  // names the size and device); the CUDA error.
  virtual absl::StatusOr<void*> AllocateRaw(int64_t bytes) = 0;
  // Frees what AllocateRaw returned (nullptr: no-op).
  virtual void DeallocateRaw(void* ptr) = 0;
};

// The process-wide host allocator (64-byte aligned, zero-filled).
Allocator* HostAllocator();

// An allocator that passes every call to `base` (not owned; outlives it)
// and counts the bytes it holds now and at most, as c10's
// torch.cuda.memory_allocated / max_memory_allocated do for a device: one
// per part of what an optimizer keeps (its state, its step buffers), and
// one under them for the whole. Thread-safe.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator* base) : base_(base) {}
  Device device() const override { return base_->device(); }
  // Errors: base's.
  absl::StatusOr<void*> AllocateRaw(int64_t bytes) override;
  void DeallocateRaw(void* ptr) override;
  // Bytes allocated and not yet freed, and their largest value so far.
  int64_t bytes_in_use() const;
  int64_t peak_bytes() const;

 private:
  Allocator* const base_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<void*, int64_t> sizes_ ABSL_GUARDED_BY(mu_);
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
};

// Owning untyped memory on one device, freed by its allocator on
// destruction. Move-only; a default-constructed one holds nothing.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() { Reset(); }
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    if (this != &other) {
      Reset();
      allocator_ = std::exchange(other.allocator_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Errors: those of Allocator::AllocateRaw.
  static absl::StatusOr<DeviceMemory> Allocate(Allocator* allocator,
                                               int64_t bytes);

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // The device of data(); the host for an empty buffer.
  Device device() const {
    return allocator_ ? allocator_->device() : Device::Host();
  }
  void Reset();

 private:
  Allocator* allocator_ = nullptr;  // Not owned.
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// `size()` elements of T on one device (trivially copyable T: float,
// bf16_t, ...), owning. Move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;

  // Errors: InvalidArgument (count < 0 or count * sizeof(T) overflows);
  // those of Allocator::AllocateRaw.
  static absl::StatusOr<DeviceBuffer<T>> Allocate(Allocator* allocator,
                                                  int64_t count) {
    if (count < 0 || count > INT64_MAX / static_cast<int64_t>(sizeof(T))) {
      return absl::InvalidArgumentError("DeviceBuffer: element count " +
                                        std::to_string(count) +
                                        " is negative or too large");
    }
    absl::StatusOr<DeviceMemory> mem = DeviceMemory::Allocate(
        allocator, count * static_cast<int64_t>(sizeof(T)));
    if (!mem.ok()) return mem.status();
    DeviceBuffer<T> out;
    out.memory_ = *std::move(mem);
    out.size_ = count;
    return out;
  }

  T* data() const { return static_cast<T*>(memory_.data()); }
  int64_t size() const { return size_; }
  // The untyped memory (for byte copies).
  const DeviceMemory& memory() const { return memory_; }
  int64_t bytes() const { return memory_.bytes(); }
  Device device() const { return memory_.device(); }

 private:
  DeviceMemory memory_;
  int64_t size_ = 0;
};

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_MEMORY_H_
