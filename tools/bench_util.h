// Small pieces shared by the benchmark binaries: `--sizes RxC,...` parsing,
// best/median summaries of repeated timings (any unit), and the core type
// printed next to CPU figures.
#ifndef MUON_TOOLS_BENCH_UTIL_H_
#define MUON_TOOLS_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace muon {
namespace bench {

struct Shape {
  int64_t rows;
  int64_t cols;
};

// Parses "1024x1024,4096x11008" into shapes; prints an error naming
// `program` and the bad item and returns false on malformed input.
inline bool ParseSizes(absl::string_view text, const char* program,
                       std::vector<Shape>* shapes) {
  shapes->clear();
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> dims = absl::StrSplit(item, 'x');
    Shape shape;
    if (dims.size() != 2 || !absl::SimpleAtoi(dims[0], &shape.rows) ||
        !absl::SimpleAtoi(dims[1], &shape.cols) || shape.rows < 1 ||
        shape.cols < 1) {
      std::fprintf(stderr, "%s: bad size \"%.*s\" (want RxC)\n", program,
                   static_cast<int>(item.size()), item.data());
      return false;
    }
    shapes->push_back(shape);
  }
  return !shapes->empty();
}

// Best and median of repeated measurements (same unit as the inputs).
struct Timing {
  double best;
  double median;
};

inline Timing Summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return {samples.front(), samples[samples.size() / 2]};
}

// The machine's core type from /proc/cpuinfo's first processor, as
// "AMD EPYC (family 26, model 2)": the model name alone does not tell
// two generations apart. "unknown" where the file or the fields are
// missing (not Linux).
inline std::string CpuDescription() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  const auto value = [&line] {
    const size_t colon = line.find(':');
    return colon == std::string::npos
               ? std::string()
               : std::string(absl::StripAsciiWhitespace(
                     absl::string_view(line).substr(colon + 1)));
  };
  while (std::getline(in, line) && !line.empty()) {  // the first processor
    if (absl::StartsWith(line, "model name")) {
      name = value();
    } else if (absl::StartsWith(line, "cpu family")) {
      family = value();
    } else if (absl::StartsWith(line, "model\t")) {
      model = value();
    }
  }
  if (name.empty()) return "unknown";
  if (family.empty() || model.empty()) return name;
  return absl::StrCat(name, " (family ", family, ", model ", model, ")");
}

}  // namespace bench
}  // namespace muon

#endif  // MUON_TOOLS_BENCH_UTIL_H_
