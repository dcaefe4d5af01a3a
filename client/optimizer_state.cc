#include "client/optimizer_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/bfloat16.h"

namespace muon {

absl::StatusOr<std::unique_ptr<OptimizerState>> OptimizerState::Create(
    const std::vector<ParamView>& params, const OptimizerStateSpec& spec,
    device::Runtime* runtime, device::Allocator* state,
    device::Allocator* snapshot) {
  const size_t n = params.size();
  if (spec.momentum_dtypes.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OptimizerState: momentum_dtypes has ", spec.momentum_dtypes.size(),
        " entries for ", n, " parameters"));
  }
  std::unique_ptr<OptimizerState> s(new OptimizerState());
  s->runtime_ = runtime;
  s->momentum_.resize(n);
  s->update_sources_.assign(n, UpdateSource());
  for (size_t i = 0; i < n; ++i) {
    Momentum& m = s->momentum_[i];
    m.numel = params[i].local_numel();
    m.dtype = spec.momentum_dtypes[i];
    MUON_ASSIGN_OR_RETURN(
        m.memory, device::DeviceMemory::Allocate(
                      state, m.numel * kernels::ParamDTypeSize(m.dtype)));
    // Zeros (host memory comes zero-filled; device memory does not), set
    // on the device: no host buffer, no copy of the state's size.
    if (!runtime->device().is_host()) {
      MUON_RETURN_IF_ERROR(runtime->Zero(m.data(), m.bytes()));
    }
    s->update_sources_[i].momentum = m.data();
    s->update_sources_[i].momentum_dtype = m.dtype;
  }
  MUON_ASSIGN_OR_RETURN(s->nonfinite_, device::DeviceBuffer<int64_t>::Allocate(
                                           state, static_cast<int64_t>(n)));
  // Defined, as on the host: the slots of parameters without local
  // elements are fetched with the others but never written by a scan.
  if (!runtime->device().is_host() && s->nonfinite_.bytes() > 0) {
    MUON_RETURN_IF_ERROR(
        runtime->Zero(s->nonfinite_.data(), s->nonfinite_.bytes()));
  }
  s->host_nonfinite_.assign(n, -1);
  s->has_row_state_ = spec.row_state;
  s->row_state_.resize(n);
  for (size_t i = 0; i < n && spec.row_state; ++i) {
    MUON_ASSIGN_OR_RETURN(
        s->row_state_[i],
        device::DeviceBuffer<float>::Allocate(state, params[i].local_rows()));
    if (!runtime->device().is_host() && s->row_state_[i].bytes() > 0) {
      MUON_RETURN_IF_ERROR(
          runtime->Zero(s->row_state_[i].data(), s->row_state_[i].bytes()));
    }
  }
  for (const Momentum& m : s->momentum_) s->buffers_.push_back(&m.memory);
  for (const auto& b : s->row_state_) s->buffers_.push_back(&b.memory());
  if (spec.snapshot) {
    MUON_ASSIGN_OR_RETURN(
        s->snapshot_, StepSnapshot::Allocate(snapshot, params, s->buffers_));
  }
  return s;
}

int64_t OptimizerState::momentum_bytes() const {
  int64_t bytes = 0;
  for (const Momentum& m : momentum_) bytes += m.bytes();
  return bytes;
}

absl::Status OptimizerState::ReadMomentum(int i, float* values) const {
  const Momentum& m = momentum_[i];
  if (m.dtype == kernels::ParamDType::kFloat32) {
    return runtime_->CopyToHost(values, m.data(), m.bytes());
  }
  std::vector<kernels::bf16_t> bits(m.size());
  MUON_RETURN_IF_ERROR(runtime_->CopyToHost(bits.data(), m.data(), m.bytes()));
  for (int64_t k = 0; k < m.size(); ++k) {
    values[k] = kernels::Bf16ToFloat(bits[k]);
  }
  return absl::OkStatus();
}

absl::Status OptimizerState::WriteMomentum(int i, const float* values) {
  const Momentum& m = momentum_[i];
  if (m.dtype == kernels::ParamDType::kFloat32) {
    return runtime_->CopyFromHost(m.data(), values, m.bytes());
  }
  std::vector<kernels::bf16_t> bits(m.size());
  for (int64_t k = 0; k < m.size(); ++k) {
    bits[k] = kernels::FloatToBf16(values[k]);
  }
  return runtime_->CopyFromHost(m.data(), bits.data(), m.bytes());
}

std::vector<float*> OptimizerState::RowStatePointers() {
  std::vector<float*> out(row_state_.size(), nullptr);
  for (size_t i = 0; i < row_state_.size(); ++i) {
    if (row_state_[i].size() > 0) out[i] = row_state_[i].data();
  }
  return out;
}

std::vector<float> OptimizerState::ReadRowState(int i) const {
  const device::DeviceBuffer<float>& b = row_state_[i];
  std::vector<float> out(b.size());
  if (!runtime_->CopyToHost(out.data(), b.data(), b.bytes()).ok()) out.clear();
  return out;
}

absl::Status OptimizerState::WriteRowState(int i, const float* values) {
  const device::DeviceBuffer<float>& b = row_state_[i];
  if (b.size() == 0) return absl::OkStatus();
  return runtime_->CopyFromHost(b.data(), values, b.bytes());
}

absl::Status OptimizerState::FetchNonfinite(int begin, int end) {
  return runtime_->CopyToHost(host_nonfinite_.data() + begin,
                              nonfinite_.data() + begin,
                              (end - begin) * sizeof(int64_t));
}

}  // namespace muon
