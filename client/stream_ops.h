// This rank's operations of one Muon step, per stream, compiled once from
// the plan's stream schedule (plan/schedule.h) over the rank's buckets
// (client/bucket_layout.h): the lists the step executor
// (client/step_executor.h) enqueues, in order, on its "main" stream
// (sequential mode) or its "comm" and "compute" streams (async mode, as
// torchtitan and c10d put collectives and compute on streams of their own),
// and the bucket slot each bucket is gathered into.
#ifndef MUON_CLIENT_STREAM_OPS_H_
#define MUON_CLIENT_STREAM_OPS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "client/bucket_layout.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// One scheduled operation of a bucket.
struct StreamOp {
  int bucket = 0;  // position in the layout's buckets()
  v1::OpKind kind = v1::OP_KIND_UNSPECIFIED;
  int slot = 0;  // the bucket slot it works in
};

// This rank's compiled schedule (CompileStreamOps).
struct StreamOps {
  // The schedule's mode (async: comm and compute streams), its prefetch
  // count (buckets gathered ahead) and its bucket slots (at least 1).
  bool async = false;
  int prefetch_count = 0;
  int slots = 1;
  // The operations of each stream in enqueue order: "main" (sequential)
  // or "comm" and "compute" (async).
  std::vector<StreamOp> main;
  std::vector<StreamOp> comm;
  std::vector<StreamOp> compute;
  // Per bucket (position in buckets): the slot its gather fills.
  std::vector<int> slot_of_bucket;
};

// This rank's StreamOps: from its own list in plan.schedule(), or from one
// derived with MakeRankSchedule when the plan is compact (no rank's list).
// `buckets` are the layout's (BucketLayout::Compile), compiled from the
// same plan: one per plan bucket, in its order.
// Errors: InvalidArgument, naming the rank: another derivation than this
// binary's, no list for this rank, a list ValidateRankSchedule refuses (an
// operation on a bucket or slot outside the plan, an unknown operation,
// ...), a bucket orthogonalized other than once when this rank owns a matrix of
// it (or at all when it owns none), or (async) a compute stream that
// orthogonalizes the owned buckets in another order than the comm stream
// redistributes them.
absl::StatusOr<StreamOps> CompileStreamOps(
    int rank, const v1::Plan& plan, const std::vector<LocalBucket>& buckets);

}  // namespace muon

#endif  // MUON_CLIENT_STREAM_OPS_H_
