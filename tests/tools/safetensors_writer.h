// Writes .safetensors files for the tests of tools/ (spec_builder_test,
// muonctl_test): a header JSON and zero-filled data, or raw (possibly
// hostile) header bytes.
#ifndef MUON_TESTS_TOOLS_SAFETENSORS_WRITER_H_
#define MUON_TESTS_TOOLS_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/spec_builder.h"

namespace muon {
namespace testing {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
};

// Writes the 8-byte little-endian `declared_len` (the header's length when
// negative), `header`, then `data_bytes` zero bytes. False when the file
// cannot be written.
inline bool WriteSafetensorsRaw(const std::string& path,
                                const std::string& header, uint64_t data_bytes,
                                int64_t declared_len = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n =
      declared_len < 0 ? header.size() : static_cast<uint64_t>(declared_len);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
  return out.good();
}

// A real .safetensors file at `path`: `tensors` in order, packed,
// zero-filled, with a "__metadata__" entry. False when it cannot be written.
inline bool WriteSafetensorsFile(
    const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    uint64_t bytes = SafetensorsDtypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= d;
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  return WriteSafetensorsRaw(path, header.dump(), offset);
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_TOOLS_SAFETENSORS_WRITER_H_
