#include "common/json_util.h"

#include <algorithm>
#include <limits>

namespace muon {

bool JsonToInt64(const nlohmann::json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    *out = j.get<int64_t>();
    return true;
  }
  return false;
}

bool JsonToInt64Array(const nlohmann::json& j, std::vector<int64_t>* out) {
  if (!j.is_array()) return false;
  out->clear();
  out->reserve(j.size());
  for (const nlohmann::json& e : j) {
    int64_t v;
    if (!JsonToInt64(e, &v)) return false;
    out->push_back(v);
  }
  return true;
}

bool JsonToStringArray(const nlohmann::json& j, std::vector<std::string>* out) {
  if (!j.is_array()) return false;
  out->clear();
  out->reserve(j.size());
  for (const nlohmann::json& e : j) {
    if (!e.is_string()) return false;
    out->push_back(e.get<std::string>());
  }
  return true;
}

const nlohmann::json* JsonMember(const nlohmann::json& obj,
                                 absl::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

int JsonDepth(absl::string_view text, int limit) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::string DumpJson(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false,
                nlohmann::json::error_handler_t::replace);
}

}  // namespace muon
