// The stream schedule of a plan: per rank, the order, stream and buffer slot of
// every operation of a step, and the prefetch depth. MakePlan (plan/planner.h)
// puts the compact form in the plan (the header: mode, prefetch depth, slots,
// derivation); every rank derives its own operation list from the plan with
// MakeRankSchedule and checks it with ValidateRankSchedule; ValidatePlan checks
// the header and the collective order through ValidateSchedule (so the plan
// holds O(matrices + ranks) values, not O(ranks x buckets)).
//
// Sequential (debug) mode: one stream "main", one slot; per bucket in plan
// order: gather, orthogonalize (owners; the executor runs owners in rank
// order), redistribute, apply.
// Async mode with prefetch p: stream "comm" issues the collectives
//   G0 .. Gp, then for b = 0, 1, ...: R(b), A(b), G(b+p+1) (when it exists);
// stream "compute" runs NS(b) for the buckets this rank owns matrices in,
// in bucket order. Bucket b uses slot b mod (p+1), so at most p+1 buckets'
// full matrices are in memory, and a slot is gathered into again only after
// the previous bucket in it was redistributed.
#ifndef MUON_PLAN_SCHEDULE_H_
#define MUON_PLAN_SCHEDULE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// The name of the derivation below (MakeRankSchedule). MakePlan writes it
// into Schedule.derivation, so it is covered by the plan hash; a rank whose
// binary derives schedules another way refuses the plan instead of
// deadlocking.
inline constexpr char kScheduleDerivation[] = "muon-schedule-v1";

// The compact schedule of `plan`: mode, prefetch depth, slots and
// derivation, no per-rank operation lists (Schedule.ranks is empty): every
// rank derives its own list with MakeRankSchedule, so the plan stays
// O(matrices + ranks). prefetch_count < 0 is taken as 0; it is capped at the
// number of buckets - 1 (0 with no buckets).
v1::Schedule MakeScheduleHeader(const v1::Plan& plan, bool async,
                                int prefetch_count);

// The operations of `rank` in a step, derived from plan.schedule()'s header
// (mode, prefetch_count, slots) and the plan's buckets and owners, as the
// file comment describes. O(buckets + matrices); rank may be any int (a
// rank owning nothing gets the collectives and applies only).
v1::RankSchedule MakeRankSchedule(const v1::Plan& plan, int rank);

// The header plus every rank's list: the explicit form, for display
// (`muonctl schedule`) and tests. O(world_size x buckets) operations.
v1::Schedule MakeSchedule(const v1::Plan& plan, bool async, int prefetch_count);

// Checks one rank's operation list against the header `schedule` and the
// plan. The header first, as ValidateSchedule checks it (mode, slots ==
// prefetch_count + 1 or 1, at most max(1, buckets) slots), before
// anything is sized by it; then: streams ("main" in sequential mode; "comm",
// and "compute" for orthogonalize, in async mode); buckets gathered in plan
// order; every bucket gathered, redistributed and applied exactly once,
// orthogonalized exactly once if the rank owns a matrix of it and never
// otherwise; within a stream a bucket's gather precedes its redistribute and
// apply; slots in [0, slots), a bucket's redistribute and apply in its gather's
// slot, a slot gathered into only after the bucket before it in that slot was
// applied (the slot holds its local O until then), at most
// prefetch_count + 1 buckets in flight.
// Stores the rank's collectives ((bucket, op) in issue order) in
// `collectives` when not null. O(ops + matrices).
// Errors: InvalidArgument naming the rank, bucket and operation.
absl::Status ValidateRankSchedule(
    const v1::RankSchedule& rank_schedule, const v1::Schedule& schedule,
    const v1::Plan& plan,
    std::vector<std::pair<int, v1::OpKind>>* collectives = nullptr);

// Checks a schedule against its plan. The header: mode "sequential" or
// "async", slots == prefetch_count + 1 (async) or 1, prefetch_count >= 0,
// slots <= max(1, buckets) (MakeScheduleHeader's cap).
// Compact form (no rank lists, as MakePlan makes it): derivation must be
// kScheduleDerivation, and the derived collective sequence, which does not
// depend on the rank (only orthogonalize does, from the owners ValidatePlan
// checks), is checked once with ValidateRankSchedule: same collectives in
// the same order on every rank and slot reuse, without materializing every
// rank's list (O(buckets + matrices)). Explicit form: one RankSchedule per
// rank in rank order, each checked with ValidateRankSchedule, and every
// rank's collectives equal to rank 0's (no deadlock).
// Errors: InvalidArgument naming the rank, bucket and operation.
absl::Status ValidateSchedule(const v1::Schedule& schedule,
                              const v1::Plan& plan);

}  // namespace muon

#endif  // MUON_PLAN_SCHEDULE_H_
