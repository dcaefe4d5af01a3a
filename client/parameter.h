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
  // Shape of the whole logical tensor. Empty = same as local_shape
  // (the parameter is not sharded).
  std::vector<int64_t> global_shape;
  // Shape of the shard held by this rank ([rows, cols] for a matrix; a dim
  // may be 0 for an empty torch.chunk shard).
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
