#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "plan/schedule.h"

namespace muon {
namespace {

constexpr int64_t kBytesPerElement = 4;  // fp32

std::string Quoted(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// Ranks holding a non-empty box of `matrix`, ascending.
std::vector<int> EligibleRanks(const MatrixLayout& matrix) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(matrix.boxes.size()); ++r) {
    if (!matrix.boxes[r].empty()) out.push_back(r);
  }
  return out;
}

// Loads are sums of FLOP counts taken in different orders; compare them
// with a relative tolerance.
bool NearlyEqual(double a, double b) {
  return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)});
}

int64_t GatherBytes(const MatrixLayout& matrix, int owner) {
  return kBytesPerElement *
         (matrix.rows * matrix.cols - matrix.boxes[owner].numel());
}

int64_t MatrixBytes(const MatrixLayout& matrix) {
  return kBytesPerElement * matrix.rows * matrix.cols;
}

// Matrices grouped by their (shared) box list: what only depends on the
// boxes is computed once per group, not once per matrix.
struct BoxGroups {
  std::vector<int> group_of;               // per matrix
  std::vector<std::vector<int>> eligible;  // per group: holders, ascending
  std::vector<int64_t> min_gather;         // per group: fewest bytes moved
};

BoxGroups GroupByBoxes(const std::vector<MatrixLayout>& matrices) {
  BoxGroups g;
  std::map<const void*, int> index;
  g.group_of.reserve(matrices.size());
  for (const MatrixLayout& m : matrices) {
    auto [it, added] =
        index.emplace(m.boxes.id(), static_cast<int>(g.eligible.size()));
    if (added) {
      g.eligible.push_back(EligibleRanks(m));
      int64_t best = MatrixBytes(m);
      for (int r : g.eligible.back()) best = std::min(best, GatherBytes(m, r));
      g.min_gather.push_back(best);
    }
    g.group_of.push_back(it->second);
  }
  return g;
}

// The eligible rank of a group with the least load (ties: lowest rank), as
// a linear scan would pick it, in O(log ranks) amortized: a min-heap of
// (load when pushed, rank) per group; loads only grow, so an entry whose
// load is out of date is re-pushed with the current one when it surfaces.
class LeastLoaded {
 public:
  LeastLoaded(const std::vector<std::vector<int>>& eligible,
              const std::vector<double>* load)
      : load_(load), heaps_(eligible.size()) {
    for (size_t g = 0; g < eligible.size(); ++g) {
      for (int r : eligible[g]) heaps_[g].push({(*load)[r], r});
    }
  }
  int Pick(int group) {
    auto& heap = heaps_[group];
    while (heap.top().first != (*load_)[heap.top().second]) {
      const int r = heap.top().second;
      heap.pop();
      heap.push({(*load_)[r], r});
    }
    return heap.top().second;
  }

 private:
  using Entry = std::pair<double, int>;
  const std::vector<double>* load_;
  std::vector<
      std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>>
      heaps_;
};

}  // namespace

absl::StatusOr<PlannerOptions::Policy> ParsePolicy(absl::string_view name) {
  if (name == "lpt") return PlannerOptions::Policy::kLongestProcessingTimeFirst;
  if (name == "round_robin") return PlannerOptions::Policy::kRoundRobin;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown assignment policy \"", name,
                   "\"; expected \"lpt\" or \"round_robin\""));
}

std::string PolicyName(PlannerOptions::Policy policy) {
  switch (policy) {
    case PlannerOptions::Policy::kLongestProcessingTimeFirst:
      return "lpt";
    case PlannerOptions::Policy::kRoundRobin:
      return "round_robin";
  }
  return "unknown";
}

double NewtonSchulzFlops(int64_t rows, int64_t cols, int ns_steps) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return ns_steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

double LoadLowerBoundFlops(const v1::Plan& plan) {
  std::vector<double> costs;
  costs.reserve(plan.matrices_size());
  double total = 0;
  for (const v1::MatrixPlan& m : plan.matrices()) {
    costs.push_back(m.ns_flops());
    total += m.ns_flops();
  }
  if (costs.empty() || plan.world_size() < 1) return 0;
  const size_t world = static_cast<size_t>(plan.world_size());
  double bound = total / static_cast<double>(world);
  if (costs.size() > world) {
    std::nth_element(costs.begin(), costs.begin() + world, costs.end(),
                     std::greater<double>());
    // costs[world] is the (W+1)-th largest; the W-th largest is the
    // smallest of the first W.
    const double w_th = *std::min_element(costs.begin(), costs.begin() + world);
    bound = std::max(bound, w_th + costs[world]);
  }
  return std::max(bound, *std::max_element(costs.begin(), costs.end()));
}

namespace {

// Checks the options MakePlan reads beyond the layout.
absl::Status CheckPlannerOptions(const JobLayout& layout,
                                 const PlannerOptions& options) {
  if (options.ns_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ns_steps is ", options.ns_steps, "; must be >= 1"));
  }
  if (!options.rank_seconds_per_flop.empty()) {
    if (static_cast<int>(options.rank_seconds_per_flop.size()) !=
        layout.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank_seconds_per_flop has ", options.rank_seconds_per_flop.size(),
          " entries; the world size is ", layout.world_size));
    }
    for (size_t r = 0; r < options.rank_seconds_per_flop.size(); ++r) {
      const double s = options.rank_seconds_per_flop[r];
      if (!(s > 0) || !std::isfinite(s)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank_seconds_per_flop[", r, "] is ", s, "; must be > 0"));
      }
    }
  }
  if (options.bucket_size_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket_size_bytes is ", options.bucket_size_bytes, "; must be >= 0"));
  }
  return absl::OkStatus();
}

// One MatrixPlan per matrix (no owner yet) and its Newton-Schulz FLOPs,
// after checking that every matrix has a box per rank, a parameter and a
// holder.
absl::StatusOr<std::vector<double>> AddMatrices(const JobLayout& layout,
                                                const BoxGroups& groups,
                                                int ns_steps, v1::Plan* plan) {
  const std::vector<MatrixLayout>& matrices = layout.matrices;
  std::vector<double> cost(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const MatrixLayout& matrix = matrices[i];
    if (static_cast<int>(matrix.boxes.size()) != layout.world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "matrix ", Quoted(matrix.name), " has ", matrix.boxes.size(),
          " boxes but the world size is ", layout.world_size));
    }
    if (matrix.param_index < 0 ||
        matrix.param_index >= static_cast<int>(layout.params.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("matrix ", Quoted(matrix.name), " names parameter ",
                       matrix.param_index, " but the job has ",
                       layout.params.size(), " parameters"));
    }
    if (groups.eligible[groups.group_of[i]].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("matrix ", Quoted(matrix.name), " [", matrix.rows, ", ",
                       matrix.cols, "] is held by no rank"));
    }
    cost[i] = NewtonSchulzFlops(matrix.rows, matrix.cols, ns_steps);
    v1::MatrixPlan* m = plan->add_matrices();
    m->set_index(static_cast<int>(i));
    m->set_param(layout.params[matrix.param_index].name);
    m->set_param_index(matrix.param_index);
    m->set_slice(matrix.slice);
    m->set_rows(matrix.rows);
    m->set_cols(matrix.cols);
    m->set_ns_flops(cost[i]);
    m->set_owner(-1);
  }
  return cost;
}

// Sets every matrix's owner (requested owners first, then the policy:
// round-robin over its eligible ranks, or longest-processing-time-first on
// predicted seconds, Graham 1969) and returns the FLOPs per rank.
std::vector<double> AssignOwners(const JobLayout& layout,
                                 const BoxGroups& groups,
                                 const std::vector<double>& cost,
                                 const PlannerOptions& options,
                                 v1::Plan* plan) {
  const std::vector<MatrixLayout>& matrices = layout.matrices;
  const int num = static_cast<int>(matrices.size());
  std::vector<double> load(layout.world_size, 0.0);
  // Predicted seconds per rank (the LPT key): FLOPs x seconds per FLOP, or
  // FLOPs when every rank is equally fast.
  const std::vector<double>& speed = options.rank_seconds_per_flop;
  std::vector<double> seconds(layout.world_size, 0.0);
  auto assign = [&](int i, int owner) {
    v1::MatrixPlan* m = plan->mutable_matrices(i);
    m->set_owner(owner);
    m->set_gather_bytes(GatherBytes(matrices[i], owner));
    load[owner] += cost[i];
    seconds[owner] = speed.empty() ? load[owner] : load[owner] * speed[owner];
  };
  for (int i = 0; i < num; ++i) {
    if (matrices[i].requested_owner >= 0) {
      assign(i, matrices[i].requested_owner);
    }
  }
  if (options.policy == PlannerOptions::Policy::kRoundRobin) {
    for (int i = 0; i < num; ++i) {
      if (matrices[i].requested_owner >= 0) continue;
      const std::vector<int>& eligible = groups.eligible[groups.group_of[i]];
      assign(i, eligible[i % eligible.size()]);
    }
    return load;
  }
  std::vector<int> order;
  for (int i = 0; i < num; ++i) {
    if (matrices[i].requested_owner < 0) order.push_back(i);
  }
  auto min_gather = [&](int i) {
    return groups.min_gather[groups.group_of[i]];
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (cost[a] != cost[b]) return cost[a] > cost[b];
    if (min_gather(a) != min_gather(b)) return min_gather(a) > min_gather(b);
    return a < b;
  });
  LeastLoaded least(groups.eligible, &seconds);
  for (int i : order) assign(i, least.Pick(groups.group_of[i]));
  return load;
}

// The buckets: with no byte bound, bucket k holds each owner's k-th
// matrix; else consecutive matrices up to bucket_size_bytes fp32 bytes.
void AddBuckets(const JobLayout& layout, int64_t bucket_size_bytes,
                bool reverse, v1::Plan* plan) {
  const std::vector<MatrixLayout>& matrices = layout.matrices;
  const int num = static_cast<int>(matrices.size());
  // The matrices in the order buckets take them.
  std::vector<int> order(num);
  for (int i = 0; i < num; ++i) order[i] = reverse ? num - 1 - i : i;
  std::vector<std::vector<int>> buckets;
  if (bucket_size_bytes == 0) {
    std::vector<int> seen(layout.world_size, 0);  // matrices per owner
    for (int i : order) {
      const int k = seen[plan->matrices(i).owner()]++;
      if (k >= static_cast<int>(buckets.size())) buckets.resize(k + 1);
      buckets[k].push_back(i);
    }
  } else {
    int64_t bytes = 0;
    for (int i : order) {
      const int64_t b = MatrixBytes(matrices[i]);
      if (buckets.empty() ||
          (!buckets.back().empty() && bytes + b > bucket_size_bytes)) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().push_back(i);
      bytes += b;
    }
  }
  for (std::vector<int>& b : buckets) std::sort(b.begin(), b.end());
  for (int k = 0; k < static_cast<int>(buckets.size()); ++k) {
    v1::Bucket* bucket = plan->add_buckets();
    bucket->set_index(k);
    int64_t bytes = 0;
    for (int i : buckets[k]) {
      bucket->add_matrices(i);
      plan->mutable_matrices(i)->set_bucket(k);
      bytes += MatrixBytes(matrices[i]);
    }
    bucket->set_bytes(bytes);
  }
}

// Per rank: FLOPs, matrices and, with measured speeds, the predicted
// seconds; the max and mean load.
void AddLoads(const std::vector<double>& load, const std::vector<double>& speed,
              v1::Plan* plan) {
  const int world = static_cast<int>(load.size());
  std::vector<int> count(world, 0);
  for (const v1::MatrixPlan& m : plan->matrices()) ++count[m.owner()];
  double max_load = 0.0;
  double total = 0.0;
  for (int r = 0; r < world; ++r) {
    v1::RankLoad* l = plan->add_loads();
    l->set_rank(r);
    l->set_ns_flops(load[r]);
    l->set_matrices(count[r]);
    if (!speed.empty()) {
      l->set_seconds_per_flop(speed[r]);
      l->set_predicted_seconds(load[r] * speed[r]);
    }
    max_load = std::max(max_load, load[r]);
    total += load[r];
  }
  plan->set_max_load_flops(max_load);
  plan->set_mean_load_flops(world > 0 ? total / world : 0.0);
}

}  // namespace

absl::StatusOr<v1::Plan> MakePlan(const JobLayout& layout,
                                  const PlannerOptions& options) {
  MUON_RETURN_IF_ERROR(CheckPlannerOptions(layout, options));
  v1::Plan plan;
  plan.set_job_id(options.job_id);
  plan.set_world_size(layout.world_size);
  plan.set_policy(PolicyName(options.policy));
  const BoxGroups groups = GroupByBoxes(layout.matrices);
  MUON_ASSIGN_OR_RETURN(std::vector<double> cost,
                        AddMatrices(layout, groups, options.ns_steps, &plan));
  const std::vector<double> load =
      AssignOwners(layout, groups, cost, options, &plan);
  AddBuckets(layout, options.bucket_size_bytes, options.reverse_buckets, &plan);
  AddLoads(load, options.rank_seconds_per_flop, &plan);
  *plan.mutable_schedule() =
      MakeScheduleHeader(plan, options.async, options.prefetch_count);
  plan.set_hash(PlanHash(plan));
  return plan;
}

v1::Plan PlanForRank(const v1::Plan& plan, int rank) {
  v1::Plan out;
  out.set_job_id(plan.job_id());
  out.set_world_size(plan.world_size());
  out.set_policy(plan.policy());
  *out.mutable_matrices() = plan.matrices();
  *out.mutable_buckets() = plan.buckets();
  out.set_max_load_flops(plan.max_load_flops());
  out.set_mean_load_flops(plan.mean_load_flops());
  out.set_hash(plan.hash());
  out.set_version(plan.version());
  out.set_first_step(plan.first_step());
  v1::Schedule* schedule = out.mutable_schedule();
  schedule->set_mode(plan.schedule().mode());
  schedule->set_prefetch_count(plan.schedule().prefetch_count());
  schedule->set_slots(plan.schedule().slots());
  schedule->set_derivation(plan.schedule().derivation());
  for (const v1::RankSchedule& rs : plan.schedule().ranks()) {
    if (rs.rank() == rank) *schedule->add_ranks() = rs;  // explicit plans
  }
  return out;
}

std::string StableMessageHash(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  uint64_t h = 14695981039346656037ULL;  // FNV-1a 64 offset basis
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;  // FNV-1a 64 prime
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(h));
  return std::string(hex, 16);
}

std::string PlanHash(const v1::Plan& plan) {
  v1::Plan copy = plan;
  copy.clear_hash();
  return StableMessageHash(copy);
}

namespace {

// Plan matrix i against layout matrix i: index, parameter, slice, shape,
// an owner in range that holds a shard, and the owner's gather bytes.
absl::Status CheckPlanMatrix(const v1::Plan& plan, const JobLayout& layout,
                             int i) {
  const int world = layout.world_size;
  const v1::MatrixPlan& m = plan.matrices(i);
  const MatrixLayout& matrix = layout.matrices[i];
  const std::string name = Quoted(matrix.name);
  const std::string& param =
      matrix.param_index >= 0 &&
              matrix.param_index < static_cast<int>(layout.params.size())
          ? layout.params[matrix.param_index].name
          : matrix.name;
  if (m.index() != i || m.param_index() != matrix.param_index ||
      m.param() != param || m.slice() != matrix.slice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan matrix ", i, " is index ", m.index(), " of parameter ",
        Quoted(m.param()), " (param_index ", m.param_index(), ", slice ",
        m.slice(), ") but matrix ", i, " is ", name, " (param_index ",
        matrix.param_index, ", slice ", matrix.slice, ")"));
  }
  if (m.rows() != matrix.rows || m.cols() != matrix.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan matrix ", i, " (", name, ") has shape [", m.rows(),
                     ", ", m.cols(), "] but the matrix is [", matrix.rows, ", ",
                     matrix.cols, "]"));
  }
  if (m.owner() < 0 || m.owner() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan matrix ", i, " (", name, ") has owner rank ",
                     m.owner(), " outside [0, ", world, ")"));
  }
  if (matrix.boxes[m.owner()].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan matrix ", i, " (", name, ") is owned by rank ", m.owner(),
        " which holds no shard of it (coordinate ",
        CoordToString(layout.mesh, layout.mesh.Coord(m.owner())), ")"));
  }
  if (m.gather_bytes() != GatherBytes(matrix, m.owner())) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan matrix ", i, " (", name, ") has gather_bytes ",
                     m.gather_bytes(), " but owner rank ", m.owner(),
                     " must gather ", GatherBytes(matrix, m.owner())));
  }
  return absl::OkStatus();
}

// Every matrix in exactly one bucket, the one it names; bucket indices
// and byte counts consistent.
absl::Status CheckPlanBuckets(const v1::Plan& plan, const JobLayout& layout) {
  const int num = static_cast<int>(layout.matrices.size());
  std::vector<int> bucket_of(num, -1);
  for (int k = 0; k < plan.buckets_size(); ++k) {
    const v1::Bucket& b = plan.buckets(k);
    if (b.index() != k) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan bucket ", k, " has index ", b.index()));
    }
    int64_t bytes = 0;
    for (int i : b.matrices()) {
      if (i < 0 || i >= num) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan bucket ", k, " lists matrix ", i, " outside [0, ", num, ")"));
      }
      if (bucket_of[i] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", i, " (", Quoted(layout.matrices[i].name),
            ") is in buckets ", bucket_of[i], " and ", k));
      }
      bucket_of[i] = k;
      bytes += MatrixBytes(layout.matrices[i]);
    }
    if (b.bytes() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("plan bucket ", k,
                                                     " reports ", b.bytes(),
                                                     " bytes but its matrices "
                                                     "hold ",
                                                     bytes));
    }
  }
  for (int i = 0; i < num; ++i) {
    if (bucket_of[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan matrix ", i, " (", Quoted(layout.matrices[i].name),
                       ") is in no bucket"));
    }
    if (plan.matrices(i).bucket() != bucket_of[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan matrix ", i, " (", Quoted(layout.matrices[i].name),
                       ") names bucket ", plan.matrices(i).bucket(),
                       " but bucket ", bucket_of[i], " lists it"));
    }
  }

  return absl::OkStatus();
}

// The per-rank loads and the max/mean agree with the owners' FLOPs.
absl::Status CheckPlanLoads(const v1::Plan& plan, const JobLayout& layout) {
  const int world = layout.world_size;
  std::vector<double> load(world, 0.0);
  std::vector<int> count(world, 0);
  for (const v1::MatrixPlan& m : plan.matrices()) {
    load[m.owner()] += m.ns_flops();
    ++count[m.owner()];
  }
  if (plan.loads_size() != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.loads_size(),
                     " rank loads but the world size is ", world));
  }
  double max_load = 0.0;
  double total = 0.0;
  for (int r = 0; r < world; ++r) {
    const v1::RankLoad& l = plan.loads(r);
    if (l.rank() != r || l.matrices() != count[r] ||
        !NearlyEqual(l.ns_flops(), load[r])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan load of rank ", r, " reports ", l.matrices(), " matrices and ",
          l.ns_flops(), " FLOPs (rank field ", l.rank(),
          ") but its owners "
          "give ",
          count[r], " matrices and ", load[r], " FLOPs"));
    }
    max_load = std::max(max_load, load[r]);
    total += load[r];
  }
  if (!NearlyEqual(plan.max_load_flops(), max_load) ||
      !NearlyEqual(plan.mean_load_flops(), world > 0 ? total / world : 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan reports max/mean load ", plan.max_load_flops(), "/",
                     plan.mean_load_flops(), " FLOPs but the loads give ",
                     max_load, "/", world > 0 ? total / world : 0.0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlan(const v1::Plan& plan, const JobLayout& layout) {
  const int world = layout.world_size;
  const int num = static_cast<int>(layout.matrices.size());
  if (plan.world_size() != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan has world size ", plan.world_size(), " but the job has ", world));
  }
  if (plan.matrices_size() != num) {
    return absl::InvalidArgumentError(absl::StrCat("plan has ",
                                                   plan.matrices_size(),
                                                   " matrices but the job "
                                                   "has ",
                                                   num, " matrices"));
  }
  for (int i = 0; i < num; ++i) {
    MUON_RETURN_IF_ERROR(CheckPlanMatrix(plan, layout, i));
  }
  MUON_RETURN_IF_ERROR(CheckPlanBuckets(plan, layout));
  MUON_RETURN_IF_ERROR(CheckPlanLoads(plan, layout));
  if (!plan.hash().empty() && plan.hash() != PlanHash(plan)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan hash ", plan.hash(),
                     " does not match its contents (", PlanHash(plan), ")"));
  }
  if (plan.has_schedule()) {
    absl::Status s = ValidateSchedule(plan.schedule(), plan);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan schedule: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> OwnersFromAssignment(
    const std::map<int, std::vector<int>>& rank_to_params, int num_params,
    int world_size, const std::vector<std::string>& param_names) {
  auto name_of = [&](int i) {
    return (i >= 0 && i < static_cast<int>(param_names.size()))
               ? Quoted(param_names[i])
               : absl::StrCat("#", i);
  };
  std::vector<int> owners(std::max(num_params, 0), -1);
  for (const auto& [rank, params] : rank_to_params) {
    for (int i : params) {
      if (i < 0 || i >= num_params) {
        return absl::InvalidArgumentError(
            absl::StrCat("assign_fn returned parameter index ", i, " for rank ",
                         rank, " but there are ", num_params, " parameters"));
      }
      if (rank < 0 || rank >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "assign_fn returned rank ", rank, " for parameter ", name_of(i),
            " (index ", i, ") but world size is ", world_size));
      }
      if (owners[i] >= 0) {
        if (owners[i] == rank) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", name_of(i), " (index ", i,
                           ") is assigned twice to rank ", rank));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", name_of(i), " (index ", i,
                         ") is assigned to ranks ", owners[i], " and ", rank));
      }
      owners[i] = rank;
    }
  }
  for (int i = 0; i < num_params; ++i) {
    if (owners[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", name_of(i), " (index ", i, ") is assigned to no rank"));
    }
  }
  return owners;
}

}  // namespace muon
