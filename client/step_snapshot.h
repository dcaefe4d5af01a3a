#ifndef MUON_CLIENT_STEP_SNAPSHOT_H_
#define MUON_CLIENT_STEP_SNAPSHOT_H_

// The snapshot of MuonOptions::transactional_step, and of check_finite
// under overlap_backward: a copy of everything a step
// mutates (each parameter's local shard in its own dtype, its optimizer
// state: momentum buffer and NorMuon's row state, the step count), taken before
// the step and copied back, bitwise, after a failed one, so that a failed step
// leaves the optimizer as it was.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/tensor_view.h"
#include "device/memory.h"
#include "device/stream.h"
#include "kernels/step_kernels.h"

namespace muon {

class StepSnapshot {
 public:
  StepSnapshot() = default;  // empty: holds nothing (option off)

  // Room on `alloc`'s device for parameter i's local shard
  // (params[i].local_numel() elements of params[i].dtype), for every i, and
  // for every optimizer state buffer state[k] (the momentum buffers in
  // their dtype, NorMuon's fp32 row state; state[k]->bytes() bytes, none
  // null).
  // Errors: the allocator's (ResourceExhausted, ...).
  static absl::StatusOr<StepSnapshot> Allocate(
      device::Allocator* alloc, const std::vector<ParamView>& params,
      const std::vector<const device::DeviceMemory*>& state);

  // Enqueues the copies of every params[i].data and state[k] (the buffers
  // given to Allocate, in the same order) into the snapshot on `stream`
  // (nullptr: the host, at once) with `kernels`, and records `step`. The
  // caller makes the stream's device current (runs this inside the
  // stream's Launch) and waits for the stream before the values may
  // change. Errors: the kernels' copy errors.
  absl::Status Save(kernels::StepKernels* kernels, device::Stream* stream,
                    const std::vector<ParamView>& params,
                    const std::vector<const device::DeviceMemory*>& state,
                    int64_t step);

  // The reverse copies, like Save; *step = the recorded step count.
  absl::Status Restore(kernels::StepKernels* kernels, device::Stream* stream,
                       const std::vector<ParamView>& params,
                       const std::vector<const device::DeviceMemory*>& state,
                       int64_t* step) const;

 private:
  std::vector<device::DeviceMemory> params_;
  std::vector<device::DeviceMemory> state_;
  int64_t step_ = 0;
};

}  // namespace muon

#endif  // MUON_CLIENT_STEP_SNAPSHOT_H_
