// Executes the distributed part of one Muon step for one rank: per bucket,
// gather shards of the update U to their owners, orthogonalize on the owner
// (Newton-Schulz), redistribute O back to every holder, apply.
//
// Built once from the plan (v1::Plan: owners and buckets) and the layout
// (mesh + placements + global shapes). Construction precomputes, per bucket,
// the exact all-to-all(v) split sizes and the region copies of both
// exchanges, and preallocates every buffer, so a step allocates nothing.
// The same executor serves a world of one (single device: every copy is
// local and no collective runs) and any world size.
//
// Every rank walks the buckets in plan order and issues exactly one
// AllToAllV per bucket each way (or, with custom gather_fn/redistribute_fn,
// one call per matrix in plan order), so ranks never issue different
// collective sequences.
//
// Thread-compatible: one thread calls Run at a time.
#ifndef MUON_CLIENT_STEP_EXECUTOR_H_
#define MUON_CLIENT_STEP_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/communicator.h"
#include "client/distributed_config.h"
#include "common/layout.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One matrix this rank knows (a 2-D parameter, or one expert slice of a
// 3-D stack), as seen from this rank.
struct MatrixGeometry {
  std::string param;  // parameter name (plan's MatrixPlan.param)
  int param_index = 0;  // index in the optimizer's parameter list
  int slice = 0;        // expert index (0 for 2-D)
  int64_t rows = 0;     // global [rows, cols] of the matrix
  int64_t cols = 0;
  // Offset, in elements, of this rank's part of the matrix inside the
  // parameter's local data (non-zero for later expert slices).
  int64_t offset = 0;
  std::vector<Box> boxes;  // box held by each rank (index = rank)
};

// Per-step counters of one rank (summed over the world they equal the
// single-device figures: zero redundancy).
struct StepStats {
  int matrices_orthogonalized = 0;
  double ns_flops = 0;       // Newton-Schulz FLOPs (DESIGN section 10)
  int64_t bytes_sent = 0;    // fp32 payload sent to other ranks
  int64_t bytes_received = 0;
  double step_time_s = 0;
  std::vector<v1::OpTiming> ops;  // per bucket and operation
  // Preallocated buffers of the step executor (bucket slots of full
  // matrices and the exchange buffers), in bytes, and their bound:
  // (prefetch_count + 1) slots of the largest bucket plus the exchange
  // buffers.
  int64_t buffer_bytes = 0;
  int64_t buffer_bound_bytes = 0;
};

// Scalars of the update rule (torch.optim.Muon's hyper-parameters).
struct UpdateRule {
  double lr = 1e-3;
  double weight_decay = 0.1;
  kernels::AdjustLrFn adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  kernels::NewtonSchulzOptions ns;
};

class StepExecutor {
 public:
  // `matrices` are the matrices of this rank's parameters; the plan may
  // hold more (other pipeline stages), which this rank skips with zero
  // split sizes while still joining every bucket's collectives. `comm` may
  // be nullptr only when world_size == 1. gather_fn / redistribute_fn may be
  // empty (packed all-to-all(v)).
  // Errors: InvalidArgument when the plan does not cover every local matrix
  // exactly once, disagrees on a shape, or names an owner that holds no
  // shard (names the matrix and parameter).
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(
      int rank, int world_size, const v1::Plan& plan,
      std::vector<MatrixGeometry> matrices, Communicator* comm,
      GatherFn gather_fn, RedistributeFn redistribute_fn);

  // Runs gather -> orthogonalize -> redistribute -> apply for every bucket.
  // `updates[i]` is this rank's shard of U for parameter i (local shape,
  // row-major fp32, read only); `params[i]` is its local shard of W
  // (3-D stacks: [local experts, rows, cols]),
  // updated in place: W *= (1 - lr*wd); W -= AdjustLR(lr, global shape) * O.
  // Errors: whatever the communicator or a custom function returns; on an
  // error some parameters may already be updated (a failed collective
  // leaves the world inconsistent; the job must restart from a checkpoint).
  absl::Status Run(const std::vector<const float*>& updates,
                   const std::vector<float*>& params, const UpdateRule& rule,
                   StepStats* stats);

 private:
  // A region (global coordinates) of local matrix `matrix`.
  struct RegionCopy {
    int matrix;
    Box region;
  };
  struct Exchange {
    std::vector<int64_t> send_counts;  // per peer, elements
    std::vector<int64_t> recv_counts;
    std::vector<std::vector<RegionCopy>> send;  // per peer, packing order
    std::vector<std::vector<RegionCopy>> recv;  // per peer, unpacking order
    std::vector<RegionCopy> self;               // local copies
    int64_t send_total = 0;
    int64_t recv_total = 0;
  };
  struct BucketSchedule {
    int index = 0;
    std::vector<int> matrices;  // local matrix ids in plan order (known ones)
    std::vector<int> owners;    // owner of each
    std::vector<int> owned;     // local matrices this rank orthogonalizes
    Exchange gather;          // shards of U -> owners' full U
    Exchange redistribute;    // owners' full O -> holders' shards
  };

  StepExecutor(int rank, int world_size, Communicator* comm,
               std::vector<MatrixGeometry> matrices, GatherFn gather_fn,
               RedistributeFn redistribute_fn);
  bool HoldsFull(int m) const;
  absl::Status RunExchange(const Exchange& ex, bool to_owner,
                           const std::vector<const float*>& updates,
                           StepStats* stats);
  absl::Status RunBucket(const BucketSchedule& b,
                         const std::vector<const float*>& updates,
                         const std::vector<float*>& params,
                         const UpdateRule& rule, StepStats* stats);

  const int rank_;
  const int world_size_;
  Communicator* comm_;  // Not owned.
  std::vector<MatrixGeometry> geometry_;  // local matrices
  GatherFn gather_fn_;
  RedistributeFn redistribute_fn_;
  std::vector<BucketSchedule> buckets_;
  // Full [rows, cols] U and O of each owned matrix (empty otherwise, or
  // when this rank holds the whole matrix and reads its own shard).
  std::vector<std::vector<float>> full_u_;
  std::vector<std::vector<float>> full_o_;
  // This rank's box of O per local matrix.
  std::vector<std::vector<float>> local_o_;
  std::vector<float> send_buf_;
  std::vector<float> recv_buf_;
  kernels::NewtonSchulzWorkspace ns_workspace_;
};

}  // namespace muon

#endif  // MUON_CLIENT_STEP_EXECUTOR_H_
