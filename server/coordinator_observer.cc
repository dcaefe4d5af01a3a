#include "server/coordinator_observer.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace muon {

std::string LogValue(absl::string_view value) {
  if (!value.empty() &&
      value.find_first_of(" \"\\=\n\t") == absl::string_view::npos) {
    return std::string(value);
  }
  return absl::StrCat("\"", absl::CEscape(value), "\"");
}

}  // namespace muon
