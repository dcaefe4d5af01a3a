// The safetensors file format (https://github.com/huggingface/safetensors):
// an 8-byte little-endian uint64 header length N, N bytes of JSON header,
// then the tensors' raw bytes. The header maps each tensor name to
// {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (bytes from
// the start of the data section) and may hold "__metadata__", an object of
// string values. One reader and one header writer for everything here that
// touches the format: the optimizer's checkpoints (checkpoint/checkpoint.h),
// `muonctl spec` (tools/spec_builder.h) and the tests.
//
// Reading trusts nothing: every size is checked before anything is sized
// by it, and no exception escapes.
//
// Thread-safety: pure functions (reading a file is safe concurrently).
#ifndef MUON_COMMON_SAFETENSORS_H_
#define MUON_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"

namespace muon {

// Largest header ReadSafetensorsHeader accepts by default (100 MiB; the
// safetensors library's own bound).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;

// Deepest JSON nesting accepted in a header (a real one nests 3 deep).
inline constexpr int kMaxSafetensorsJsonDepth = 64;

// Most dims of one tensor in a header.
inline constexpr int kMaxSafetensorsDims = 16;

// The header key of the string-to-string metadata object.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

// One tensor of a safetensors file as its header describes it.
struct SafetensorsTensor {
  // The key in the header, e.g. "model.layers.0.self_attn.q_proj.weight".
  std::string name;
  // safetensors' spelling: "F32", "BF16", "F16", "F64", "F8_E4M3",
  // "F8_E5M2", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL".
  std::string dtype;
  // As stored (row-major), each dim >= 0.
  std::vector<int64_t> shape;
  // Byte range [data_begin, data_end) of the tensor's data, relative to
  // the start of the data section; data_end - data_begin = element size x
  // number of elements.
  int64_t data_begin = 0;
  int64_t data_end = 0;
};

// A parsed header.
struct SafetensorsHeader {
  // Sorted by data_begin (the order of their bytes in the file), then name.
  std::vector<SafetensorsTensor> tensors;
  // "__metadata__" (every value a string), empty when absent.
  std::map<std::string, std::string> metadata;
  // File offset of the data section (8 + N) and its size in bytes (the
  // file's size - 8 - N).
  int64_t data_offset = 0;
  int64_t data_size = 0;
};

// Bytes per element of a safetensors dtype ("F32" -> 4); 0 when unknown.
int64_t SafetensorsDtypeSize(absl::string_view dtype);

// Parses the JSON header `text` of a file at `path` (named in errors)
// whose data section has `data_size` bytes. Checks: the JSON nests at most
// kMaxSafetensorsJsonDepth deep, parses, and is an object without
// duplicate keys; "__metadata__", when present, is an object of strings;
// names are 1..kMaxTensorNameBytes bytes; each entry is an object with
// exactly dtype, shape and data_offsets, of those types; a known dtype; at
// most kMaxSafetensorsDims dims, each >= 0, element count without int64
// overflow; 0 <= begin <= end <= data_size, end - begin = dtype size x
// element count; no two tensors' byte ranges overlap.
// Errors: InvalidArgument: the first check that fails; the message names
//   the path and the tensor, e.g. `x.safetensors: tensor "w": data_offsets
//   [0, 96] hold 96 bytes but F32 [4, 4] needs 64`.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    const std::string& path, absl::string_view text, int64_t data_size);

// Reads and parses the header of the file at `path`, reading only its
// first 8 + N bytes (and its size). data_offset and data_size are set.
// Errors (every message names the path):
//   NotFound: the file does not exist.
//   InvalidArgument: the file is shorter than 8 bytes, N exceeds
//     `max_header_bytes` ("exceeds the cap") or runs past the end of the
//     file, or ParseSafetensorsHeader fails.
//   FailedPrecondition: not a regular file.
//   PermissionDenied, Internal: reading failed (errno's text).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path,
    uint64_t max_header_bytes = kMaxSafetensorsHeaderBytes);

// The safetensors rule "the byte buffer needs to be entirely indexed, and
// cannot contain holes": the tensors' byte ranges tile the data section
// exactly. Errors: InvalidArgument naming the path and the first gap,
// overlap or trailing bytes.
absl::Status CheckSafetensorsPacked(const std::string& path,
                                    const SafetensorsHeader& header);

// The first 8 + N bytes of a file holding `tensors` (dtype, shape and
// data_offsets as given; the caller lays out the data to match) and
// `metadata` ("__metadata__", omitted when empty): the length, then the
// JSON header with keys sorted, padded with spaces so that the data section
// starts 8-byte aligned, as the safetensors library writes it.
std::string EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata);

}  // namespace muon

#endif  // MUON_COMMON_SAFETENSORS_H_
