// QK-clip (MuonClip): after the optimizer step, the query and key
// projection rows of every attention head whose largest pre-softmax logit
// S_max exceeded a threshold tau are scaled so that the head's logits
// shrink to tau (Kimi K2 technical report, arXiv 2507.20534, section 2.1
// "MuonClip"; Megatron-LM's clip_qk in megatron/core/transformer/
// attention.py, whose grouped-query rule this follows):
//   per key-value group g (the query heads sharing key head g; one query
//   head per group without grouped-query attention):
//     S_g = max over the group's query heads of S_max(h)
//     gamma_g = min(1, tau / S_g)
//     W_q[rows of every query head of g] *= gamma_g ^ alpha
//     W_k[rows of key head g]             *= gamma_g ^ (1 - alpha)
// so q . k scales by gamma_g and the group's largest logit becomes tau.
// Multi-head latent attention (the report's MLA rule, QkClipLayer::
// q_rope_dim > 0): per head h, the head-specific parts q^C and k^C are
// scaled by gamma_h^alpha and gamma_h^(1 - alpha), the head's rotary query
// rows q^R by gamma_h, and the rotary key k^R shared by all heads (not
// listed) is left alone, so q^C.k^C + q^R.k^R scales by gamma_h.
// Row scaling is elementwise: a rank scales the rows of its own shard that
// belong to a clipped head, whatever the sharding (FSDP splits heads across
// ranks, TP holds whole heads), and the result is the same bits on every
// layout. The maxima come from the trainer's forward pass on each rank;
// QkClipMaxima reduces them (MAX over ranks).
#ifndef MUON_CLIENT_QK_CLIP_H_
#define MUON_CLIENT_QK_CLIP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/tensor_view.h"
#include "common/layout.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One attention layer: where its query and key projection rows are. Query
// head h is rows [q_row_begin + h * head_dim, + head_dim) of `q_param`,
// key head g rows [k_row_begin + g * head_dim, + head_dim) of `k_param`
// (the same parameter with other offsets for a fused QKV projection laid
// out q | k | v by rows). Query heads h with h / (num_heads / num_kv_heads)
// == g share key head g.
struct QkClipLayer {
  std::string q_param;
  int64_t q_row_begin = 0;
  std::string k_param;
  int64_t k_row_begin = 0;
  int num_heads = 0;     // query heads, >= 1
  int num_kv_heads = 0;  // key heads, >= 1, divides num_heads
  int64_t head_dim = 0;  // rows per query head, >= 1
  // Rows per key head (0 = head_dim); MLA: the head-specific k^C rows.
  int64_t k_head_dim = 0;
  // MLA: the last q_rope_dim rows of every query head are its rotary part
  // q^R (scaled by gamma, not gamma^alpha); 0 = none (then the key side is
  // num_kv_heads heads of k_head_dim rows). With q_rope_dim > 0 every query
  // head has its own key head (num_kv_heads == num_heads), and
  // q_rope_dim < head_dim.
  int64_t q_rope_dim = 0;

  int64_t key_rows_per_head() const {
    return k_head_dim > 0 ? k_head_dim : head_dim;
  }
};

struct QkClipOptions {
  double threshold = 100.0;         // tau, > 0 (the Kimi K2 report's 100)
  double alpha = 0.5;               // the query's share of the scale, in [0, 1]
  std::vector<QkClipLayer> layers;  // empty = QK-clip off

  bool enabled() const { return !layers.empty(); }
  // Sum of num_heads over the layers: the length of a maxima vector.
  int64_t total_heads() const;
};

// The job spec's message (unset threshold and alpha: the defaults;
// num_kv_heads 0: num_heads).
QkClipOptions QkClipOptionsFromProto(const v1::QkClip& proto);

// Checks the options on their own: threshold finite and > 0, alpha in
// [0, 1], every layer's names non-empty, heads >= 1 with num_kv_heads
// dividing num_heads, head_dim >= 1, row offsets >= 0.
// Errors: InvalidArgument naming the layer, the field and its value.
absl::Status ValidateQkClipOptions(const QkClipOptions& options);

// Checks `layer`'s rows against a parameter's global [rows, cols] shape
// (`which` is "q" or "k"). Errors: InvalidArgument naming the parameter,
// the rows the heads need and the rows it has.
absl::Status CheckQkClipRows(const QkClipLayer& layer, const char* which,
                             const std::vector<int64_t>& global_shape,
                             int layer_index);

// gamma_g for each of layer's num_kv_heads groups from its per-head maxima
// `max_logits` (num_heads values): min(1, threshold / max over the group),
// in double; 1 for a group whose maximum is <= threshold (or -inf).
std::vector<double> QkClipGroupScales(const QkClipLayer& layer,
                                      const float* max_logits,
                                      double threshold);

// Where global rows [begin, end) lie in a local shard that holds global
// rows `rows` of `cols` columns (row-major): `first`, the offset of their
// first element in the shard, and `count` elements from there (0 when the
// rows are not in the shard). Units: elements.
struct ElementSpan {
  int64_t first = 0;
  int64_t count = 0;
};
ElementSpan GlobalRowsSpan(const Range& rows, int64_t cols, int64_t begin,
                           int64_t end);

}  // namespace muon

#endif  // MUON_CLIENT_QK_CLIP_H_
