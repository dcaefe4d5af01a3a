// Safetensors files for tests: real ones (header from
// EncodeSafetensorsHeader, zero-filled data), raw (possibly hostile) header
// bytes, and a file split into its header JSON and data so that a test can
// corrupt the header and write it back.
#ifndef MUON_TESTS_COMMON_SAFETENSORS_TEST_UTIL_H_
#define MUON_TESTS_COMMON_SAFETENSORS_TEST_UTIL_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace muon {
namespace testing {

struct TestTensor {
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
// zero-filled, with {"format": "pt"} as its metadata (as torch's
// save_file writes). False when it cannot be written.
inline bool WriteSafetensorsFile(const std::string& path,
                                 const std::vector<TestTensor>& tensors) {
  std::vector<SafetensorsTensor> entries;
  int64_t offset = 0;
  for (const TestTensor& t : tensors) {
    int64_t bytes = SafetensorsDtypeSize(t.dtype);
    for (int64_t d : t.shape) bytes *= d;
    entries.push_back({t.name, t.dtype, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  const std::string head = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  return WriteSafetensorsRaw(path, head.substr(8),
                             static_cast<uint64_t>(offset));
}

// A real .safetensors file `file` in the test's temporary folder (gtest's
// TempDir()); returns its path. The write is EXPECTed to succeed.
inline std::string WriteTempSafetensors(
    const std::string& file, const std::vector<TestTensor>& tensors) {
  const std::string path = ::testing::TempDir() + "/" + file;
  EXPECT_TRUE(WriteSafetensorsFile(path, tensors)) << path;
  return path;
}

// A safetensors file's bytes as its header JSON text and its data section.
struct SafetensorsParts {
  std::string header;
  std::string data;
};

// Splits `bytes` (a well-formed file) at the length its first 8 bytes give.
inline SafetensorsParts SplitSafetensors(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  return {bytes.substr(8, n), bytes.substr(8 + n)};
}

// The bytes of a file with `header` (JSON text, its length written first)
// and `data`.
inline std::string JoinSafetensors(const std::string& header,
                                   const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_COMMON_SAFETENSORS_TEST_UTIL_H_
