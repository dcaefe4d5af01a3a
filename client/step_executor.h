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

// Geometry of one parameter on this rank.
struct ParamGeometry {
  int64_t rows = 0;  // global shape
  int64_t cols = 0;
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
  // `plan` must already be validated against `geometry` (one matrix per
  // parameter, owners hold a shard). `comm` may be nullptr only when
  // world_size == 1. gather_fn / redistribute_fn may be empty (packed
  // all-to-all(v)). Errors: InvalidArgument when the plan does not match the
  // geometry (names the matrix and parameter).
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(
      int rank, int world_size, const v1::Plan& plan,
      std::vector<ParamGeometry> geometry, Communicator* comm,
      GatherFn gather_fn, RedistributeFn redistribute_fn);

  // Runs gather -> orthogonalize -> redistribute -> apply for every bucket.
  // `updates[i]` is this rank's shard of U for parameter i (local shape,
  // row-major fp32, read only); `params[i]` is its local shard of W,
  // updated in place: W *= (1 - lr*wd); W -= AdjustLR(lr, global shape) * O.
  // Errors: whatever the communicator or a custom function returns; on an
  // error some parameters may already be updated (a failed collective
  // leaves the world inconsistent; the job must restart from a checkpoint).
  absl::Status Run(const std::vector<const float*>& updates,
                   const std::vector<float*>& params, const UpdateRule& rule,
                   StepStats* stats);

 private:
  // A region (global coordinates) of parameter `param`.
  struct RegionCopy {
    int param;
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
    std::vector<int> params;  // parameter index of each matrix, plan order
    std::vector<int> owners;  // owner of each matrix
    std::vector<int> owned;   // parameters this rank orthogonalizes
    Exchange gather;          // shards of U -> owners' full U
    Exchange redistribute;    // owners' full O -> holders' shards
  };

  StepExecutor(int rank, int world_size, Communicator* comm,
               std::vector<ParamGeometry> geometry, GatherFn gather_fn,
               RedistributeFn redistribute_fn);
  bool HoldsFull(int param) const;
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
  std::vector<ParamGeometry> geometry_;
  GatherFn gather_fn_;
  RedistributeFn redistribute_fn_;
  std::vector<BucketSchedule> buckets_;
  // Full [rows, cols] U and O of each owned parameter (empty otherwise, or
  // when this rank holds the whole matrix and reads its own shard).
  std::vector<std::vector<float>> full_u_;
  std::vector<std::vector<float>> full_o_;
  // This rank's shard of O per parameter (local shape).
  std::vector<std::vector<float>> local_o_;
  std::vector<float> send_buf_;
  std::vector<float> recv_buf_;
  kernels::NewtonSchulzWorkspace ns_workspace_;
};

}  // namespace muon

#endif  // MUON_CLIENT_STEP_EXECUTOR_H_
