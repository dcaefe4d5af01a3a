#include "kernels/step_kernels.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "device/runtime.h"
#include "kernels/bfloat16.h"
#include "kernels/muon_update.h"

namespace muon {
namespace kernels {
namespace {

// Calls fn(at, n) for each row of `region`, in order: `at` is the index of
// the row's first element in a row-major buffer holding box `holds`, `n`
// the row's length (region.cols.size()).
template <typename Fn>
void ForEachRegionRow(const Box& holds, const Box& region, Fn fn) {
  const int64_t ld = holds.cols.size();
  const int64_t n = region.cols.size();
  for (int64_t i = region.rows.begin; i < region.rows.end; ++i) {
    fn((i - holds.rows.begin) * ld + (region.cols.begin - holds.cols.begin), n);
  }
}

// Calls fn(buf, grad) with `buf` as float* or bf16_t* and `grad` as
// const float* or const bf16_t*, as their dtypes say.
template <typename Fn>
void VisitDTypes(ParamDType buf_dtype, ParamDType grad_dtype, void* buf,
                 const void* grad, Fn&& fn) {
  auto with_grad = [&](auto* b) {
    if (grad_dtype == ParamDType::kBFloat16) {
      fn(b, static_cast<const bf16_t*>(grad));
    } else {
      fn(b, static_cast<const float*>(grad));
    }
  };
  if (buf_dtype == ParamDType::kBFloat16) {
    with_grad(static_cast<bf16_t*>(buf));
  } else {
    with_grad(static_cast<float*>(buf));
  }
}

class HostStepKernels final : public StepKernels {
 public:
  explicit HostStepKernels(NsEngine* engine) : engine_(engine) {}

  device::Device device() const override { return device::Device::Host(); }
  std::string name() const override { return engine_->name(); }

  absl::Status CopyRegion(device::Stream*, const float* src,
                          const Box& src_holds, float* dst,
                          const Box& dst_holds, const Box& region) override {
    ::muon::CopyRegion(src, src_holds, dst, dst_holds, region);
    return absl::OkStatus();
  }

  absl::Status PackRegionBf16(device::Stream*, const float* src,
                              const Box& src_holds, bf16_t* dst,
                              const Box& region) override {
    ForEachRegionRow(src_holds, region, [&](int64_t at, int64_t n) {
      for (int64_t j = 0; j < n; ++j) *dst++ = FloatToBf16(src[at + j]);
    });
    return absl::OkStatus();
  }

  absl::Status RoundToBf16(device::Stream*, float* x, int64_t n) override {
    if (n < 0 || (n > 0 && x == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RoundToBf16: n must be >= 0 and x non-null, got n = ", n));
    }
    for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
    return absl::OkStatus();
  }

  absl::Status NorMuonNormalize(device::Stream*, float* o, int64_t rows,
                                int64_t cols, float* variance, double beta2,
                                double eps) override {
    if (absl::Status s = CheckNorMuonArguments(o, rows, cols, variance);
        !s.ok()) {
      return s;
    }
    kernels::NorMuonNormalize(o, rows, cols, variance, beta2, eps);
    return absl::OkStatus();
  }

  absl::Status UnpackRegionBf16(device::Stream*, const bf16_t* src,
                                const Box& region, float* dst,
                                const Box& dst_holds) override {
    ForEachRegionRow(dst_holds, region, [&](int64_t at, int64_t n) {
      for (int64_t j = 0; j < n; ++j) dst[at + j] = Bf16ToFloat(*src++);
    });
    return absl::OkStatus();
  }

  absl::Status Orthogonalize(device::Stream*, const float* u, int64_t batch,
                             int64_t rows, int64_t cols,
                             const NewtonSchulzOptions& options,
                             float* out) override {
    if (batch < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("Orthogonalize: batch must be >= 1, got ", batch));
    }
    const std::optional<int64_t> total = CheckedProduct({batch, rows, cols});
    if (rows < 1 || cols < 1 || !total.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Orthogonalize: ", batch, " matrices of ", rows, "x",
                       cols, " are not a valid batch"));
    }
    // The whole batch, as the CUDA kernel checks it: writing matrix i's O
    // must not overwrite a later matrix's U.
    if (u < out + *total && out < u + *total) {
      return absl::InvalidArgumentError(
          absl::StrCat("Orthogonalize: the output of ", batch, " matrices of ",
                       rows, "x", cols, " overlaps their input"));
    }
    const int64_t stride = rows * cols;
    for (int64_t i = 0; i < batch; ++i) {
      absl::Status s = engine_->Orthogonalize(u + i * stride, rows, cols,
                                              options, out + i * stride);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status Reserve(int64_t, int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options) override {
    return engine_->Reserve(rows, cols, options);  // one matrix at a time
  }

  absl::Status Momentum(device::Stream*, void* buf, ParamDType buf_dtype,
                        const void* grad, ParamDType grad_dtype, int64_t n,
                        double momentum) override {
    if (n < 0 || (n > 0 && (buf == nullptr || grad == nullptr))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Momentum: n must be >= 0 and pointers non-null, got n = ", n));
    }
    VisitDTypes(buf_dtype, grad_dtype, buf, grad,
                [&](auto* b, auto* g) { MomentumUpdate(b, g, n, momentum); });
    return absl::OkStatus();
  }

  absl::Status FormUpdate(device::Stream*, const void* buf,
                          ParamDType buf_dtype, const void* grad,
                          ParamDType grad_dtype, int64_t n, double momentum,
                          bool nesterov, float* update) override {
    if (n < 0 || (n > 0 && (buf == nullptr || update == nullptr ||
                            (nesterov && grad == nullptr)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FormUpdate: n must be >= 0 and pointers non-null, got n = ", n));
    }
    if (!nesterov) {
      if (buf_dtype == ParamDType::kBFloat16) {
        const auto* b = static_cast<const bf16_t*>(buf);
        for (int64_t i = 0; i < n; ++i) update[i] = Bf16ToFloat(b[i]);
      } else if (n > 0) {
        std::memcpy(update, buf, n * sizeof(float));
      }
      return absl::OkStatus();
    }
    VisitDTypes(
        buf_dtype, grad_dtype, const_cast<void*>(buf), grad,
        [&](auto* b, auto* g) { NesterovUpdate(g, b, n, momentum, update); });
    return absl::OkStatus();
  }

  absl::Status FirstNonFinite(device::Stream*, const void* x, ParamDType dtype,
                              int64_t n, int64_t* first) override {
    if (n < 0 || first == nullptr || (n > 0 && x == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FirstNonFinite: n must be >= 0 and pointers non-null, got n = ", n));
    }
    *first = dtype == ParamDType::kBFloat16
                 ? kernels::FirstNonFinite(static_cast<const bf16_t*>(x), n)
                 : kernels::FirstNonFinite(static_cast<const float*>(x), n);
    return absl::OkStatus();
  }

  absl::Status Scale(device::Stream*, void* x, ParamDType dtype, int64_t n,
                     float factor) override {
    if (absl::Status s = CheckScaleArguments(x, n); !s.ok()) return s;
    if (dtype == ParamDType::kBFloat16) {
      kernels::Scale(static_cast<bf16_t*>(x), n, factor);
    } else {
      kernels::Scale(static_cast<float*>(x), n, factor);
    }
    return absl::OkStatus();
  }

  absl::Status Copy(device::Stream*, void* dst, const void* src,
                    int64_t bytes) override {
    if (absl::Status s = device::CheckCopyArguments("Copy", dst, src, bytes);
        !s.ok()) {
      return s;
    }
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

  absl::Status DecayAndApply(device::Stream*, void* param, ParamDType dtype,
                             const float* update, int64_t n, double lr,
                             double weight_decay, double adjusted_lr) override {
    if (dtype == ParamDType::kBFloat16) {
      ApplyUpdate(static_cast<bf16_t*>(param), update, n, lr, weight_decay,
                  adjusted_lr);
    } else {
      ApplyUpdate(static_cast<float*>(param), update, n, lr, weight_decay,
                  adjusted_lr);
    }
    return absl::OkStatus();
  }

 private:
  NsEngine* const engine_;  // Not owned.
};

}  // namespace

std::unique_ptr<StepKernels> MakeHostStepKernels(NsEngine* engine) {
  return std::make_unique<HostStepKernels>(engine);
}

#ifndef MUON_WITH_CUDA
absl::StatusOr<std::unique_ptr<StepKernels>> MakeCudaStepKernels(
    int ordinal, device::Stream*, GpuPrecision) {
  return absl::UnimplementedError(
      absl::StrCat("CUDA step kernels for cuda:", ordinal,
                   ": built without CUDA support (build with --config=cuda)"));
}
#endif  // MUON_WITH_CUDA

}  // namespace kernels
}  // namespace muon
