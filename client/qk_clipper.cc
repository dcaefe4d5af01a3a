#include "client/qk_clipper.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muon {

absl::StatusOr<QkClipper> QkClipper::Create(const QkClipOptions& options,
                                            const QkClipRank& rank,
                                            bool uses_sub_mesh) {
  if (absl::Status s = ValidateQkClipOptions(options); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank.rank, ": ", s.message()));
  }
  QkClipper c;
  c.options_ = options;
  c.rank_ = rank;
  const std::vector<ParamView>& params = *rank.params;
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].name == name) return static_cast<int>(i);
    }
    return -1;
  };
  for (size_t l = 0; l < options.layers.size(); ++l) {
    const QkClipLayer& layer = options.layers[l];
    const int q = find(layer.q_param);
    const int k = find(layer.k_param);
    if ((q < 0 || k < 0) && !(q < 0 && k < 0 && uses_sub_mesh)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank.rank, ": qk_clip layer ", l, " names parameter \"",
          q < 0 ? layer.q_param : layer.k_param,
          "\", which this optimizer does not have (a layer of another "
          "pipeline stage must have neither parameter here)"));
    }
    for (const auto& [index, which] :
         {std::pair<int, const char*>{q, "q"}, {k, "k"}}) {
      if (index < 0) continue;
      const ParamView& p = params[index];
      if (p.expert_stack) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank.rank, ": qk_clip layer ", l, ": parameter \"", p.name,
            "\" is an expert stack; QK-clip scales 2-D parameters"));
      }
      if (absl::Status s =
              CheckQkClipRows(layer, which, p.shape(), static_cast<int>(l));
          !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank.rank, ": ", s.message()));
      }
    }
    c.layer_params_.push_back({q, k});
  }
  return c;
}

absl::Status QkClipper::ReduceMaxima(const std::vector<float>& max_logits,
                                     std::vector<float>* reduced) const {
  const int rank = rank_.rank;
  const int64_t n = options_.total_heads();
  std::string mine;  // this rank's error, if any
  if (static_cast<int64_t>(max_logits.size()) != n) {
    mine = absl::StrCat("rank ", rank, ": ClipQk got ", max_logits.size(),
                        " maxima but the ", options_.layers.size(),
                        " qk_clip layers have ", n, " query heads");
  } else {
    for (int64_t h = 0; h < n && mine.empty(); ++h) {
      if (std::isnan(max_logits[h]) || max_logits[h] == INFINITY) {
        mine =
            absl::StrCat("rank ", rank, ": ClipQk maximum ", h,
                         " (a query head, layers in order) is ", max_logits[h],
                         " (NaN and +inf are refused: a +inf logit "
                         "would scale the head's rows to zero)");
      }
    }
  }
  const int64_t width = n + 1;  // [flag, maxima...]
  std::vector<float> send(width, -INFINITY);
  send[0] = mine.empty() ? 0.0f : 1.0f;
  if (mine.empty())
    std::copy(max_logits.begin(), max_logits.end(), send.begin() + 1);
  std::vector<float> all;
  MUON_RETURN_IF_ERROR(Gather(send.data(), width, &all));
  for (int r = 0; r < rank_.world_size; ++r) {
    if (all[r * width] == 0.0f) continue;
    if (r == rank) return absl::InvalidArgumentError(mine);
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": rank ", r, " passed bad QK-clip maxima (rank ", r,
        "'s error names them); nothing was clipped"));
  }
  reduced->assign(n, -INFINITY);
  for (int r = 0; r < rank_.world_size; ++r) {
    for (int64_t h = 0; h < n; ++h) {
      (*reduced)[h] = std::max((*reduced)[h], all[r * width + 1 + h]);
    }
  }
  return absl::OkStatus();
}

absl::Status QkClipper::ScaleLocalRows(kernels::StepKernels& kernels,
                                       device::Stream* stream, int index,
                                       int64_t begin, int64_t end,
                                       double factor) const {
  if (index < 0) return absl::OkStatus();
  const ParamView& p = (*rank_.params)[index];
  const ParamPlacement& pl = (*rank_.placements)[index];
  absl::StatusOr<std::vector<Range>> box =
      LocalRanges(p.shape(), pl.placements, *rank_.mesh,
                  rank_.mesh->Coord(rank_.rank), pl.sub_mesh);
  // Create checked the placements; an empty shard holds no rows.
  if (!box.ok() || p.local_numel() == 0) return absl::OkStatus();
  const ElementSpan span =
      GlobalRowsSpan((*box)[0], p.local_shape[1], begin, end);
  if (span.count == 0) return absl::OkStatus();
  const bool bf16 = p.dtype == DType::kBFloat16;
  return kernels.Scale(
      stream, static_cast<char*>(p.data) + span.first * DTypeSize(p.dtype),
      bf16 ? kernels::ParamDType::kBFloat16 : kernels::ParamDType::kFloat32,
      span.count, static_cast<float>(factor));
}

absl::Status QkClipper::Gather(const float* mine, int64_t width,
                               std::vector<float>* all) const {
  const int world_size = rank_.world_size;
  if (world_size == 1) {
    all->assign(mine, mine + width);
    return absl::OkStatus();
  }
  if (rank_.control == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_.rank,
                     ": ClipQk reduces over a host-memory control group "
                     "and this job has none (DistributedState::"
                     "control_communicator)"));
  }
  all->assign(width * world_size, 0.0f);
  return rank_.control->AllGatherV(mine, width, all->data(),
                                   std::vector<int64_t>(world_size, width));
}

absl::Status QkClipper::AgreeOnLayers() const {
  if (rank_.world_size == 1) return absl::OkStatus();
  const float mine[2] = {static_cast<float>(options_.layers.size()),
                         static_cast<float>(options_.total_heads())};
  std::vector<float> all;
  MUON_RETURN_IF_ERROR(Gather(mine, 2, &all));
  for (int r = 1; r < rank_.world_size; ++r) {
    if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_.rank, ": rank ", r, " has ", all[2 * r],
        " qk_clip layers of ", all[2 * r + 1], " query heads but rank 0 has ",
        all[0], " of ", all[1], "; every rank must clip the same layers"));
  }
  return absl::OkStatus();
}

absl::Status QkClipper::Clip(const std::vector<float>& max_logits,
                             kernels::StepKernels& kernels,
                             device::Stream* stream, QkClipStats* stats) const {
  const QkClipOptions& o = options_;
  // Every rank with the same layers first (a tiny all-gather), so that a
  // rank configured otherwise fails every rank instead of a collective.
  MUON_RETURN_IF_ERROR(AgreeOnLayers());
  if (!o.enabled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_.rank, ": ClipQk: MuonOptions::qk_clip has no layers"));
  }
  std::vector<float> reduced;
  MUON_RETURN_IF_ERROR(ReduceMaxima(max_logits, &reduced));
  QkClipStats out;
  int64_t offset = 0;
  for (size_t l = 0; l < o.layers.size(); ++l) {
    const QkClipLayer& layer = o.layers[l];
    const auto [q, k] = layer_params_[l];
    for (int h = 0; h < layer.num_heads; ++h) {
      out.max_logit = std::max(out.max_logit, reduced[offset + h]);
    }
    const std::vector<double> scales =
        QkClipGroupScales(layer, reduced.data() + offset, o.threshold);
    offset += layer.num_heads;
    const int64_t group_rows =
        layer.head_dim * (layer.num_heads / layer.num_kv_heads);
    const int64_t k_rows = layer.key_rows_per_head();
    for (int g = 0; g < layer.num_kv_heads; ++g) {
      if (scales[g] >= 1.0) continue;
      ++out.groups_clipped;
      const int64_t q_begin = layer.q_row_begin + g * group_rows;
      // MLA: the head's rotary rows (its last q_rope_dim) take all of
      // gamma; without MLA q_rope_dim is 0.
      const int64_t q_rope = q_begin + group_rows - layer.q_rope_dim;
      MUON_RETURN_IF_ERROR(ScaleLocalRows(kernels, stream, q, q_begin, q_rope,
                                          std::pow(scales[g], o.alpha)));
      MUON_RETURN_IF_ERROR(ScaleLocalRows(kernels, stream, q, q_rope,
                                          q_begin + group_rows, scales[g]));
      const int64_t k_begin = layer.k_row_begin + g * k_rows;
      MUON_RETURN_IF_ERROR(ScaleLocalRows(kernels, stream, k, k_begin,
                                          k_begin + k_rows,
                                          std::pow(scales[g], 1.0 - o.alpha)));
    }
  }
  if (stats != nullptr) *stats = out;
  return absl::OkStatus();
}

}  // namespace muon
