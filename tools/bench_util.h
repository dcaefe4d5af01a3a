// Small pieces shared by the benchmark binaries: `--sizes RxC,...` parsing
// and best/median summaries of repeated timings (any unit).
#ifndef MUON_TOOLS_BENCH_UTIL_H_
#define MUON_TOOLS_BENCH_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/strings/numbers.h"
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

}  // namespace bench
}  // namespace muon

#endif  // MUON_TOOLS_BENCH_UTIL_H_
