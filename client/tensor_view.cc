#include "client/tensor_view.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layout.h"
#include "common/status_macros.h"

namespace muon {
absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

int64_t DTypeSize(DType dtype) { return dtype == DType::kBFloat16 ? 2 : 4; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "float32" || name == "float" || name == "fp32") {
    return DType::kFloat32;
  }
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("dtype \"", name,
                   "\" is not supported (use \"float32\" or \"bfloat16\")"));
}

int64_t ParamView::local_numel() const {
  int64_t n = 1;
  for (int64_t d : local_shape) n *= d;
  return n;
}

int64_t ParamView::local_rows() const {
  int64_t n = 1;
  for (size_t d = 0; d + 1 < local_shape.size(); ++d) n *= local_shape[d];
  return n;
}

bool IsContiguous(const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

namespace {

// ValidateParamView's shape checks: the global and local shapes have the
// parameter's rank (2, or 3 for an expert stack) and no negative dim.
absl::Status CheckViewShapes(const ParamView& p, int rank) {
  const size_t ndim = p.expert_stack ? 3 : 2;
  if (p.shape().size() != ndim) {
    if (p.expert_stack) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": parameter \"", p.name,
          "\" is marked as an "
          "expert stack but has shape ",
          ShapeToString(p.shape()), "; expected [experts, rows, cols]"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank,
                     ": Muon only supports 2D parameters whereas we found "
                     "a parameter with size: ",
                     ShapeToString(p.shape()), " (parameter \"", p.name,
                     "\"; mark 3-D expert stacks with expert_stack)"));
  }
  if (p.local_shape.size() != ndim) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": parameter \"", p.name,
                     "\" has local shape ", ShapeToString(p.local_shape),
                     " but global shape ", ShapeToString(p.shape())));
  }
  for (size_t k = 0; k < ndim; ++k) {
    if (p.local_shape[k] < 0 || p.shape()[k] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": parameter \"", p.name,
                       "\" has a negative dim: "
                       "local shape ",
                       ShapeToString(p.local_shape), ", global shape ",
                       ShapeToString(p.shape())));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateParamView(const ParamView& p, int rank) {
  if (p.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": a parameter has an empty name"));
  }
  MUON_RETURN_IF_ERROR(CheckViewShapes(p, rank));
  if (!IsContiguous(p.local_shape, p.strides)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": parameter \"", p.name, "\" has strides ",
        ShapeToString(p.strides), " for local shape ",
        ShapeToString(p.local_shape),
        "; only contiguous (row-major) tensors are supported: call "
        ".contiguous() first"));
  }
  if (!p.row_splits.empty()) {
    if (p.expert_stack) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": parameter \"", p.name,
          "\": row splits are for 2-D parameters, not expert stacks"));
    }
    if (absl::Status s = CheckRowSplits(p.shape(), p.row_splits); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": parameter \"", p.name, "\": ", s.message()));
    }
  }
  if (p.device.is_cuda() && p.device.ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": parameter \"", p.name, "\" is on ",
                     p.device.ToString(), ": a negative CUDA ordinal"));
  }
  if (p.data == nullptr && p.local_numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": parameter \"", p.name, "\" has no data pointer for ",
        "local shape ", ShapeToString(p.local_shape)));
  }
  return absl::OkStatus();
}

}  // namespace muon
