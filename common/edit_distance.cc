#include "common/edit_distance.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muon {

int EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

namespace {

// True when `longer` is `shorter` with a dotted prefix ("module." + ...).
bool DiffersByPrefix(absl::string_view longer, absl::string_view shorter) {
  return longer.size() > shorter.size() &&
         absl::EndsWith(longer, absl::StrCat(".", shorter));
}

}  // namespace

std::string NearestName(absl::string_view name,
                        const std::vector<std::string>& candidates,
                        int max_distance) {
  for (const std::string& c : candidates) {
    if (DiffersByPrefix(name, c) || DiffersByPrefix(c, name)) return c;
  }
  std::string best;
  int best_distance = max_distance + 1;
  for (const std::string& c : candidates) {
    const int d = EditDistance(name, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

}  // namespace muon
