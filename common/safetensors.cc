#include "common/safetensors.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <map>
#include <new>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/json_util.h"
#include "common/layout.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace muon {
namespace {

using Json = nlohmann::json;

// A JSON value's type for error messages.
std::string TypeName(const Json& j) { return j.type_name(); }

// An error about tensor `name` of file `path`.
absl::Status TensorError(const std::string& path, const std::string& name,
                         absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": tensor \"", name, "\": ", what));
}

// The name is 1..kMaxTensorNameBytes bytes; the entry is an object with
// exactly dtype, shape and data_offsets.
absl::Status CheckEntryKeys(const std::string& path, const std::string& name,
                            const Json& entry) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a tensor has an empty name"));
  }
  if (name.size() > kMaxTensorNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": a tensor name of ", name.size(), " bytes (starting \"",
        name.substr(0, 64), "...\") exceeds ", kMaxTensorNameBytes, " bytes"));
  }
  if (!entry.is_object()) {
    return TensorError(path, name,
                       absl::StrCat("expected an object with dtype, shape and ",
                                    "data_offsets, got ", TypeName(entry)));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return TensorError(
          path, name,
          absl::StrCat("unknown key \"", key,
                       "\" (expected dtype, shape, data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      return TensorError(path, name, absl::StrCat("missing \"", key, "\""));
    }
  }
  return absl::OkStatus();
}

// The entry's shape (at most kMaxSafetensorsDims dims, each >= 0) into
// info->shape; returns its bytes at `element_size` bytes per element,
// checked against int64 overflow.
absl::StatusOr<int64_t> ParseShape(const std::string& path, const Json& shape,
                                   int64_t element_size,
                                   SafetensorsTensor* info) {
  auto error = [&](absl::string_view what) {
    return TensorError(path, info->name, what);
  };
  if (!shape.is_array()) {
    return error(absl::StrCat("shape must be an array of integers, got ",
                              TypeName(shape)));
  }
  if (shape.size() > static_cast<size_t>(kMaxSafetensorsDims)) {
    return error(absl::StrCat("shape has ", shape.size(), " dims; at most ",
                              kMaxSafetensorsDims));
  }
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t d = 0;
    if (!JsonToInt64(shape[i], &d)) {
      return error(absl::StrCat("shape[", i, "] must be an integer, got ",
                                shape[i].dump()));
    }
    if (d < 0) {
      return error(absl::StrCat("shape[", i, "] is ", d, "; dims are >= 0"));
    }
    info->shape.push_back(d);
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / d) {
      return error(absl::StrCat("shape ", ShapeToString(info->shape),
                                "... has too many elements"));
    }
    numel *= d;
  }
  if (numel != 0 &&
      numel > std::numeric_limits<int64_t>::max() / element_size) {
    return error(absl::StrCat("shape ", ShapeToString(info->shape),
                              " has too many bytes"));
  }
  return numel * element_size;
}

// The entry's data_offsets into info->data_begin/end: 0 <= begin <= end <=
// data_size and end - begin = bytes.
absl::Status ParseDataOffsets(const std::string& path, const Json& offsets,
                              int64_t bytes, int64_t data_size,
                              SafetensorsTensor* info) {
  auto error = [&](absl::string_view what) {
    return TensorError(path, info->name, what);
  };
  if (!offsets.is_array() || offsets.size() != 2 ||
      !JsonToInt64(offsets[0], &info->data_begin) ||
      !JsonToInt64(offsets[1], &info->data_end)) {
    return error(
        absl::StrCat("data_offsets must be [begin, end], two integers, got ",
                     offsets.dump()));
  }
  const std::string range =
      absl::StrCat("[", info->data_begin, ", ", info->data_end, "]");
  if (info->data_begin < 0 || info->data_end < info->data_begin) {
    return error(
        absl::StrCat("data_offsets ", range, " are not 0 <= begin <= end"));
  }
  if (info->data_end > data_size) {
    return error(absl::StrCat("data_offsets ", range,
                              " end beyond the data section of ", data_size,
                              " bytes (file truncated?)"));
  }
  if (info->data_end - info->data_begin != bytes) {
    return error(absl::StrCat("data_offsets ", range, " hold ",
                              info->data_end - info->data_begin, " bytes but ",
                              info->dtype, " ", ShapeToString(info->shape),
                              " needs ", bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& path,
                                                   const std::string& name,
                                                   const Json& entry,
                                                   int64_t data_size) {
  MUON_RETURN_IF_ERROR(CheckEntryKeys(path, name, entry));
  SafetensorsTensor info;
  info.name = name;
  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return TensorError(
        path, name,
        absl::StrCat("dtype must be a string, got ", TypeName(dtype)));
  }
  info.dtype = dtype.get<std::string>();
  const int64_t element_size = SafetensorsDtypeSize(info.dtype);
  if (element_size == 0) {
    return TensorError(path, name,
                       absl::StrCat("unknown dtype \"", info.dtype, "\""));
  }
  MUON_ASSIGN_OR_RETURN(const int64_t bytes,
                        ParseShape(path, entry["shape"], element_size, &info));
  MUON_RETURN_IF_ERROR(
      ParseDataOffsets(path, entry["data_offsets"], bytes, data_size, &info));
  return info;
}

// Parses the header text as JSON: at most kMaxSafetensorsJsonDepth deep,
// an object, and no top-level key named twice.
absl::StatusOr<Json> ParseHeaderJson(const std::string& path,
                                     absl::string_view text) {
  const int depth = JsonDepth(text, kMaxSafetensorsJsonDepth);
  if (depth > kMaxSafetensorsJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header JSON nests more than ",
                     kMaxSafetensorsJsonDepth, " deep"));
  }
  // Keys of the top-level object, to find duplicates (nlohmann keeps the
  // last value of a repeated key silently).
  std::set<std::string> keys;
  std::string duplicate;
  Json::parser_callback_t callback = [&](int d, Json::parse_event_t event,
                                         Json& parsed) {
    if (event == Json::parse_event_t::key && d == 1 && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json header = Json::parse(text.begin(), text.end(), callback,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header JSON must be an object of tensors, got ",
                     TypeName(header)));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header names \"", duplicate, "\" more than once"));
  }
  return header;
}

// The __metadata__ entry (an object of strings) into `metadata`.
absl::Status ParseMetadata(const std::string& path, const Json& entry,
                           std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": __metadata__ must be an object, got ", TypeName(entry)));
  }
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": __metadata__[\"", key,
                       "\"] must be a string, got ", TypeName(value)));
    }
    (*metadata)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

// Checks that the non-empty data ranges of `tensors` (sorted by range) do
// not overlap; empty tensors hold no bytes.
absl::Status CheckRangesDisjoint(
    const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    if (t.data_begin == t.data_end) continue;
    if (previous != nullptr && t.data_begin < previous->data_end) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor \"", t.name, "\": data_offsets [", t.data_begin, ", ",
          t.data_end, "] overlap tensor \"", previous->name, "\"'s [",
          previous->data_begin, ", ", previous->data_end, "]"));
    }
    previous = &t;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    const std::string& path, absl::string_view text, int64_t data_size) {
  MUON_ASSIGN_OR_RETURN(const Json header, ParseHeaderJson(path, text));
  SafetensorsHeader out;
  out.data_size = data_size;
  std::vector<SafetensorsTensor>& tensors = out.tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == kSafetensorsMetadataKey) {
      MUON_RETURN_IF_ERROR(ParseMetadata(path, entry, &out.metadata));
      continue;
    }
    MUON_ASSIGN_OR_RETURN(SafetensorsTensor info,
                          ParseTensorEntry(path, name, entry, data_size));
    tensors.push_back(std::move(info));
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  // Non-empty ranges must not overlap (empty tensors hold no bytes).
  MUON_RETURN_IF_ERROR(CheckRangesDisjoint(path, tensors));
  return out;
}

int64_t SafetensorsDtypeSize(absl::string_view dtype) {
  static const std::pair<const char*, int64_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  for (const auto& [name, size] : kSizes) {
    if (dtype == name) return size;
  }
  return 0;
}

namespace {

// The header length N from the first 8 bytes of `fd`, checked against
// the cap and the file size.
absl::StatusOr<int64_t> ReadHeaderLength(int fd, const std::string& path,
                                         int64_t file_size,
                                         uint64_t max_header_bytes) {
  if (file_size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file_size,
        " bytes is too short for a .safetensors file (8-byte header "
        "length first)"));
  }
  unsigned char len_bytes[8];
  MUON_ASSIGN_OR_RETURN(const int64_t got,
                        PreadFull(fd, len_bytes, 8, 0, path));
  if (got != 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": short read of the header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > max_header_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n,
                                                   " bytes exceeds the cap of ",
                                                   max_header_bytes, " bytes"));
  }
  if (n > static_cast<uint64_t>(file_size) - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", n, " bytes runs past the end of the ",
        file_size, "-byte file (truncated or not a safetensors file)"));
  }
  return static_cast<int64_t>(n);
}

absl::StatusOr<SafetensorsHeader> ReadHeader(const std::string& path,
                                             uint64_t max_header_bytes) {
  MUON_ASSIGN_OR_RETURN(ScopedFd fd, OpenForRead(path));
  MUON_ASSIGN_OR_RETURN(const int64_t file_size, FileSize(fd.get(), path));
  MUON_ASSIGN_OR_RETURN(
      const int64_t n,
      ReadHeaderLength(fd.get(), path, file_size, max_header_bytes));
  std::string text(static_cast<size_t>(n), '\0');
  MUON_ASSIGN_OR_RETURN(const int64_t got,
                        PreadFull(fd.get(), text.data(), n, 8, path));
  if (got != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header read came up short: ", got, " of ", n, " bytes"));
  }
  MUON_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ParseSafetensorsHeader(path, text, file_size - 8 - n));
  header.data_offset = 8 + n;
  return header;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path, uint64_t max_header_bytes) {
  try {
    return ReadHeader(path, max_header_bytes);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": out of memory reading the header"));
  } catch (const std::exception& e) {
    // nlohmann's accessors are only used after type checks; this is a
    // safety net so that no exception crosses the API.
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad header: ", e.what()));
  }
}

absl::Status CheckSafetensorsPacked(const std::string& path,
                                    const SafetensorsHeader& header) {
  // header.tensors is sorted by data_begin.
  int64_t at = 0;
  for (const SafetensorsTensor& t : header.tensors) {
    if (t.data_begin != at) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": data_offsets leave a gap or overlap at byte ",
                       at, " of the data section (tensor \"", t.name,
                       "\" starts at ", t.data_begin, ")"));
    }
    at = t.data_end;
  }
  if (at != header.data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensors cover ", at,
                     " bytes but the data section has ", header.data_size));
  }
  return absl::OkStatus();
}

std::string EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  for (const SafetensorsTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {t.data_begin, t.data_end}}};
  }
  if (!metadata.empty()) header[kSafetensorsMetadataKey] = metadata;
  std::string text = DumpJson(header);
  // Pad so the data section starts 8-byte aligned.
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  return out + text;
}

}  // namespace muon
