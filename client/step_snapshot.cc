#include "client/step_snapshot.h"

#include <utility>

#include "common/status_macros.h"

namespace muon {

absl::StatusOr<StepSnapshot> StepSnapshot::Allocate(
    device::Allocator* alloc, const std::vector<ParamView>& params,
    const std::vector<const device::DeviceMemory*>& state) {
  StepSnapshot s;
  s.params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& p = params[i];
    MUON_ASSIGN_OR_RETURN(s.params_[i],
                          device::DeviceMemory::Allocate(
                              alloc, p.local_numel() * DTypeSize(p.dtype)));
  }
  s.state_.resize(state.size());
  for (size_t k = 0; k < state.size(); ++k) {
    MUON_ASSIGN_OR_RETURN(
        s.state_[k], device::DeviceMemory::Allocate(alloc, state[k]->bytes()));
  }
  return s;
}

absl::Status StepSnapshot::Save(
    kernels::StepKernels* kernels, device::Stream* stream,
    const std::vector<ParamView>& params,
    const std::vector<const device::DeviceMemory*>& state, int64_t step) {
  for (size_t i = 0; i < params.size(); ++i) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, params_[i].data(),
                                       params[i].data, params_[i].bytes()));
  }
  for (size_t k = 0; k < state.size(); ++k) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, state_[k].data(),
                                       state[k]->data(), state[k]->bytes()));
  }
  step_ = step;
  return absl::OkStatus();
}

absl::Status StepSnapshot::Restore(
    kernels::StepKernels* kernels, device::Stream* stream,
    const std::vector<ParamView>& params,
    const std::vector<const device::DeviceMemory*>& state,
    int64_t* step) const {
  *step = step_;
  for (size_t i = 0; i < params.size(); ++i) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, params[i].data,
                                       params_[i].data(), params_[i].bytes()));
  }
  for (size_t k = 0; k < state.size(); ++k) {
    MUON_RETURN_IF_ERROR(kernels->Copy(stream, state[k]->data(),
                                       state_[k].data(), state_[k].bytes()));
  }
  return absl::OkStatus();
}

}  // namespace muon
