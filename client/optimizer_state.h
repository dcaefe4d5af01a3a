// OptimizerState: what the Muon optimizer keeps between steps on the
// parameters' device, for every local parameter shard: its momentum buffer
// (torch.optim.Muon's state["momentum_buffer"], in the parameter's dtype
// or fp32), an owner transform's row state (NorMuon's, client/normuon.h),
// where the executor reads each parameter's update source from, the
// finite check's per-parameter results, and a snapshot of all of it
// (transactional_step's, or check_finite's under overlap_backward).
#ifndef MUON_CLIENT_OPTIMIZER_STATE_H_
#define MUON_CLIENT_OPTIMIZER_STATE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/step_executor.h"
#include "client/step_snapshot.h"
#include "client/tensor_view.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "kernels/step_kernels.h"

namespace muon {

// What to allocate: one momentum dtype per parameter (its buffer's), a row
// state per parameter or none, and a snapshot or none.
struct OptimizerStateSpec {
  std::vector<kernels::ParamDType> momentum_dtypes;  // one per parameter
  bool row_state = false;  // one fp32 value per local row of each shard
  bool snapshot = false;   // transactional_step, check_finite + overlap
};

class OptimizerState {
 public:
  // One parameter's momentum buffer: size() elements (its local numel) of
  // `dtype` on the parameters' device.
  struct Momentum {
    device::DeviceMemory memory;
    kernels::ParamDType dtype = kernels::ParamDType::kFloat32;
    int64_t numel = 0;
    void* data() const { return memory.data(); }
    int64_t size() const { return numel; }
    int64_t bytes() const { return memory.bytes(); }
  };

  // Zeroed state for `params` (views; their local numel and rows size the
  // buffers): the momentum and row state and the finite-check results
  // from `state`, the snapshot from `snapshot` (both counting allocators of
  // the parameters' device), zeroed through `runtime` (not owned, outlives
  // the state). Errors: InvalidArgument (spec.momentum_dtypes not one per
  // parameter); the allocators' and the runtime's.
  static absl::StatusOr<std::unique_ptr<OptimizerState>> Create(
      const std::vector<ParamView>& params, const OptimizerStateSpec& spec,
      device::Runtime* runtime, device::Allocator* state,
      device::Allocator* snapshot);

  int size() const { return static_cast<int>(momentum_.size()); }
  const Momentum& momentum(int i) const { return momentum_[i]; }
  // Bytes of all momentum buffers.
  int64_t momentum_bytes() const;

  // Parameter i's momentum values as fp32 (a bf16 buffer widened exactly)
  // into / from `values` (host memory, momentum(i).size() floats; writing
  // a bf16 buffer rounds to nearest even). Errors: the device copy's.
  absl::Status ReadMomentum(int i, float* values) const;
  absl::Status WriteMomentum(int i, const float* values);

  // Whether a row state is kept; parameter i's (its local rows, fp32, on
  // the device; empty without one), and a pointer per parameter for the
  // executor (null for none or no rows).
  bool has_row_state() const { return has_row_state_; }
  const device::DeviceBuffer<float>& row_state(int i) const {
    return row_state_[i];
  }
  std::vector<float*> RowStatePointers();
  // Parameter i's row state to / from the host (`values`: row_state(i).
  // size() floats). Read returns empty on a device error.
  std::vector<float> ReadRowState(int i) const;
  absl::Status WriteRowState(int i, const float* values);

  // Where the executor reads each parameter's U from (the momentum
  // buffers; the step sets the gradient of Nesterov's U).
  std::vector<UpdateSource>& update_sources() { return update_sources_; }

  // The finite check: parameter i's result slot on the device (int64; -1:
  // all finite, else the first non-finite element's index), and the
  // slots copied to the host (FetchNonfinite, after the check's kernels
  // ran).
  int64_t* nonfinite_slot(int i) { return nonfinite_.data() + i; }
  // Copies slots [begin, end) to the host (0 <= begin <= end <= the
  // parameter count). Errors: the runtime's copy error.
  absl::Status FetchNonfinite(int begin, int end);
  int64_t nonfinite(int i) const { return host_nonfinite_[i]; }

  // The snapshot (empty without OptimizerStateSpec::snapshot) and the
  // state buffers it copies: the momentum buffers, then the row states.
  StepSnapshot& snapshot() { return snapshot_; }
  const std::vector<const device::DeviceMemory*>& buffers() const {
    return buffers_;
  }

 private:
  OptimizerState() = default;

  device::Runtime* runtime_ = nullptr;
  std::vector<Momentum> momentum_;
  std::vector<UpdateSource> update_sources_;
  bool has_row_state_ = false;
  std::vector<device::DeviceBuffer<float>> row_state_;
  device::DeviceBuffer<int64_t> nonfinite_;
  std::vector<int64_t> host_nonfinite_;
  std::vector<const device::DeviceMemory*> buffers_;
  StepSnapshot snapshot_;
};

}  // namespace muon

#endif  // MUON_CLIENT_OPTIMIZER_STATE_H_
