// QkClipper: QK-clip (MuonClip; client/qk_clip.h has the rule and its
// sources) over one rank's shards of the attention layers' query and key
// projections, the optimizer's collaborator for it. It resolves the
// layers' parameters among the rank's own once, and on each Clip reduces
// the ranks' per-head logit maxima (MAX, over the host control group) and
// scales the rows of this rank's shards that belong to a clipped group.
#ifndef MUON_CLIENT_QK_CLIPPER_H_
#define MUON_CLIENT_QK_CLIPPER_H_

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/distributed_config.h"
#include "client/qk_clip.h"
#include "client/tensor_view.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "device/stream.h"
#include "kernels/step_kernels.h"

namespace muon {

// What one Clip did (the same on every rank).
struct QkClipStats {
  int64_t groups_clipped = 0;   // key-value groups scaled, over the layers
  float max_logit = -INFINITY;  // the largest reduced S_max of any head
};

// The rank a QkClipper works for: its index and the world's size, its
// parameters (views; the memory is not owned, and stays valid while the
// clipper is used), their placements over `mesh`, and the host control
// group (null in a world of one, or where the job has none; not owned).
struct QkClipRank {
  int rank = 0;
  int world_size = 1;
  const std::vector<ParamView>* params = nullptr;
  const std::vector<ParamPlacement>* placements = nullptr;
  const Mesh* mesh = nullptr;
  Communicator* control = nullptr;
};

class QkClipper {
 public:
  // A clipper with no layers (Clip refuses).
  QkClipper() = default;

  // Checks `options` (ValidateQkClipOptions) and finds every layer's q and
  // k parameters among `rank`'s by name; `uses_sub_mesh`: a layer may be on
  // another pipeline stage (neither parameter here). Errors (each naming
  // the rank): InvalidArgument for bad options, a layer naming a parameter
  // this rank lacks (one of the two only, or either without sub-meshes), a
  // parameter that is an expert stack, or rows the heads overrun
  // (CheckQkClipRows). Parameters may be on any device whose kernels Clip
  // is given.
  static absl::StatusOr<QkClipper> Create(const QkClipOptions& options,
                                          const QkClipRank& rank,
                                          bool uses_sub_mesh);

  const QkClipOptions& options() const { return options_; }

  // The host control group Clip gathers over (not owned; null: none), for
  // an optimizer that makes it after checking its options.
  void set_control(Communicator* control) { rank_.control = control; }

  // QK-clip after a step: `max_logits` holds this rank's largest
  // pre-softmax logit per query head from the step's forward pass, the
  // layers' heads one after another (options().total_heads() values;
  // -inf, or any value <= the threshold, for a head this rank did not
  // compute). Every rank's layer and head counts are checked against rank
  // 0's (an all-gather of 2 floats), the maxima reduced with MAX (an
  // all-gather of total_heads() + 1 floats per rank), then this rank's
  // shards of each clipped group's rows are scaled in place (fp32 or bf16)
  // by `kernels` (StepKernels::Scale, of the parameters' device) in
  // `stream`'s order (host: at once; the stream may be null). Collective
  // over the control group: every rank calls it.
  // Errors (every rank, before anything is scaled): FailedPrecondition
  // (no layers; a world of more than one rank without a control group);
  // InvalidArgument naming a rank whose layers differ from rank 0's, or
  // that passed the wrong number of values, a NaN or +inf (its own message
  // on that rank); the communicator's. Then the kernels' errors.
  absl::Status Clip(const std::vector<float>& max_logits,
                    kernels::StepKernels& kernels, device::Stream* stream,
                    QkClipStats* stats) const;

 private:
  // Every rank's [flag, maxima...]; the reduced maxima into *reduced.
  absl::Status ReduceMaxima(const std::vector<float>& max_logits,
                            std::vector<float>* reduced) const;
  // Every rank's layer and head counts, which must be rank 0's.
  absl::Status AgreeOnLayers() const;
  // Every rank's `width` floats from `mine`, rank after rank (a copy in a
  // world of one).
  absl::Status Gather(const float* mine, int64_t width,
                      std::vector<float>* all) const;
  // Multiplies the local elements of global rows [begin, end) of local
  // parameter `index` (-1: none here) by (float)factor with
  // kernels.Scale on `stream`.
  absl::Status ScaleLocalRows(kernels::StepKernels& kernels,
                              device::Stream* stream, int index, int64_t begin,
                              int64_t end, double factor) const;

  QkClipOptions options_;
  QkClipRank rank_;
  // Per layer: the local index of its q and k parameters (-1 when this
  // rank does not hold it).
  std::vector<std::pair<int, int>> layer_params_;
};

}  // namespace muon

#endif  // MUON_CLIENT_QK_CLIPPER_H_
