#include "tools/muonctl_lib.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/grpc_coordination_client.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "server/manifest_validation.h"
#include "server/planner.h"
#include "tools/validate.h"

ABSL_FLAG(std::string, spec, "", "Job spec file (JSON, muon.v1.JobSpec).");
ABSL_FLAG(bool, json, false, "Print JSON (protobuf's JSON mapping) instead of a table.");
ABSL_FLAG(std::string, policy, "",
          "Assignment policy for `plan`: lpt or round_robin (default: the "
          "spec's, else lpt).");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (live commands; for validate: use "
          "this daemon instead of one embedded in rank 0).");
ABSL_FLAG(std::string, job_id, "", "Job id (empty = the coordinator's job).");
ABSL_FLAG(int, steps, 3, "validate: optimizer steps.");
ABSL_FLAG(std::string, init, "", "validate: initial parameters DIR/<param>.npy.");
ABSL_FLAG(std::string, grads, "", "validate: gradients DIR/<step>/<param>.npy.");
ABSL_FLAG(std::string, dump, "", "validate: write final parameters under DIR.");
ABSL_FLAG(uint64_t, seed, 0, "validate: seed of the synthetic values.");
ABSL_FLAG(double, tolerance, 0.0, "validate: accepted max abs difference (0 = bitwise).");
ABSL_FLAG(int, timeout_s, 600, "validate: bound on the distributed run, seconds.");
// Internal (validate-rank).
ABSL_FLAG(int, rank, -1, "Internal: rank of a validate-rank process.");
ABSL_FLAG(std::string, out_dir, "", "Internal: validate-rank output folder.");
ABSL_FLAG(std::string, port_file, "", "Internal: rank 0 writes its coordinator port here.");

namespace muon {
namespace {

std::string Shape(int64_t r, int64_t c) { return absl::StrCat("[", r, ", ", c, "]"); }

std::string ToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return s;
}

struct Planned {
  JobLayout layout;
  v1::Plan plan;
};

absl::StatusOr<Planned> PlanSpec(const v1::JobSpec& spec, const std::string& policy) {
  MUON_RETURN_IF_ERROR(ValidateJobSpec(spec));
  MUON_ASSIGN_OR_RETURN(std::vector<v1::RankManifest> manifests, ManifestsFromSpec(spec));
  Planned p;
  MUON_ASSIGN_OR_RETURN(p.layout, ValidateManifests(manifests));
  PlannerOptions options;
  const std::string name = !policy.empty() ? policy
                           : !spec.execution().assignment_policy().empty()
                               ? spec.execution().assignment_policy()
                               : "lpt";
  MUON_ASSIGN_OR_RETURN(options.policy, ParsePolicy(name));
  options.bucket_size_bytes = spec.execution().bucket_size_bytes();
  if (spec.optimizer().has_ns_steps()) options.ns_steps = spec.optimizer().ns_steps();
  options.job_id = spec.job_id();
  MUON_ASSIGN_OR_RETURN(p.plan, MakePlan(p.layout, options));
  return p;
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "muonctl: " << s.ToString() << "\n";
  return 1;
}

int CmdPlan(const std::vector<std::string>&, std::ostream& out, std::ostream& err) {
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    err << "muonctl plan: --spec FILE is required\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
  if (!spec.ok()) return Fail(err, spec.status());
  absl::StatusOr<Planned> p = PlanSpec(*spec, absl::GetFlag(FLAGS_policy));
  if (!p.ok()) return Fail(err, p.status());
  if (absl::GetFlag(FLAGS_json)) {
    out << ToJson(p->plan) << "\n";
    return 0;
  }
  const v1::Plan& plan = p->plan;
  out << absl::StrFormat("plan %s: %d matrices over %d ranks (mesh %s), policy %s, %d buckets\n",
                         plan.hash(), plan.matrices_size(), plan.world_size(),
                         p->layout.mesh.ToString(), plan.policy(), plan.buckets_size());
  // Local shapes: the distinct non-empty boxes of the matrix, then how many
  // ranks hold part of it (ranks outside a pp/ep sub-mesh, holding other
  // experts, or with an empty torch.chunk shard hold none).
  int name_width = 36;
  for (const MatrixLayout& ml : p->layout.matrices) {
    name_width = std::max(name_width, static_cast<int>(ml.name.size()));
  }
  out << absl::StrFormat("%-*s %5s %6s %-14s %-28s %10s\n", name_width, "matrix",
                         "owner", "bucket", "global shape", "local shapes (holders)",
                         "NS GFLOP");
  for (const v1::MatrixPlan& m : plan.matrices()) {
    const MatrixLayout& ml = p->layout.matrices[m.index()];
    std::vector<std::string> locals;
    std::set<std::pair<int64_t, int64_t>> seen;
    int holders = 0;
    for (const Box& b : ml.boxes) {
      if (b.empty()) continue;
      ++holders;
      if (seen.insert({b.rows.size(), b.cols.size()}).second) {
        locals.push_back(Shape(b.rows.size(), b.cols.size()));
      }
    }
    out << absl::StrFormat("%-*s %5d %6d %-14s %-28s %10.4g\n", name_width, ml.name,
                           m.owner(),
                           m.bucket(), Shape(m.rows(), m.cols()),
                           absl::StrCat(absl::StrJoin(locals, " "), " (", holders, "/",
                                        ml.boxes.size(), ")"),
                           m.ns_flops() / 1e9);
  }
  out << absl::StrFormat("%-6s %9s %10s\n", "rank", "matrices", "NS GFLOP");
  for (const v1::RankLoad& l : plan.loads()) {
    out << absl::StrFormat("%-6d %9d %10.4g\n", l.rank(), l.matrices(), l.ns_flops() / 1e9);
  }
  // Both policies side by side.
  for (const char* policy : {"lpt", "round_robin"}) {
    absl::StatusOr<Planned> q = PlanSpec(*spec, policy);
    if (!q.ok()) return Fail(err, q.status());
    const double mean = q->plan.mean_load_flops();
    out << absl::StrFormat(
        "policy %-11s max load %.4g GFLOP, mean %.4g GFLOP, max/mean %.3f\n", policy,
        q->plan.max_load_flops() / 1e9, mean / 1e9,
        mean > 0 ? q->plan.max_load_flops() / mean : 0.0);
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<CoordinationClient>> Connect(std::ostream& err) {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  }
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<GrpcCoordinationClient> c,
                        GrpcCoordinationClient::Create(
                            address, absl::GetFlag(FLAGS_job_id), absl::Seconds(5)));
  return std::unique_ptr<CoordinationClient>(std::move(c));
}

int CmdAssignments(const std::vector<std::string>&, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(err);
  if (!c.ok()) return Fail(err, c.status());
  absl::StatusOr<v1::GetAssignmentsResponse> a = (*c)->GetAssignments();
  if (!a.ok()) return Fail(err, a.status());
  if (absl::GetFlag(FLAGS_json)) {
    out << ToJson(*a) << "\n";
    return 0;
  }
  out << absl::StrFormat("%-6s %10s  %s\n", "rank", "NS GFLOP", "matrices");
  for (const v1::RankAssignment& r : a->ranks()) {
    out << absl::StrFormat("%-6d %10.4g  %s\n", r.rank(), r.ns_flops() / 1e9,
                           absl::StrJoin(r.matrices(), ", "));
  }
  return 0;
}

int CmdStatus(const std::vector<std::string>&, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(err);
  if (!c.ok()) return Fail(err, c.status());
  absl::StatusOr<v1::JobInfo> job = (*c)->GetJob();
  if (!job.ok()) return Fail(err, job.status());
  absl::StatusOr<v1::ListRanksResponse> ranks = (*c)->ListRanks();
  if (!ranks.ok()) return Fail(err, ranks.status());
  if (absl::GetFlag(FLAGS_json)) {
    out << "{\"job\": " << ToJson(*job) << ",\n\"ranks\": " << ToJson(*ranks) << "}\n";
    return 0;
  }
  out << absl::StrFormat("job %s: %s, %d/%d ranks joined, plan %s%s\n", job->job_id(),
                         job->state(), job->ranks_joined(), job->world_size(),
                         job->plan_hash().empty() ? "-" : job->plan_hash(),
                         job->error().empty() ? "" : absl::StrCat(", error: ", job->error()));
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  out << absl::StrFormat("%-6s %-9s %14s %8s %12s %9s\n", "rank", "state",
                         "heartbeat age", "step", "step time", "matrices");
  for (const v1::RankStatus& r : ranks->ranks()) {
    const std::string age = r.last_heartbeat_unix_s() > 0
                                ? absl::StrFormat("%.1f s", now - r.last_heartbeat_unix_s())
                                : "-";
    out << absl::StrFormat("%-6d %-9s %14s %8d %10.1fms %9d\n", r.rank(), r.state(), age,
                           r.last_step(), r.last_step_time_s() * 1e3,
                           r.matrices_orthogonalized());
  }
  return 0;
}

ValidateOptions ValidateFlags() {
  ValidateOptions o;
  o.spec_path = absl::GetFlag(FLAGS_spec);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.init_dir = absl::GetFlag(FLAGS_init);
  o.grads_dir = absl::GetFlag(FLAGS_grads);
  o.dump_dir = absl::GetFlag(FLAGS_dump);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.tolerance = absl::GetFlag(FLAGS_tolerance);
  o.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  return o;
}

int CmdValidate(const std::vector<std::string>&, std::ostream& out, std::ostream& err) {
  ValidateOptions o = ValidateFlags();
  if (o.spec_path.empty() || o.steps < 1) {
    err << "muonctl validate: --spec FILE and --steps K >= 1 are required\n";
    return 2;
  }
  absl::Status s = RunValidate(o, out);
  return s.ok() ? 0 : Fail(err, s);
}

int CmdValidateRank(const std::vector<std::string>&, std::ostream& out, std::ostream& err) {
  const int rank = absl::GetFlag(FLAGS_rank);
  absl::Status s = RunValidateRank(ValidateFlags(), rank, absl::GetFlag(FLAGS_out_dir),
                                   absl::GetFlag(FLAGS_port_file));
  if (!s.ok()) {
    err << "muonctl validate: rank " << rank << ": " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}

struct Command {
  const char* name;
  int (*fn)(const std::vector<std::string>&, std::ostream&, std::ostream&);
  const char* help;
  bool hidden;
};

constexpr Command kCommands[] = {
    {"plan", CmdPlan, "plan --spec FILE [--policy lpt|round_robin] [--json]: owners, shapes, NS cost, loads", false},
    {"assignments", CmdAssignments, "assignments --coordinator HOST:PORT [--json]: matrices per rank of a live job", false},
    {"status", CmdStatus, "status --coordinator HOST:PORT [--json]: job state and per-rank health", false},
    {"validate", CmdValidate, "validate --spec FILE --steps K [--init DIR] [--grads DIR] [--dump DIR]: distributed vs single-device", false},
    {"validate-rank", CmdValidateRank, "", true},
};

}  // namespace

int RunMuonctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (!args.empty()) {
    for (const Command& c : kCommands) {
      if (args[0] == c.name) return c.fn(args, out, err);
    }
    err << "muonctl: unknown command \"" << args[0] << "\"\n";
  }
  err << "usage: muonctl COMMAND [flags]\n";
  for (const Command& c : kCommands) {
    if (!c.hidden) err << "  " << c.help << "\n";
  }
  return 2;
}

}  // namespace muon
