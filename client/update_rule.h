// torch.optim.Muon's per-parameter arithmetic in one place
// (torch/optim/_muon.py, `_single_tensor_muon`), for a local shard:
//   before the exchange:  buf.lerp_(grad, 1 - momentum);
//                         U = grad.lerp(buf, momentum) if nesterov else buf
//   on the owner:         O = NS_k(U) (Newton-Schulz with `ns`)
//   after the exchange:   p.mul_(1 - lr * weight_decay);
//                         p.add_(O, alpha=-AdjustLR(lr, rows, cols))
// with AdjustLR from the matrix's GLOBAL shape (`_adjust_lr`). Momentum and
// the update are elementwise, so they are exact on shards; the kernels
// (kernels/step_kernels.h) run them on the host or a CUDA stream.
//
// Thread-safety: const methods may run concurrently.
#ifndef MUON_CLIENT_UPDATE_RULE_H_
#define MUON_CLIENT_UPDATE_RULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "device/stream.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "kernels/step_kernels.h"

namespace muon {

// torch.optim.Muon's hyper-parameters and the arithmetic they drive.
struct UpdateRule {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;
  bool nesterov = true;
  // Per parameter (optimizer order) lr, weight decay and momentum, as
  // torch's param groups give them (torch.optim.Muon reads each group's
  // at every step); empty = `lr` / `weight_decay` / `momentum` for every
  // parameter.
  std::vector<double> param_lr;
  std::vector<double> param_weight_decay;
  std::vector<double> param_momentum;
  kernels::AdjustLrFn adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  kernels::NewtonSchulzOptions ns;

  // The lr, weight decay and momentum of parameter `param_index`.
  double LrOf(int param_index) const;
  double WeightDecayOf(int param_index) const;
  double MomentumOf(int param_index) const;

  // Sets parameter `param_index`'s lr, weight decay and momentum (torch's
  // param groups); the others of `num_params` keep theirs.
  void SetParamHyperparameters(int param_index, int num_params, double lr,
                               double weight_decay, double momentum);

  // The momentum step on `n` elements of parameter `param_index` (torch's
  // buf.lerp_(grad, 1 - momentum) with MomentumOf(param_index)): `buf` is
  // fp32 or bf16 (`buf_dtype`), `grad` fp32 or bf16 (`grad_dtype`), both
  // memory of kernels.device(), used in `stream`'s order. Nesterov's U is
  // formed later, per bucket, by the step executor (StepKernels::FormUpdate
  // with the same MomentumOf). Errors: as StepKernels::Momentum.
  absl::Status Momentum(kernels::StepKernels& kernels, device::Stream* stream,
                        int param_index, void* buf,
                        kernels::ParamDType buf_dtype, const void* grad,
                        kernels::ParamDType grad_dtype, int64_t n) const;

  // Decoupled weight decay and the update on `n` elements of parameter
  // `param_index` (a [rows, cols] matrix globally): param <- param * (1 -
  // lr * wd) - AdjustLR(lr, rows, cols) * update. `param` (fp32 or bf16,
  // `dtype`) and `update` (fp32) are memory of kernels.device().
  // Errors: as StepKernels::DecayAndApply.
  absl::Status Apply(kernels::StepKernels& kernels, device::Stream* stream,
                     int param_index, int64_t rows, int64_t cols, void* param,
                     kernels::ParamDType dtype, const float* update,
                     int64_t n) const;
};

}  // namespace muon

#endif  // MUON_CLIENT_UPDATE_RULE_H_
