#include "client/update_rule.h"

namespace muon {

double UpdateRule::LrOf(int param_index) const {
  return param_lr.empty() ? lr : param_lr[param_index];
}

double UpdateRule::WeightDecayOf(int param_index) const {
  return param_weight_decay.empty() ? weight_decay
                                    : param_weight_decay[param_index];
}

double UpdateRule::MomentumOf(int param_index) const {
  return param_momentum.empty() ? momentum : param_momentum[param_index];
}

void UpdateRule::SetParamHyperparameters(int param_index, int num_params,
                                         double lr_value, double wd_value,
                                         double momentum_value) {
  if (param_lr.empty()) {
    param_lr.assign(num_params, lr);
    param_weight_decay.assign(num_params, weight_decay);
    param_momentum.assign(num_params, momentum);
  }
  param_lr[param_index] = lr_value;
  param_weight_decay[param_index] = wd_value;
  param_momentum[param_index] = momentum_value;
}

absl::Status UpdateRule::Momentum(kernels::StepKernels& kernels,
                                  device::Stream* stream, int param_index,
                                  void* buf, kernels::ParamDType buf_dtype,
                                  const void* grad,
                                  kernels::ParamDType grad_dtype,
                                  int64_t n) const {
  return kernels.Momentum(stream, buf, buf_dtype, grad, grad_dtype, n,
                          MomentumOf(param_index));
}

absl::Status UpdateRule::Apply(kernels::StepKernels& kernels,
                               device::Stream* stream, int param_index,
                               int64_t rows, int64_t cols, void* param,
                               kernels::ParamDType dtype, const float* update,
                               int64_t n) const {
  const double param_lr_value = LrOf(param_index);
  const double adjusted =
      kernels::AdjustLr(param_lr_value, adjust_lr_fn, rows, cols);
  return kernels.DecayAndApply(stream, param, dtype, update, n, param_lr_value,
                               WeightDecayOf(param_index), adjusted);
}

}  // namespace muon
