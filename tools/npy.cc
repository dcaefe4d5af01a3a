#include "tools/npy.h"

#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muon {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

// Value of 'key' in the header dict, up to the next ',' at depth 0 (or the
// closing parenthesis of a tuple).
std::string HeaderField(const std::string& header, const std::string& key) {
  const std::string k = absl::StrCat("'", key, "':");
  size_t pos = header.find(k);
  if (pos == std::string::npos) return "";
  pos += k.size();
  while (pos < header.size() && header[pos] == ' ') ++pos;
  if (pos < header.size() && header[pos] == '(') {
    size_t end = header.find(')', pos);
    return end == std::string::npos ? "" : header.substr(pos, end - pos + 1);
  }
  size_t end = header.find(',', pos);
  return header.substr(
      pos, end == std::string::npos ? std::string::npos : end - pos);
}

}  // namespace

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good())
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  char magic[8];
  in.read(magic, 8);
  if (!in.good() || std::memcmp(magic, kMagic, 6) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a .npy file"));
  }
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint8_t b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    uint8_t b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in.good())
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  const std::string descr = HeaderField(header, "descr");
  const std::string order = HeaderField(header, "fortran_order");
  if (descr.find("<f4") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": dtype ", descr,
                     " is not float32 ('<f4'); save with "
                     "np.save(path, a.astype(np.float32))"));
  }
  if (absl::StripAsciiWhitespace(order) != "False") {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": Fortran order is not supported; save a C-order array"));
  }
  std::string shape_text = HeaderField(header, "shape");
  absl::string_view s = shape_text;
  absl::ConsumePrefix(&s, "(");
  absl::ConsumeSuffix(&s, ")");
  NpyArray a;
  int64_t numel = 1;
  for (absl::string_view part :
       absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": bad shape ", shape_text));
    }
    a.shape.push_back(d);
    numel *= d;
  }
  a.data.resize(numel);
  in.read(reinterpret_cast<char*>(a.data.data()), numel * sizeof(float));
  if (!in.good() && numel > 0) {
    return absl::DataLossError(absl::StrCat(path, ": truncated data"));
  }
  return a;
}

absl::Status WriteNpy(const std::string& path,
                      const std::vector<int64_t>& shape, const float* data) {
  std::string shape_text = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) shape_text += ",";
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                   shape_text, "), }");
  // Pad so that the data starts on a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::ofstream out(path, std::ios::binary);
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff),
                             static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data), numel * sizeof(float));
  if (!out.good())
    return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace muon
