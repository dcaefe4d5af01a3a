// What `muonctl plan` and `muonctl report` show beyond the plan itself:
// per-rank bytes per step (PlanTraffic) and the one-page HTML report
// (RenderReportHtml).
#ifndef MUON_TOOLS_REPORT_H_
#define MUON_TOOLS_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/plan_job.h"

namespace muon {

// Per rank, what one step moves and holds, in bytes: the step executor's
// exact all-to-all(v) split sizes and buffers (client/bucket_layout.h).
struct RankTraffic {
  int64_t sent = 0;      // gather + redistribute, to other ranks (fp32)
  int64_t received = 0;  // gather + redistribute, from other ranks (fp32)
  // The same with execution.exchange_dtype "bfloat16": two values per
  // 4-byte word, each peer's part rounded up to a word.
  int64_t sent_bf16 = 0;
  int64_t received_bf16 = 0;
  int64_t gathered = 0;  // received in the gather (as owner; fp32)
  // The preallocated buffers, as StepExecutor::Create sizes them: the
  // schedule's bucket slots (prefetch + 1 in async mode), each holding
  // this rank's O of the bucket's matrices (and, with
  // PlanMemoryOptions::form_update, its U), the full U and O of the
  // matrices it owns and does not hold whole (and, with the bf16
  // exchange, U of those it owns whole) and the row state of an owner
  // transform (NorMuon); plus the largest send and receive buffers (in
  // bf16 words with the bf16 exchange).
  int64_t peak_buffer = 0;
  // The momentum buffers of the rank's shards (PlanMemoryOptions' bytes
  // per element), and momentum + peak_buffer: what Muon::memory() counts
  // as its peak, less 8 bytes per parameter (the finite check), the row
  // state itself, the transactional snapshot and, on CUDA, the kernels'
  // scratch (OptimizerMemory::scratch_bytes).
  int64_t momentum = 0;
  int64_t peak = 0;
};

// What a rank's optimizer holds besides the exchange.
struct PlanMemoryOptions {
  // Each slot also holds this rank's U of the bucket's matrices (formed
  // there: Nesterov, or a bf16 momentum buffer; StepExecutor's
  // ExecutorOptions::form_update).
  bool form_update = true;
  // The owner transform keeps per-row state (NorMuon's second moment),
  // which travels with each matrix's exchanges and has room in the slots.
  bool row_state = false;
  // Bytes per element of each parameter's momentum buffer (index =
  // JobLayout::params; 2 for bf16, 4 for fp32); empty = 4 for all.
  std::vector<int> momentum_element_bytes;
};

// Largest world^2 x matrices PlanTraffic computes (2^28).
inline constexpr int64_t kMaxTrafficWork = int64_t{1} << 28;

// RankTraffic of every rank of `job` (index = rank), from each rank's
// BucketLayout under the job's exchange dtype and `memory`. O(world^2 x
// matrices) time: the exchange lists of every rank and bucket; empty when
// world^2 x matrices exceeds kMaxTrafficWork.
// Errors: InvalidArgument when the plan's matrices or world size are not
// its layout's (names both), or a rank's layout refuses the plan (a plan
// ValidatePlan would refuse: see BucketLayout::Compile).
absl::StatusOr<std::vector<RankTraffic>> PlanTraffic(
    const JobPlan& job, const PlanMemoryOptions& memory = {});

// FLOPs with the largest SI prefix that keeps the value >= 1, 3
// significant digits: "52.8 kFLOP", "9.81 GFLOP", "11 TFLOP".
std::string Flops(double value);

// Bytes in binary units: "512 B", "1.5 KiB", "3.2 MiB", "1.07 GiB".
std::string Bytes(double value);

// The inputs of the report page.
struct ReportInput {
  JobPlan plan;                      // the chosen policy's plan and layout
  v1::Plan round_robin;              // the same job planned round-robin
  double lower_bound_flops = 0;      // LoadLowerBoundFlops(plan.plan)
  std::vector<RankTraffic> traffic;  // PlanTraffic(plan), or empty
  // Step reports of a live job (GetReports), any order; may be empty.
  std::vector<v1::StepReport> reports;
  std::string source;  // what the report is of, e.g. the spec's path
};

// One self-contained HTML page (inline SVG and CSS, no script or network
// access, opens offline): per-rank Newton-Schulz load bars of the chosen
// policy next to round-robin with the lower bound, per-rank bytes sent and
// received per step, and, with reports, the step time over steps per rank
// and the last reported step's timeline per rank and stream (gather,
// orthogonalize, redistribute, apply, and the waits between them). The
// numbers are also embedded as JSON (<script type="application/json"
// id="muon-report-data">: plan hash, policy, per-rank FLOPs of both
// policies, bytes, step times) so tools and tests can read them. A
// round-robin load of a rank outside the plan's world is left out.
// Errors: InvalidArgument when the plan's world size is negative or above
//   kMaxWorldSize (common/checked_math.h), or a load of the plan names a
//   rank outside [0, world size) (names the plan hash, rank and world
//   size), as a plan read from a faulty coordinator may.
absl::StatusOr<std::string> RenderReportHtml(const ReportInput& input);

}  // namespace muon

#endif  // MUON_TOOLS_REPORT_H_
