// A stream that claims to be on cuda:0 and runs nothing on a GPU: for the
// tests that check that host-only code refuses a CUDA stream by name,
// without needing CUDA.
#ifndef MUON_TESTS_COMM_FAKE_CUDA_STREAM_H_
#define MUON_TESTS_COMM_FAKE_CUDA_STREAM_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "device/stream.h"

namespace muon {
namespace testing {

class FakeCudaStream final : public device::Stream {
 public:
  explicit FakeCudaStream(std::string name) : name_(std::move(name)) {}
  device::Device device() const override { return device::Device::Cuda(0); }
  const std::string& name() const override { return name_; }
  absl::Status Launch(device::StreamFn fn) override { return fn(); }
  absl::Status WaitFor(device::Event*) override { return absl::OkStatus(); }
  absl::Status Synchronize(absl::Duration) override { return absl::OkStatus(); }
  void* native_handle() const override { return nullptr; }

 private:
  const std::string name_;
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_COMM_FAKE_CUDA_STREAM_H_
