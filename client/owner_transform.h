// The seam for Muon variants that change a matrix's update on its owner
// after Newton-Schulz, with a per-row state of their own: NorMuon
// (client/normuon.h) is one. The executor runs the transform on every
// matrix an owner orthogonalizes and carries the row state with the
// matrix (to the owner with the gather, back to every holder of the rows
// with the redistribute); the optimizer allocates the state and saves it
// under the description's name. A new variant is one such class plus its
// kernel (kernels/step_kernels.h).
#ifndef MUON_CLIENT_OWNER_TRANSFORM_H_
#define MUON_CLIENT_OWNER_TRANSFORM_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "device/stream.h"
#include "kernels/step_kernels.h"

namespace muon {

// A transform's per-row state: one fp32 value per row of every matrix
// (zeros at first), sharded with the parameter's rows.
struct RowStateSpec {
  // Its key in state_dict and checkpoints ("variance_neuron").
  std::string name;
};

class OwnerTransform {
 public:
  virtual ~OwnerTransform() = default;

  // The variant's name in messages ("normuon").
  virtual std::string name() const = 0;

  // The per-row state it keeps.
  virtual RowStateSpec row_state() const = 0;

  // Its hyperparameters by name ({"beta2", 0.95}), which every rank must
  // share: the ranks' manifests carry them and the plan refuses ranks that
  // disagree, naming the parameter as "<name>_<key>".
  virtual std::vector<std::pair<std::string, double>> params() const = 0;

  // Transforms one matrix's Newton-Schulz output `o` [rows, cols] (fp32,
  // row-major, in place) with its full row state `v` [rows] (fp32, updated
  // in place), both on the device of `kernels`, enqueued on `stream`.
  // Errors: the kernels' (Unimplemented where the device has no kernel).
  virtual absl::Status Apply(kernels::StepKernels& kernels,
                             device::Stream* stream, float* o, int64_t rows,
                             int64_t cols, float* v) const = 0;
};

}  // namespace muon

#endif  // MUON_CLIENT_OWNER_TRANSFORM_H_
