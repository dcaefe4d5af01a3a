#include "tools/npy.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace muon {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr int64_t kMagicBytes = 6;

// The parsed header: shape and where the data starts.
struct NpyHeader {
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t data_offset = 0;  // bytes from the start of the file
};

// A strict scanner over the header's Python dict literal.
class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view what)
      : text_(text), what_(what) {}

  absl::Status Parse(std::vector<int64_t>* shape) {
    SkipSpaces();
    if (!Consume('{')) return Error("header does not start with '{'");
    bool descr = false, order = false, has_shape = false;
    while (true) {
      SkipSpaces();
      if (Consume('}')) break;
      std::string key;
      if (!ParseString(&key)) return Error("expected a quoted key");
      SkipSpaces();
      if (!Consume(':')) return Error("expected ':' after a key");
      SkipSpaces();
      if (key == "descr") {
        if (descr) return Error("'descr' appears twice");
        descr = true;
        std::string value;
        if (!ParseString(&value)) return Error("'descr' is not a string");
        if (value != "<f4") {
          return absl::InvalidArgumentError(
              absl::StrCat(what_, ": dtype '", value,
                           "' is not float32 ('<f4'); save with "
                           "np.save(path, a.astype(np.float32))"));
        }
      } else if (key == "fortran_order") {
        if (order) return Error("'fortran_order' appears twice");
        order = true;
        if (ConsumeWord("True")) {
          return absl::InvalidArgumentError(
              absl::StrCat(what_,
                           ": Fortran order is not supported; save "
                           "a C-order array"));
        }
        if (!ConsumeWord("False")) {
          return Error("'fortran_order' is not False");
        }
      } else if (key == "shape") {
        if (has_shape) return Error("'shape' appears twice");
        has_shape = true;
        MUON_RETURN_IF_ERROR(ParseShape(shape));
      } else {
        return Error(absl::StrCat("unexpected key '", key, "'"));
      }
      SkipSpaces();
      if (Consume(',')) continue;
      SkipSpaces();
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    if (!descr || !order || !has_shape) {
      return Error(
          "the header must give 'descr', 'fortran_order' and "
          "'shape'");
    }
    // Padding: spaces, then one newline at the very end (numpy's format;
    // a header without the newline is accepted as older writers did).
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '\n') ++pos_;
    if (pos_ != text_.size()) {
      return Error(
          absl::StrCat("unexpected bytes after the dict at offset ", pos_));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status ParseShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("'shape' is not a tuple");
    shape->clear();
    while (true) {
      SkipSpaces();
      if (Consume(')')) break;
      size_t start = pos_;
      while (pos_ < text_.size() &&
             absl::ascii_isdigit(static_cast<unsigned char>(text_[pos_]))) {
        ++pos_;
      }
      int64_t d = 0;
      if (pos_ == start ||
          !absl::SimpleAtoi(text_.substr(start, pos_ - start), &d)) {
        return Error(absl::StrCat("'shape' has a bad dimension at offset ",
                                  start, " (non-negative integers only)"));
      }
      shape->push_back(d);
      SkipSpaces();
      if (Consume(',')) continue;
      SkipSpaces();
      if (Consume(')')) break;
      return Error("expected ',' or ')' in 'shape'");
    }
    // (3) without a comma is an int in Python, not a tuple: numpy writes (3,).
    return absl::OkStatus();
  }

  bool ParseString(std::string* out) {
    if (pos_ >= text_.size()) return false;
    const char quote = text_[pos_];
    if (quote != '\'' && quote != '"') return false;
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    *out = std::string(text_.substr(pos_ + 1, end - pos_ - 1));
    if (out->find('\\') != std::string::npos) return false;
    pos_ = end + 1;
    return true;
  }

  bool ConsumeWord(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    const size_t after = pos_ + word.size();
    if (after < text_.size() &&
        (absl::ascii_isalnum(static_cast<unsigned char>(text_[after])) ||
         text_[after] == '_')) {
      return false;
    }
    pos_ = after;
    return true;
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": malformed .npy header (", message,
                     "): ", absl::CHexEscape(text_.substr(0, 200))));
  }

  absl::string_view text_;
  absl::string_view what_;
  size_t pos_ = 0;
};

// Checks the preamble (magic, version, header length) given the first
// bytes of the file and its total size. Returns the header's offset and
// length; nothing is allocated from the length before it is bounded.
absl::Status ParsePreamble(absl::string_view head, int64_t file_size,
                           absl::string_view what, int64_t* header_offset,
                           int64_t* header_len) {
  if (head.size() < 8 ||
      head.substr(0, kMagicBytes) != absl::string_view(kMagic, kMagicBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not a .npy file (no \\x93NUMPY magic)"));
  }
  const int major = static_cast<unsigned char>(head[6]);
  const int minor = static_cast<unsigned char>(head[7]);
  if ((major != 1 && major != 2) || minor != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": .npy format version ", major, ".", minor,
                     " is not supported (1.0 or 2.0)"));
  }
  const int64_t len_bytes = major == 1 ? 2 : 4;
  if (static_cast<int64_t>(head.size()) < 8 + len_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": truncated .npy preamble (",
                                            file_size, " bytes)"));
  }
  uint64_t len = 0;
  for (int64_t i = len_bytes - 1; i >= 0; --i) {
    len = (len << 8) | static_cast<unsigned char>(head[8 + i]);
  }
  if (static_cast<int64_t>(len) > kMaxNpyHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": .npy header length ", len,
                     " exceeds the limit of ", kMaxNpyHeaderBytes, " bytes"));
  }
  *header_offset = 8 + len_bytes;
  *header_len = static_cast<int64_t>(len);
  if (*header_offset + *header_len > file_size) {
    return absl::DataLossError(
        absl::StrCat(what, ": truncated .npy header: it claims ", len,
                     " bytes but the "
                     "file holds ",
                     file_size, " bytes in all"));
  }
  return absl::OkStatus();
}

// Parses the header text and checks the file size against the shape.
absl::StatusOr<NpyHeader> ParseHeader(absl::string_view header,
                                      int64_t header_end, int64_t file_size,
                                      absl::string_view what) {
  NpyHeader h;
  HeaderParser parser(header, what);
  absl::Status s = parser.Parse(&h.shape);
  if (!s.ok()) return s;
  std::optional<int64_t> numel = CheckedProduct(h.shape, kMaxNpyElements);
  if (!numel.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape (", absl::StrJoin(h.shape, ", "),
                     ") has more than ", kMaxNpyElements, " elements"));
  }
  h.numel = *numel;
  h.data_offset = header_end;
  const int64_t expected = header_end + h.numel * 4;
  if (file_size < expected) {
    return absl::DataLossError(absl::StrCat(
        what, ": truncated .npy data: shape (", absl::StrJoin(h.shape, ", "),
        ") needs ", h.numel * 4, " bytes of data but the file holds ",
        file_size - header_end));
  }
  if (file_size > expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", file_size - expected,
        " trailing bytes after the .npy data (shape (",
        absl::StrJoin(h.shape, ", "), ") needs ", h.numel * 4, " bytes)"));
  }
  return h;
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  absl::string_view what) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  int64_t offset = 0, len = 0;
  absl::Status s =
      ParsePreamble(bytes.substr(0, 12), size, what, &offset, &len);
  if (!s.ok()) return s;
  absl::StatusOr<NpyHeader> h =
      ParseHeader(bytes.substr(offset, len), offset + len, size, what);
  if (!h.ok()) return h.status();
  NpyArray a;
  a.shape = h->shape;
  a.data.resize(h->numel);
  if (h->numel > 0) {
    std::memcpy(a.data.data(), bytes.data() + h->data_offset, h->numel * 4);
  }
  return a;
}

namespace {

// Opens `path` into `in` and reads and checks its preamble and header
// (against the file's real size); `in` is left at the data.
absl::StatusOr<NpyHeader> OpenNpy(const std::string& path, std::ifstream& in) {
  in.open(path, std::ios::binary | std::ios::ate);
  if (!in.good()) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  }
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size < 0) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  in.seekg(0);
  char head[12] = {};
  const int64_t head_len = std::min<int64_t>(size, sizeof(head));
  in.read(head, head_len);
  if (!in.good())
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  int64_t offset = 0, len = 0;
  absl::Status s = ParsePreamble(absl::string_view(head, head_len), size, path,
                                 &offset, &len);
  if (!s.ok()) return s;
  // Bounded by kMaxNpyHeaderBytes and by the file's real size.
  std::string header(len, '\0');
  in.seekg(offset);
  in.read(header.data(), len);
  if (!in.good()) {
    return absl::DataLossError(absl::StrCat(path, ": truncated header"));
  }
  return ParseHeader(header, offset + len, size, path);
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ReadNpyShape(const std::string& path) {
  std::ifstream in;
  absl::StatusOr<NpyHeader> h = OpenNpy(path, in);
  if (!h.ok()) return h.status();
  return std::move(h->shape);
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in;
  absl::StatusOr<NpyHeader> h = OpenNpy(path, in);
  if (!h.ok()) return h.status();
  NpyArray a;
  a.shape = h->shape;
  // Sized by the shape only after it matched the file's real size.
  a.data.resize(h->numel);
  if (h->numel > 0) {
    in.read(reinterpret_cast<char*>(a.data.data()), h->numel * 4);
    if (!in.good()) {
      return absl::DataLossError(absl::StrCat(path, ": truncated data"));
    }
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
  std::optional<int64_t> numel = CheckedProduct(shape, kMaxNpyElements);
  if (!numel.has_value() || header.size() > 0xffff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write ", path, ": shape [", absl::StrJoin(shape, ", "),
        "] is too large for a .npy file"));
  }
  std::ofstream out(path, std::ios::binary);
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff),
                             static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data), *numel * sizeof(float));
  if (!out.good())
    return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string NpyFileName(absl::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '_' || c == '.' || c == '-') {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", u);
    }
  }
  return out;
}

}  // namespace muon
