// muon::Parameter: a convenience for programs that have no tensors of their
// own (tests, tools, the C++ examples): it owns a float32 local shard and its
// gradient in std::vectors and hands the optimizer a view of them
// (client/tensor_view.h). Trainers with their own memory pass ParamViews
// directly.
//
// Muon::Create(std::vector<Parameter*>) binds the parameters: before each
// Step it re-reads data.data() and grad.data(), so `grad` may be reassigned
// between steps (an empty grad means "no gradient").
#ifndef MUON_CLIENT_PARAMETER_H_
#define MUON_CLIENT_PARAMETER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/tensor_view.h"

namespace muon {

struct Parameter {
  // Unique name, e.g. "fc1.weight"; appears in every error message.
  std::string name;
  // Shape of the whole logical tensor: [rows, cols], or [experts, rows,
  // cols] when expert_stack. Empty = same as local_shape (not sharded).
  std::vector<int64_t> global_shape;
  // A 3-D stack of expert matrices (MoE); see ParamView::expert_stack.
  bool expert_stack = false;
  // Shape of the shard held by this rank (a dim may be 0 for an empty
  // torch.chunk shard).
  std::vector<int64_t> local_shape;
  // Row-major (C order) float32 values of the local shard.
  std::vector<float> data;
  // Gradient of the local shard, same size as `data`; empty = none.
  std::vector<float> grad;
  // Row blocks orthogonalized on their own; see ParamView::row_splits.
  std::vector<int64_t> row_splits;

  const std::vector<int64_t>& shape() const {
    return global_shape.empty() ? local_shape : global_shape;
  }
  int64_t local_numel() const {
    int64_t n = 1;
    for (int64_t d : local_shape) n *= d;
    return n;
  }
  // A float32, contiguous, CPU view of `data` and `grad` (grad nullptr when
  // empty). Valid until either vector is reallocated.
  ParamView View() {
    ParamView v;
    v.name = name;
    v.data = data.data();
    v.grad = grad.empty() ? nullptr : grad.data();
    v.local_shape = local_shape;
    v.global_shape = global_shape;
    v.expert_stack = expert_stack;
    v.row_splits = row_splits;
    return v;
  }
};

// Views of `params`, in order (see Parameter::View).
inline std::vector<ParamView> ViewsOf(const std::vector<Parameter*>& params) {
  std::vector<ParamView> views;
  views.reserve(params.size());
  for (Parameter* p : params) views.push_back(p->View());
  return views;
}

}  // namespace muon

#endif  // MUON_CLIENT_PARAMETER_H_
