// Resident set size of a process, read from /proc: shared by the soak's
// rank program (its own RSS) and the soak test (the daemon's).
#ifndef MUON_TESTS_SOAK_RSS_H_
#define MUON_TESTS_SOAK_RSS_H_

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace muon {
namespace testing {

// VmRSS in KiB of /proc/<pid>/status (`pid` "self" for this process), or
// -1 when it cannot be read.
inline int64_t RssKb(const std::string& pid = "self") {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view v = line;
    if (absl::ConsumePrefix(&v, "VmRSS:")) {
      absl::ConsumeSuffix(&v, "kB");
      int64_t kb = -1;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(v), &kb)) return kb;
    }
  }
  return -1;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_SOAK_RSS_H_
