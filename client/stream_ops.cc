#include "client/stream_ops.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "plan/schedule.h"

namespace muon {
namespace {

// This rank's stream schedule in `plan`: its own list, or one derived into
// *derived from a compact plan (MakeRankSchedule), validated.
absl::StatusOr<const v1::RankSchedule*> RankScheduleOf(
    int rank, const v1::Plan& plan, v1::RankSchedule* derived) {
  const v1::Schedule& schedule = plan.schedule();
  // A compact plan (MakePlan's) carries no rank's list: derive this rank's
  // and check it. An explicit plan lists every rank, or (an older
  // coordinator's Join response) only the receiving one.
  const v1::RankSchedule* mine = nullptr;
  for (const v1::RankSchedule& rs : schedule.ranks()) {
    if (rs.rank() == rank) mine = &rs;
  }
  if (mine == nullptr && schedule.ranks_size() == 0) {
    if (schedule.derivation() != kScheduleDerivation) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": the plan's schedule derivation \"",
                       schedule.derivation(), "\" is not this binary's \"",
                       kScheduleDerivation, "\""));
    }
    *derived = MakeRankSchedule(plan, rank);
    mine = derived;
  }
  if (mine == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": the plan carries no stream schedule for this rank"));
  }
  MUON_RETURN_IF_ERROR(ValidateRankSchedule(*mine, schedule, plan));
  return mine;
}

// Files scheduled operation `op` (one ValidateRankSchedule accepted: its
// bucket, slot and kind are in range) under its stream and, for a gather,
// as its bucket's slot.
void AddScheduledOp(const v1::ScheduledOp& op, StreamOps* ops) {
  assert(op.bucket() >= 0 &&
         op.bucket() < static_cast<int>(ops->slot_of_bucket.size()));
  assert(op.slot() >= 0 && op.slot() < ops->slots);
  assert(op.op() == v1::OP_KIND_GATHER ||
         op.op() == v1::OP_KIND_ORTHOGONALIZE ||
         op.op() == v1::OP_KIND_REDISTRIBUTE || op.op() == v1::OP_KIND_APPLY);
  if (op.op() == v1::OP_KIND_GATHER) {
    ops->slot_of_bucket[op.bucket()] = op.slot();
  }
  const StreamOp o{op.bucket(), op.op(), op.slot()};
  if (op.stream() == v1::STREAM_KIND_COMPUTE) {
    ops->compute.push_back(o);
  } else if (op.stream() == v1::STREAM_KIND_COMM) {
    ops->comm.push_back(o);
  } else {
    ops->main.push_back(o);
  }
}

// Async: the executor enqueues each bucket's Newton-Schulz, in the compute
// order, once its gather is enqueued and at the latest just before the comm
// stream's redistribute of it waits, so that every event wait binds to the
// right record: the compute stream must orthogonalize the owned buckets in
// the order the comm stream redistributes them.
absl::Status CheckAsyncOrder(int rank, const StreamOps& ops,
                             const std::vector<LocalBucket>& buckets) {
  std::vector<int> redistributed, orthogonalized;
  for (const StreamOp& o : ops.comm) {
    if (o.kind == v1::OP_KIND_REDISTRIBUTE &&
        !buckets[o.bucket].owned.empty()) {
      redistributed.push_back(buckets[o.bucket].index);
    }
  }
  for (const StreamOp& o : ops.compute) {
    if (o.kind == v1::OP_KIND_ORTHOGONALIZE) {
      orthogonalized.push_back(buckets[o.bucket].index);
    }
  }
  if (redistributed == orthogonalized) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", rank,
      ": the schedule's compute stream orthogonalizes "
      "buckets [",
      absl::StrJoin(orthogonalized, ", "),
      "] but its comm stream redistributes the owned ones in the order [",
      absl::StrJoin(redistributed, ", "), "]"));
}

absl::Status CheckOrthogonalizeOps(int rank, const StreamOps& ops,
                                   const std::vector<LocalBucket>& buckets) {
  if (ops.async) MUON_RETURN_IF_ERROR(CheckAsyncOrder(rank, ops, buckets));
  for (size_t b = 0; b < buckets.size(); ++b) {
    const bool owns = !buckets[b].owned.empty();
    int scheduled = 0;
    for (const auto* list : {&ops.main, &ops.compute}) {
      for (const StreamOp& o : *list) {
        scheduled += o.bucket == static_cast<int>(b) &&
                     o.kind == v1::OP_KIND_ORTHOGONALIZE;
      }
    }
    if (scheduled != (owns ? 1 : 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": the schedule orthogonalizes bucket ",
          buckets[b].index, " ", scheduled, " times but this rank owns ",
          buckets[b].owned.size(), " of its matrices"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StreamOps> CompileStreamOps(
    int rank, const v1::Plan& plan, const std::vector<LocalBucket>& buckets) {
  const v1::Schedule& schedule = plan.schedule();
  v1::RankSchedule derived;
  MUON_ASSIGN_OR_RETURN(const v1::RankSchedule* mine,
                        RankScheduleOf(rank, plan, &derived));
  StreamOps ops;
  ops.async = schedule.mode() == v1::SCHEDULE_MODE_ASYNC;
  ops.prefetch_count = schedule.prefetch_count();
  ops.slots = std::max(1, schedule.slots());
  // ValidateRankSchedule checked every bucket against the plan, and the
  // layout's buckets are the plan's, position = index.
  assert(static_cast<int>(buckets.size()) == plan.buckets_size());
  ops.slot_of_bucket.assign(buckets.size(), 0);
  for (const v1::ScheduledOp& op : mine->ops()) AddScheduledOp(op, &ops);
  MUON_RETURN_IF_ERROR(CheckOrthogonalizeOps(rank, ops, buckets));
  return ops;
}

}  // namespace muon
