// The planner: which rank orthogonalizes which matrix, and in which bucket.
// Callers plan a job through PlanJob (plan/plan_job.h), which derives the
// PlannerOptions from the manifests and runs ValidatePlan; MakePlan is its
// building block.
//
// Input is a validated JobLayout (plan/manifest_validation.h); output is a
// v1::Plan that every rank executes identically:
//   - one MatrixPlan per logical matrix of the layout (index =
//     JobLayout::matrices index: parameters in union order, the slices of a
//     3-D expert stack ascending), naming its parameter (param, param_index)
//     and slice, owned by exactly one rank that holds a non-empty box of it.
//     A parameter with a sub-mesh (pp stage, ep owner) and an expert slice
//     are therefore owned inside the ranks holding them and never gathered
//     across pp or ep;
//   - ordered buckets grouping the matrices whose shards travel together;
//   - per-rank loads (Newton-Schulz FLOPs, matrix count), max/mean load;
//   - a stable hash every rank confirms before the first step.
//
// Cost model: Newton-Schulz FLOPs of an m x n matrix (m = min dim, n = max dim)
// with k iterations are k * (4*m*m*n + 2*m^3). Bytes are fp32 (4 bytes per
// element).
//
// Thread-safety: pure functions.
#ifndef MUON_PLAN_PLANNER_H_
#define MUON_PLAN_PLANNER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/manifest_validation.h"

namespace muon {

struct PlannerOptions {
  enum class Policy {
    // Longest-processing-time-first on NS FLOPs (Graham's LPT): matrices in
    // descending cost order, each to the eligible rank with the least load.
    kLongestProcessingTimeFirst,
    // Matrix i (JobLayout::matrices order) to eligible[i % eligible.size()],
    // eligible = the ranks holding a non-empty box of it, ascending.
    kRoundRobin,
  };
  // Owner assignment policy. Requested owners (assign_fn) override it.
  Policy policy = Policy::kLongestProcessingTimeFirst;
  // Upper bound on one bucket's fp32 bytes (full matrices); 0 = bucket k
  // holds the k-th matrix of every owner (one matrix per owner per bucket).
  int64_t bucket_size_bytes = 0;
  // Newton-Schulz iterations k in the cost model.
  int ns_steps = 5;
  // Copied into Plan.job_id (and so covered by the hash).
  std::string job_id;
  // Execution mode of the stream schedule (plan/schedule.h): async with
  // `prefetch_count` buckets gathered ahead, or sequential debug mode.
  bool async = false;
  int prefetch_count = 0;
  // Buckets from the last matrix to the first (ExecutionOptions.
  // overlap_backward: gradients become final in reverse forward order).
  bool reverse_buckets = false;
  // The cost model of a re-plan (ExecutionOptions.replan_every_steps): per
  // rank its measured Newton-Schulz seconds per FLOP (each > 0), so that a
  // rank's load is FLOPs x seconds per FLOP (uniform machines, Graham's
  // list scheduling: LPT picks the eligible rank whose predicted seconds
  // are least). Empty: every rank equally fast (loads in FLOPs).
  std::vector<double> rank_seconds_per_flop;
};

// "lpt" or "round_robin".
// Errors: InvalidArgument naming the text and the accepted names.
absl::StatusOr<PlannerOptions::Policy> ParsePolicy(absl::string_view name);

// "lpt" or "round_robin".
std::string PolicyName(PlannerOptions::Policy policy);

// Newton-Schulz FLOPs of a rows x cols matrix with `ns_steps` iterations:
// k * (4*m*m*n + 2*m^3), m = min(rows, cols), n = max(rows, cols).
double NewtonSchulzFlops(int64_t rows, int64_t cols, int ns_steps);

// Makes the plan for a validated layout and sets plan.hash.
//   Owners: the matrix's requested owner if given; otherwise by the policy
//     among the ranks holding a non-empty box of that matrix. LPT sorts by NS
//     cost descending, ties by the fewest bytes any eligible owner must gather
//     (descending), then by index; each matrix goes to the eligible rank with
//     the least load so far (ties: lowest rank).
//   gather_bytes: 4 * elements of the matrix the owner does not hold (each
//     element counted once, however many replicas hold it).
//   Buckets: see PlannerOptions::bucket_size_bytes; with a limit, matrices
//     are packed greedily in index order (descending with reverse_buckets)
//     and a matrix larger than the limit gets its own bucket. Matrices
//     within a bucket are in index order.
// Errors:
//   InvalidArgument: ns_steps < 1, bucket_size_bytes < 0, or a matrix no
//     rank holds any element of (names the matrix, e.g. "w1[3]").
absl::StatusOr<v1::Plan> MakePlan(const JobLayout& layout,
                                  const PlannerOptions& options);

// A lower bound on any assignment's max load (NS FLOPs) for the plan's
// matrices over its world size, ignoring which ranks may own what (so it
// holds with sub-mesh and expert constraints too): the largest of
//   - the mean load, total / world_size;
//   - the largest matrix;
//   - p[W-1] + p[W], the W-th and (W+1)-th largest matrices when there are
//     more matrices than ranks W (two of the W+1 largest share a rank).
// The standard bounds for identical-machine makespan (Graham 1969; e.g.
// Pinedo, "Scheduling", section 5.1). 0 for a plan without matrices.
double LoadLowerBoundFlops(const v1::Plan& plan);

// The plan as rank `rank` receives it from a coordinator (JoinResponse.plan):
// every matrix and bucket, the schedule header (and, for a plan with an
// explicit schedule, only that rank's list), no loads; the hash stays the
// whole plan's. O(matrices) instead of O(ranks) per rank.
v1::Plan PlanForRank(const v1::Plan& plan, int rank);

// FNV-1a 64 (Fowler, Noll, Vo) over the deterministic protobuf
// serialization of `message`, as 16 lowercase hex digits. Equal messages
// hash equally in every process and build (unlike absl::Hash).
std::string StableMessageHash(const google::protobuf::Message& message);

// Stable hash of a plan: StableMessageHash of the plan with `hash` cleared.
std::string PlanHash(const v1::Plan& plan);

// Checks a plan against the layout: world size; one MatrixPlan per layout
// matrix (index, param, param_index, slice, shape match); every owner in
// range and holding a non-empty box of its matrix; gather_bytes; bucket indices
// valid and every matrix in exactly one bucket, whose index its `bucket` field
// names; bucket bytes; loads consistent with the owners; the hash, when set,
// equal to PlanHash. Errors:
//   InvalidArgument: the first problem, naming the matrix ("w" or "w[e]"),
//     rank (and its mesh coordinate) or bucket.
absl::Status ValidatePlan(const v1::Plan& plan, const JobLayout& layout);

// Turns a user assign_fn's result (rank -> indices of the items it owns)
// into one owner per item (index = item index), for
// RankManifest.requested_owners. The items are the matrices of the rank's
// manifest (parameters in order, one per expert slice of a 3-D stack);
// `param_names` names them in messages (a 2-D job: the parameter names).
// Errors (InvalidArgument):
//   - a parameter assigned to no rank:
//     `parameter "w2" (index 2) is assigned to no rank`;
//   - assigned twice: `parameter "w0" (index 0) is assigned to ranks 0 and 3`;
//   - a rank outside [0, world_size):
//     `assign_fn returned rank 7 for parameter "w1" (index 1) but world size
//     is 4`;
//   - an index outside [0, num_params).
absl::StatusOr<std::vector<int>> OwnersFromAssignment(
    const std::map<int, std::vector<int>>& rank_to_params, int num_params,
    int world_size, const std::vector<std::string>& param_names);

}  // namespace muon

#endif  // MUON_PLAN_PLANNER_H_
