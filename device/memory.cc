#include "device/memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace muon {
namespace device {
namespace {

constexpr int64_t kHostAlignment = 64;

class HostAllocatorImpl final : public Allocator {
 public:
  Device device() const override { return Device::Host(); }

  absl::StatusOr<void*> AllocateRaw(int64_t bytes) override {
    if (bytes < 0 || bytes > INT64_MAX - kHostAlignment) {
      return absl::InvalidArgumentError(
          absl::StrCat("host allocation of ", bytes, " bytes"));
    }
    if (bytes == 0) return nullptr;
    // aligned_alloc needs a multiple of the alignment.
    const int64_t rounded =
        (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host allocation of ", bytes, " bytes failed"));
    }
    std::memset(p, 0, static_cast<size_t>(rounded));
    return p;
  }

  void DeallocateRaw(void* ptr) override { std::free(ptr); }
};

}  // namespace

Allocator* HostAllocator() {
  static Allocator* const allocator = new HostAllocatorImpl();
  return allocator;
}

absl::StatusOr<void*> CountingAllocator::AllocateRaw(int64_t bytes) {
  absl::StatusOr<void*> p = base_->AllocateRaw(bytes);
  if (!p.ok() || *p == nullptr) return p;
  absl::MutexLock lock(&mu_);
  sizes_[*p] = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CountingAllocator::DeallocateRaw(void* ptr) {
  if (ptr == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = sizes_.find(ptr);
    if (it != sizes_.end()) {
      in_use_ -= it->second;
      sizes_.erase(it);
    }
  }
  base_->DeallocateRaw(ptr);
}

int64_t CountingAllocator::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int64_t CountingAllocator::peak_bytes() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(Allocator* allocator,
                                                    int64_t bytes) {
  if (allocator == nullptr) {
    return absl::InvalidArgumentError("DeviceMemory::Allocate: no allocator");
  }
  absl::StatusOr<void*> p = allocator->AllocateRaw(bytes);
  if (!p.ok()) return p.status();
  DeviceMemory out;
  out.allocator_ = allocator;
  out.data_ = *p;
  out.bytes_ = bytes;
  return out;
}

void DeviceMemory::Reset() {
  if (allocator_ != nullptr) allocator_->DeallocateRaw(data_);
  allocator_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace device
}  // namespace muon
