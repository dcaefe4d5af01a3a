// Near-miss suggestions for error messages: which known name a mistyped or
// differently-prefixed one was probably meant to be.
#ifndef MUON_COMMON_EDIT_DISTANCE_H_
#define MUON_COMMON_EDIT_DISTANCE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace muon {

// Levenshtein distance (insertions, deletions, substitutions; each 1)
// between `a` and `b`. O(|a| * |b|) time, O(|b|) memory.
int EditDistance(absl::string_view a, absl::string_view b);

// The candidate `name` was most likely meant as: one that equals `name`
// after dropping a dotted prefix from either ("module.fc1.weight" vs
// "fc1.weight", as DDP, FSDP1 and torch.compile's "_orig_mod." add), else
// the closest by EditDistance within `max_distance`; "" when none is close.
std::string NearestName(absl::string_view name,
                        const std::vector<std::string>& candidates,
                        int max_distance = 3);

}  // namespace muon

#endif  // MUON_COMMON_EDIT_DISTANCE_H_
