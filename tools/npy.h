// Minimal .npy (NumPy format 1.0/2.0) I/O for float32 C-order arrays: how
// `muonctl validate` exchanges parameters and gradients with PyTorch/NumPy
// (np.save / np.load).
//
// Reading is strict (every field of the file is checked before anything is
// sized by it):
//   - magic "\x93NUMPY", version 1.0 (2-byte header length) or 2.0 (4-byte);
//   - header length at most kMaxNpyHeaderBytes (numpy writes < 200 bytes);
//   - the header is exactly a Python dict literal with the three keys
//     'descr', 'fortran_order' and 'shape', each once, in any order:
//     descr exactly '<f4' (little-endian float32), fortran_order exactly
//     False, shape a tuple of non-negative integers; then only spaces and
//     one trailing newline;
//   - the element count (product of the shape, checked int64) is at most
//     kMaxNpyElements and the file holds exactly header + 4 * count bytes:
//     a shorter file is DataLoss, trailing bytes are InvalidArgument.
#ifndef MUON_TOOLS_NPY_H_
#define MUON_TOOLS_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muon {

// Largest accepted header (bytes after the length field).
inline constexpr int64_t kMaxNpyHeaderBytes = int64_t{1} << 20;
// Largest accepted element count of one array (2^36 float32 = 256 GiB).
inline constexpr int64_t kMaxNpyElements = int64_t{1} << 36;

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // row-major
};

// Errors: NotFound (cannot open, names the path); InvalidArgument (not a
// float32 C-order .npy, a malformed or oversized header, a bad shape, or
// trailing bytes; names the path and the offending field and value);
// DataLoss (truncated header or data, with the byte counts).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// The shape of the .npy file `path`, reading only its header: the same
// checks and errors as ReadNpy except those of the data bytes' reading
// (the file's size must still match the header).
absl::StatusOr<std::vector<int64_t>> ReadNpyShape(const std::string& path);

// ReadNpy on the bytes of a whole file in memory; `what` names it in
// messages. Same checks and errors (no NotFound).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  absl::string_view what);

// Writes `data` (prod(shape) float32 values) as a .npy file.
// Errors: Internal when the file cannot be written.
absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape, const float* data);

// The file name (no folder, no extension) a parameter named `name` is
// stored under: `name` with every byte outside [A-Za-z0-9_.-] written as
// %XX (upper-case hex), so "fc1.weight" stays "fc1.weight", "blocks/0/w"
// becomes "blocks%2F0%2Fw" and "../../x" becomes "..%2F..%2Fx": with
// ".npy" appended the result is always a single plain file name inside its
// folder (never "." or "..", never a '/'), and distinct names give distinct
// files.
std::string NpyFileName(absl::string_view name);

}  // namespace muon

#endif  // MUON_TOOLS_NPY_H_
