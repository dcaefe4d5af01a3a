#include "client/step_snapshot.h"

#include <utility>

#include "common/status_macros.h"

namespace muon {

absl::StatusOr<StepSnapshot> StepSnapshot::Allocate(
    device::Allocator* alloc, const std::vector<ParamView>& params,
    const std::vector<device::DeviceBuffer<float>>& momentum) {
  StepSnapshot s;
  s.params_.resize(params.size());
  s.momentum_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& p = params[i];
    MUON_ASSIGN_OR_RETURN(s.params_[i],
                          device::DeviceMemory::Allocate(
                              alloc, p.local_numel() * DTypeSize(p.dtype)));
    MUON_ASSIGN_OR_RETURN(s.momentum_[i], device::DeviceBuffer<float>::Allocate(
                                              alloc, momentum[i].size()));
  }
  return s;
}

absl::Status StepSnapshot::Save(
    kernels::StepKernels* kernels, device::Stream* stream,
    const std::vector<ParamView>& params,
    const std::vector<device::DeviceBuffer<float>>& momentum, int64_t step) {
  for (size_t i = 0; i < params.size(); ++i) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, params_[i].data(),
                                       params[i].data, params_[i].bytes()));
    MUON_RETURN_IF_ERROR(kernels->Copy(
        stream, momentum_[i].data(), momentum[i].data(), momentum[i].bytes()));
  }
  step_ = step;
  return absl::OkStatus();
}

absl::Status StepSnapshot::Restore(
    kernels::StepKernels* kernels, device::Stream* stream,
    const std::vector<ParamView>& params,
    std::vector<device::DeviceBuffer<float>>& momentum, int64_t* step) const {
  *step = step_;
  for (size_t i = 0; i < params.size(); ++i) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, params[i].data,
                                       params_[i].data(), params_[i].bytes()));
    MUON_RETURN_IF_ERROR(kernels->Copy(
        stream, momentum[i].data(), momentum_[i].data(), momentum_[i].bytes()));
  }
  return absl::OkStatus();
}

}  // namespace muon
