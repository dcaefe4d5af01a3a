// The stream schedule of a plan (DESIGN section 4): per rank, the order,
// stream and buffer slot of every operation of a step, and the prefetch
// depth. MakePlan (plan/planner.h) makes it, ValidatePlan checks it through
// ValidateSchedule; every rank's step executor follows it.
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

#include "absl/status/status.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Builds the schedule of `plan` (its buckets, owners and world size) for
// sequential (async = false) or async mode. prefetch_count < 0 is taken as
// 0; it is capped at the number of buckets - 1.
v1::Schedule MakeSchedule(const v1::Plan& plan, bool async, int prefetch_count);

// Checks a schedule against its plan:
//   one RankSchedule per rank, in rank order;
//   streams: "main" in sequential mode, "comm"/"compute" in async mode, and
//     orthogonalize on "compute" (async), collectives and apply elsewhere;
//   every rank issues the same collectives (gather, redistribute) in the
//     same order, and gathers the buckets in plan order (no deadlock);
//   every bucket is gathered, redistributed and applied exactly once on
//     every rank, and orthogonalized exactly once on each rank owning a
//     matrix of it (never on others);
//   within a stream, a bucket's gather precedes its redistribute and apply;
//   slots are in [0, slots), slots == prefetch_count + 1 (async) or 1;
//     a slot is gathered into only after the bucket that used it before was
//     redistributed; at most prefetch_count + 1 buckets are in flight.
// Errors: InvalidArgument naming the rank, bucket and operation.
absl::Status ValidateSchedule(const v1::Schedule& schedule,
                              const v1::Plan& plan);

}  // namespace muon

#endif  // MUON_PLAN_SCHEDULE_H_
