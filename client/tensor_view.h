// Tensor views: how the optimizer sees a trainer's parameter on one rank,
// without owning or copying it (DTensor vocabulary: `global_shape` is
// DTensor's .shape, `local_shape` its .to_local().shape; placements on the
// mesh come with the DistributedConfig).
//
// The trainer owns the parameter and gradient memory; the optimizer reads
// the gradient and writes the parameter in place at each Step, and owns only
// its state (momentum buffers) and step buffers. Both pointers must
// stay valid while the optimizer may step; a gradient that moves (torch
// re-creates .grad after zero_grad(set_to_none=True)) is re-bound with
// Muon::SetGrad.
#ifndef MUON_CLIENT_TENSOR_VIEW_H_
#define MUON_CLIENT_TENSOR_VIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "device/device.h"

namespace muon {

// Element type of a parameter or gradient.
enum class DType {
  kFloat32,   // torch.float32
  kBFloat16,  // torch.bfloat16: computed in fp32, rounded back to nearest even
};

// "float32", "bfloat16" (torch's names without the "torch." prefix).
absl::string_view DTypeName(DType dtype);
// Bytes per element: 4 or 2.
int64_t DTypeSize(DType dtype);
// Parses "float32" / "float" / "fp32" and "bfloat16" / "bf16".
// Errors: InvalidArgument quoting the text.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Where a tensor's memory lives, as torch.device: the device layer's
// Device (cpu, or cuda:<ordinal>).
using Device = device::Device;

// One parameter of this rank: a view of its local shard and gradient.
struct ParamView {
  // Unique name, e.g. "fc1.weight"; appears in every error message.
  std::string name;
  // Local shard of the parameter, `dtype` elements laid out by `strides`.
  // Not owned; written in place by Step.
  void* data = nullptr;
  // Gradient of the local shard, `grad_dtype` elements with the same shape
  // and strides. Not owned; read by Step. nullptr = no gradient yet (Step
  // then fails with FailedPrecondition); re-bind with Muon::SetGrad.
  const void* grad = nullptr;
  DType dtype = DType::kFloat32;
  DType grad_dtype = DType::kFloat32;
  // [rows, cols], or [local experts, rows, cols] for an expert stack; a dim
  // may be 0 (an empty torch.chunk shard).
  std::vector<int64_t> local_shape;
  // Strides in elements, as torch's Tensor.stride(); empty = contiguous row
  // major. Only contiguous views are accepted for now.
  std::vector<int64_t> strides;
  // Shape of the whole logical tensor; empty = local_shape (not sharded).
  std::vector<int64_t> global_shape;
  // A 3-D stack of expert matrices (MoE): each [rows, cols] slice is its own
  // matrix. Without it, as torch.optim.Muon, only 2-D parameters are
  // accepted.
  bool expert_stack = false;
  // Blocks of rows orthogonalized as matrices of their own (2-D only; sum
  // to the global rows): per-head Newton-Schulz or a fused QKV projection
  // (ParamSpec.row_splits). Empty = the whole matrix.
  std::vector<int64_t> row_splits;
  // Where `data` and `grad` live: the host, or CUDA device N (both
  // pointers are then that device's memory).
  Device device;

  const std::vector<int64_t>& shape() const {
    return global_shape.empty() ? local_shape : global_shape;
  }
  int64_t local_numel() const;
  // Rows of the local shard over all its matrices: the product of every
  // local dim but the last ([local experts * local rows] for a stack).
  int64_t local_rows() const;
};

// Checks what the step needs of a view on this rank: a name, a data
// pointer unless the shard is empty, 2-D (3-D with expert_stack) shapes,
// contiguous strides, a non-negative CUDA ordinal. (Whether the device
// exists is the optimizer's check: device::GetRuntime.)
// Errors: InvalidArgument naming the rank, the parameter and the offending
// value (shape, strides, null pointer, device).
absl::Status ValidateParamView(const ParamView& view, int rank);

// True when `strides` are those of a contiguous row-major tensor of `shape`
// (dims of size 1 may carry any stride, as torch's is_contiguous).
bool IsContiguous(const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides);

}  // namespace muon

#endif  // MUON_CLIENT_TENSOR_VIEW_H_
