#include "device/device.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace muon {
namespace device {

std::string Device::ToString() const {
  if (is_host()) return "cpu";
  return absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  if (text == "cpu") return Device::Host();
  if (text == "cuda") return Device::Cuda(0);
  absl::string_view rest = text;
  int ordinal = -1;
  if (absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &ordinal) &&
      ordinal >= 0) {
    return Device::Cuda(ordinal);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device \"", text, "\" is not \"cpu\", \"cuda\" or \"cuda:<ordinal>\""));
}

}  // namespace device
}  // namespace muon
