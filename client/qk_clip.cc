#include "client/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {

int64_t QkClipOptions::total_heads() const {
  int64_t n = 0;
  for (const QkClipLayer& l : layers) n += l.num_heads;
  return n;
}

QkClipOptions QkClipOptionsFromProto(const v1::QkClip& p) {
  QkClipOptions o;
  if (p.has_threshold()) o.threshold = p.threshold();
  if (p.has_alpha()) o.alpha = p.alpha();
  for (const v1::QkClipLayer& l : p.layers()) {
    QkClipLayer layer;
    layer.q_param = l.q_param();
    layer.q_row_begin = l.q_row_begin();
    layer.k_param = l.k_param();
    layer.k_row_begin = l.k_row_begin();
    layer.num_heads = l.num_heads();
    layer.num_kv_heads =
        l.num_kv_heads() == 0 ? l.num_heads() : l.num_kv_heads();
    layer.head_dim = l.head_dim();
    layer.k_head_dim = l.k_head_dim();
    layer.q_rope_dim = l.q_rope_dim();
    o.layers.push_back(std::move(layer));
  }
  return o;
}

absl::Status ValidateQkClipOptions(const QkClipOptions& o) {
  if (!(o.threshold > 0.0 && std::isfinite(o.threshold))) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_clip threshold should be a finite value > 0 but is: ",
                     o.threshold));
  }
  if (!(o.alpha >= 0.0 && o.alpha <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_clip alpha should be in [0, 1] but is: ", o.alpha));
  }
  for (size_t i = 0; i < o.layers.size(); ++i) {
    const QkClipLayer& l = o.layers[i];
    std::string bad;
    if (l.q_param.empty() || l.k_param.empty()) {
      bad = "names no query or no key parameter";
    } else if (l.num_heads < 1 || l.num_kv_heads < 1 ||
               l.num_heads % l.num_kv_heads != 0) {
      bad = absl::StrCat("has num_heads ", l.num_heads, " and num_kv_heads ",
                         l.num_kv_heads,
                         " (both >= 1, num_kv_heads dividing num_heads)");
    } else if (l.head_dim < 1 || l.k_head_dim < 0) {
      bad = absl::StrCat("has head_dim ", l.head_dim, " and k_head_dim ",
                         l.k_head_dim, " (>= 1, and >= 0)");
    } else if (l.q_rope_dim < 0 || l.q_rope_dim >= l.head_dim ||
               (l.q_rope_dim > 0 && l.num_kv_heads != l.num_heads)) {
      bad =
          absl::StrCat("has q_rope_dim ", l.q_rope_dim, " with head_dim ",
                       l.head_dim, " and ", l.num_kv_heads, " of ", l.num_heads,
                       " key heads (MLA: 0 <= q_rope_dim < head_dim, one "
                       "key head per query head)");
    } else if (l.q_row_begin < 0 || l.k_row_begin < 0) {
      bad = absl::StrCat("has row offsets q ", l.q_row_begin, " k ",
                         l.k_row_begin, " (must be >= 0)");
    }
    if (!bad.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("qk_clip layer ", i, " (\"", l.q_param, "\", \"",
                       l.k_param, "\") ", bad));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckQkClipRows(const QkClipLayer& layer, const char* which,
                             const std::vector<int64_t>& global_shape,
                             int layer_index) {
  const bool q = std::string(which) == "q";
  const std::string& name = q ? layer.q_param : layer.k_param;
  const int64_t begin = q ? layer.q_row_begin : layer.k_row_begin;
  const int64_t heads = q ? layer.num_heads : layer.num_kv_heads;
  const int64_t rows_per_head = q ? layer.head_dim : layer.key_rows_per_head();
  if (global_shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_clip layer ", layer_index, ": ", which, " parameter \"", name,
        "\" is not 2-D (", global_shape.size(), " dims)"));
  }
  // begin >= 0, heads >= 1 and rows_per_head >= 1 (ValidateQkClipOptions);
  // their sum and product may exceed int64: compared without forming them.
  const int64_t rows = global_shape[0];
  if (begin > rows || rows_per_head > (rows - begin) / heads) {
    const bool fits = rows_per_head <= (INT64_MAX - begin) / heads;
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_clip layer ", layer_index, ": ", which, " parameter \"", name,
        "\" has ", rows, " rows but ", heads, " heads of ", rows_per_head,
        " rows from row ", begin, " need ",
        fits ? absl::StrCat(begin + heads * rows_per_head)
             : std::string("more than 2^63 - 1")));
  }
  return absl::OkStatus();
}

std::vector<double> QkClipGroupScales(const QkClipLayer& layer,
                                      const float* max_logits,
                                      double threshold) {
  const int per_group = layer.num_heads / layer.num_kv_heads;
  std::vector<double> scales(layer.num_kv_heads, 1.0);
  for (int g = 0; g < layer.num_kv_heads; ++g) {
    double s = -INFINITY;
    for (int h = g * per_group; h < (g + 1) * per_group; ++h) {
      s = std::max(s, static_cast<double>(max_logits[h]));
    }
    if (s > threshold) scales[g] = threshold / s;
  }
  return scales;
}

ElementSpan GlobalRowsSpan(const Range& rows, int64_t cols, int64_t begin,
                           int64_t end) {
  const int64_t lo = std::max(begin, rows.begin);
  const int64_t hi = std::min(end, rows.end);
  if (lo >= hi || cols <= 0) return {};
  return {(lo - rows.begin) * cols, (hi - lo) * cols};
}

}  // namespace muon
