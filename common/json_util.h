// Reading untrusted JSON (nlohmann::json) without exceptions: typed
// accessors that check before they convert, and a nesting-depth scan to run
// before parsing (nlohmann's parser recurses once per level).
//
// Thread-safety: pure functions.
#ifndef MUON_COMMON_JSON_UTIL_H_
#define MUON_COMMON_JSON_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace muon {

// An int64 from a JSON integer (not a float, not a bool, not above
// INT64_MAX); false otherwise.
bool JsonToInt64(const nlohmann::json& j, int64_t* out);

// An array of JsonToInt64 integers; false when `j` is not one.
bool JsonToInt64Array(const nlohmann::json& j, std::vector<int64_t>* out);

// An array of strings; false when `j` is not one.
bool JsonToStringArray(const nlohmann::json& j, std::vector<std::string>* out);

// The member `key` of object `obj`, or nullptr (also when `obj` is not an
// object).
const nlohmann::json* JsonMember(const nlohmann::json& obj,
                                 absl::string_view key);

// The deepest nesting of `text` as JSON ('[' and '{' outside strings),
// counted up to `limit` + 1 (a deeper text returns limit + 1 without
// reading further). Does not validate the JSON.
int JsonDepth(absl::string_view text, int limit);

// `j` as compact JSON (or indented by `indent` spaces), invalid UTF-8
// replaced by U+FFFD instead of throwing.
std::string DumpJson(const nlohmann::json& j, int indent = -1);

}  // namespace muon

#endif  // MUON_COMMON_JSON_UTIL_H_
