// Where memory lives and work runs: the host, or one CUDA device (by its
// ordinal among the visible devices, as torch.device("cuda", i)).
//
// The device package sits at the bottom of the dependency graph, beside
// common/: streams, events and buffers (device/stream.h, device/memory.h)
// for the host and for CUDA, modelled on XLA's StreamExecutor (Stream,
// Event, DeviceMemory, with a host platform) and PyTorch's c10::Device,
// c10::Stream and c10::Event.
#ifndef MUON_DEVICE_DEVICE_H_
#define MUON_DEVICE_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {
namespace device {

enum class DeviceKind { kHost, kCuda };

// A device: the host (ordinal 0) or CUDA device `ordinal` (>= 0).
struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int ordinal = 0;

  static Device Host() { return Device{DeviceKind::kHost, 0}; }
  static Device Cuda(int ordinal) { return Device{DeviceKind::kCuda, ordinal}; }

  bool is_host() const { return kind == DeviceKind::kHost; }
  bool is_cuda() const { return kind == DeviceKind::kCuda; }

  // torch.device's spelling: "cpu" or "cuda:<ordinal>".
  std::string ToString() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind && a.ordinal == b.ordinal;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// Parses torch.device's spelling: "cpu", "cuda" (ordinal 0) or
// "cuda:<ordinal>". Errors: InvalidArgument naming the text.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

}  // namespace device
}  // namespace muon

#endif  // MUON_DEVICE_DEVICE_H_
