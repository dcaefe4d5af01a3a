// The OpenBLAS NsEngine and ParseGpuPrecision. The host-staged CUDA engine
// is kernels/staged_ns_engine.h's.
#include "kernels/ns_engine.h"

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/newton_schulz.h"

namespace muon {
namespace kernels {
namespace {

// kernels::NewtonSchulz with a workspace of its own.
class CpuNsEngine final : public NsEngine {
 public:
  absl::Status Orthogonalize(const float* u, int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options,
                             float* out) override {
    return NewtonSchulz(u, rows, cols, options, out, &workspace_);
  }

  absl::Status Reserve(int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options) override {
    if (rows < 1 || cols < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CpuNsEngine::Reserve: sizes must be positive, got rows=", rows,
          " cols=", cols));
    }
    if (absl::Status s = ValidateNewtonSchulzOptions(options); !s.ok()) {
      return s;
    }
    workspace_.Reserve(rows, cols, options);
    return absl::OkStatus();
  }

  std::string name() const override { return "cpu/openblas"; }

 private:
  NewtonSchulzWorkspace workspace_;
};

}  // namespace

absl::StatusOr<GpuPrecision> ParseGpuPrecision(const std::string& name) {
  if (name == "bf16") return GpuPrecision::kBf16;
  if (name == "tf32") return GpuPrecision::kTf32;
  if (name == "fp32") return GpuPrecision::kFp32;
  return absl::InvalidArgumentError(absl::StrCat(
      "GPU precision must be \"bf16\", \"tf32\" or \"fp32\", got \"", name,
      "\""));
}

absl::string_view GpuPrecisionName(GpuPrecision precision) {
  switch (precision) {
    case GpuPrecision::kTf32:
      return "tf32";
    case GpuPrecision::kFp32:
      return "fp32";
    case GpuPrecision::kBf16:
      break;
  }
  return "bf16";
}

std::unique_ptr<NsEngine> MakeCpuNsEngine() {
  return std::make_unique<CpuNsEngine>();
}

}  // namespace kernels
}  // namespace muon
