// A trainable parameter as the optimizer sees it on one rank: the local
// shard of a (possibly sharded) float32 tensor and its gradient, DTensor
// style (`global_shape` is DTensor's .shape, `local_shape` its
// .to_local().shape).
#ifndef MUON_CLIENT_PARAMETER_H_
#define MUON_CLIENT_PARAMETER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muon {

struct Parameter {
  // Unique name, e.g. "fc1.weight"; appears in every error message.
  std::string name;
  // Shape of the whole logical tensor: [rows, cols], or [experts, rows,
  // cols] when expert_stack. Empty = same as local_shape (not sharded).
  std::vector<int64_t> global_shape;
  // A 3-D stack of expert matrices (MoE): each [rows, cols] slice is
  // orthogonalized as its own matrix. Without it, as in torch.optim.Muon,
  // only 2-D parameters are accepted.
  bool expert_stack = false;
  // Shape of the shard held by this rank ([rows, cols] for a matrix,
  // [local experts, rows, cols] for a stack; a dim may be 0 for an empty
  // torch.chunk shard; all 0 or empty data on a rank outside the
  // parameter's sub-mesh is not allowed: such a rank does not list it).
  std::vector<int64_t> local_shape;
  // Row-major (C order) float32 values of the local shard.
  std::vector<float> data;
  // Gradient of the local shard, same layout and size as `data`. Step
  // requires it on every parameter (FailedPrecondition otherwise).
  std::vector<float> grad;

  const std::vector<int64_t>& shape() const {
    return global_shape.empty() ? local_shape : global_shape;
  }
  int64_t local_numel() const {
    int64_t n = 1;
    for (int64_t d : local_shape) n *= d;
    return n;
  }
};

}  // namespace muon

#endif  // MUON_CLIENT_PARAMETER_H_
