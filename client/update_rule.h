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
  // Per parameter (optimizer order) lr and weight decay, as torch's param
  // groups give them; empty = `lr` / `weight_decay` for every parameter.
  std::vector<double> param_lr;
  std::vector<double> param_weight_decay;
  kernels::AdjustLrFn adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  kernels::NewtonSchulzOptions ns;

  // The lr and weight decay of parameter `param_index`.
  double LrOf(int param_index) const;
  double WeightDecayOf(int param_index) const;

  // Sets parameter `param_index`'s lr and weight decay (torch's param
  // groups); the others of `num_params` keep theirs.
  void SetParamHyperparameters(int param_index, int num_params, double lr,
                               double weight_decay);

  // The momentum step on `n` elements (torch's buf.lerp_(grad, 1 -
  // momentum)): `buf` is fp32 or bf16 (`buf_dtype`), `grad` fp32 or bf16
  // (`grad_dtype`), both memory of kernels.device(), used in `stream`'s
  // order. Nesterov's U is formed later, per bucket, by the step executor
  // (StepKernels::FormUpdate with `momentum`). Errors: as
  // StepKernels::Momentum.
  absl::Status Momentum(kernels::StepKernels& kernels, device::Stream* stream,
                        void* buf, kernels::ParamDType buf_dtype,
                        const void* grad, kernels::ParamDType grad_dtype,
                        int64_t n) const;

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
