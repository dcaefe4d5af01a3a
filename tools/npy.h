// Minimal .npy (NumPy format 1.0) I/O for float32 C-order arrays: how
// `muonctl validate` exchanges parameters and gradients with PyTorch/NumPy
// (np.save / np.load). Only '<f4' and fortran_order False are accepted.
#ifndef MUON_TOOLS_NPY_H_
#define MUON_TOOLS_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muon {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
};

// Errors: NotFound (cannot open, names the path); InvalidArgument (not a
// float32 C-order .npy, names the path and the header's dtype/order);
// DataLoss (truncated).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Writes `data` (prod(shape) float32 values) as a .npy file.
// Errors: Internal when the file cannot be written.
absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape, const float* data);

}  // namespace muon

#endif  // MUON_TOOLS_NPY_H_
