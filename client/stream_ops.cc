#include "client/stream_ops.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/wire_names.h"
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

// Files scheduled operation `op` of bucket position `bucket` under its
// stream (and, for a gather, the bucket's slot).
absl::Status AddScheduledOp(int rank, const v1::ScheduledOp& op, int bucket,
                            StreamOps* ops) {
  switch (op.op()) {
    case v1::OP_KIND_GATHER:
      ops->slot_of_bucket[bucket] = op.slot();
      break;
    case v1::OP_KIND_ORTHOGONALIZE:
    case v1::OP_KIND_REDISTRIBUTE:
    case v1::OP_KIND_APPLY:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": unknown scheduled operation \"",
                       WireName(op.op()), "\""));
  }
  const StreamOp o{bucket, op.op(), op.slot()};
  if (op.stream() == v1::STREAM_KIND_COMPUTE) {
    ops->compute.push_back(o);
  } else if (op.stream() == v1::STREAM_KIND_COMM) {
    ops->comm.push_back(o);
  } else {
    ops->main.push_back(o);
  }
  return absl::OkStatus();
}

// Async: the executor enqueues each bucket's Newton-Schulz just before the
// comm stream's redistribute of it waits, so that every event wait binds to
// the right record: the compute stream must orthogonalize the owned buckets
// in the order the comm stream redistributes them.
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
  std::map<int, int> position;
  for (size_t i = 0; i < buckets.size(); ++i) {
    position[buckets[i].index] = static_cast<int>(i);
  }
  ops.slot_of_bucket.assign(buckets.size(), 0);
  for (const v1::ScheduledOp& op : mine->ops()) {
    auto it = position.find(op.bucket());
    if (it == position.end() || op.slot() < 0 || op.slot() >= ops.slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": schedule names bucket ", op.bucket(),
                       " slot ", op.slot(), " outside the plan"));
    }
    MUON_RETURN_IF_ERROR(AddScheduledOp(rank, op, it->second, &ops));
  }
  MUON_RETURN_IF_ERROR(CheckOrthogonalizeOps(rank, ops, buckets));
  return ops;
}

}  // namespace muon
