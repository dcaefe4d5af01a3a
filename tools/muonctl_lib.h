// muonctl: plan offline and inspect a live job. A thin main
// (tools/muonctl_main.cc) over this testable library with a command table
// (grpc_cli's pattern).
//
//   muonctl plan --spec FILE [--policy lpt|round_robin] [--json]
//   muonctl assignments --coordinator HOST:PORT [--json]
//   muonctl status --coordinator HOST:PORT [--json]
//                  [--watch [--interval_s S] [--count N]]
//   muonctl timings --coordinator HOST:PORT [--last_steps N] [--json]
//   muonctl trace --coordinator HOST:PORT --out FILE [--last_steps N]
//   muonctl schedule (--spec FILE [--policy P] | --coordinator HOST:PORT)
//                    [--json]
//   muonctl validate --spec FILE --steps K [--init DIR] [--grads DIR]
//                    [--dump DIR] [--coordinator HOST:PORT] [--tolerance X]
#ifndef MUON_TOOLS_MUONCTL_LIB_H_
#define MUON_TOOLS_MUONCTL_LIB_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/plan_job.h"

namespace muon {

// Live commands read the coordinator over gRPC (CoordinationClient):
//   status    per rank: state, heartbeat age, step, step time, straggler
//             flag, reports dropped by its agent; --watch refreshes it.
//   timings   per rank and operation (gather, orthogonalize, redistribute,
//             apply, and the whole step): count, p50 and p99 duration in ms
//             (nearest-rank) over the coordinator's kept step reports.
//   trace     the kept reports as Chrome trace event JSON: one process per
//             rank ("rank N"), one thread per stream (main, comm, compute),
//             one complete ("X") event per operation, ts/dur in us from the
//             earliest start, args {bucket, bytes, flops, step}.
//   schedule  per rank and stream the ordered operations, e.g.
//             "g0@s0 o0 r0 a0" (gather of bucket 0 into slot 0, ...).
//
// Runs one muonctl command; `args` are the arguments after the program
// name (the command and its flags, parsed here with CLI11). Returns the
// process exit code: 0 ok, 1 failure (printed to `err`; an exception a
// command throws is caught and reported so, none escapes), 2 usage (a
// flag missing, unknown or out of range, e.g. a numeric flag that is not
// a finite number).
int RunMuonctl(const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err);

// The plan `muonctl plan` and `muonctl schedule --spec` print: the spec's
// rank manifests (ManifestsFromSpec: execution options and the optimizer's
// ns_steps included) planned by PlanJob with job id spec.job_id, the entry
// point the coordinator uses, so a live job of the same spec (and a
// coordinator with default --policy and --bucket_size_bytes) reports the
// same loads and hash. A non-empty `policy` replaces the spec's
// execution.assignment_policy.
// Errors: InvalidArgument (the spec is invalid, as ValidateJobSpec; or as
//   PlanJob, e.g. an unknown policy); Internal (as PlanJob).
absl::StatusOr<JobPlan> PlanJobSpec(const v1::JobSpec& spec,
                                    const std::string& policy = "");

}  // namespace muon

#endif  // MUON_TOOLS_MUONCTL_LIB_H_
