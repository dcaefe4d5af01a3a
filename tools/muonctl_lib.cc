#include "tools/muonctl_lib.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "client/muon_options.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/wire_names.h"
#include "control/grpc_coordination_client.h"
#include "coordination/credentials.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "plan/manifest_validation.h"
#include "plan/plan_job.h"
#include "plan/schedule.h"
#include "tools/report.h"
#include "tools/spec_builder.h"
#include "tools/validate.h"

namespace muon {
namespace {

// Keys in insertion order (field order): stable, readable output.
using Json = nlohmann::ordered_json;

// Each command's flags: a struct per command, bound by its registrar
// (Bind*) and passed to it (no process-wide state: RunMuonctl may run
// concurrently); a flag another command takes is rejected as unknown.

// A live coordinator and the credentials to read it.
struct LiveFlags {
  std::string coordinator;  // host:port
  std::string job_id;       // empty = the coordinator's job
  std::string token_file;   // read-only token or job secret, mode 0600
  std::string tls_ca_file;  // PEM CA; empty = plaintext
};

// The kept step reports of a live job.
struct ReportsFlags {
  LiveFlags live;
  int last_steps = 0;  // each rank's last N kept steps (0 = all kept)
};

struct PlanFlags {
  std::string spec;    // job spec file (JSON, muon.v1.JobSpec)
  std::string policy;  // lpt or round_robin; empty = the spec's
  bool json = false;   // JSON instead of a table
  bool full = false;   // every matrix and rank, however many
};

// Above this many rows, `muonctl plan` prints the first kSummaryRows
// matrices and the kSummaryRows most loaded ranks unless --full.
constexpr int kFullTableRows = 1000;
constexpr int kSummaryRows = 20;

struct AssignmentsFlags {
  LiveFlags live;
  bool json = false;
};

struct StatusFlags {
  LiveFlags live;
  bool json = false;
  bool watch = false;
  double interval_s = 1.0;  // seconds between refreshes
  int count = 0;            // refreshes; 0 = until interrupted
};

struct TimingsFlags {
  ReportsFlags reports;
  bool json = false;
};

struct TraceFlags {
  ReportsFlags reports;
  std::string out;  // Chrome trace JSON file; "-" = stdout
};

struct ScheduleFlags {
  std::string spec;  // offline, or
  LiveFlags live;    // live
  std::string policy;
  bool json = false;
};

struct ReportFlags {
  std::string spec;    // offline, or the live job's layout to check
  std::string policy;  // offline
  ReportsFlags reports;
  std::string out;  // HTML file
};

struct SpecFlags {
  std::string safetensors;  // header to read
  std::string mesh, default_placements, transpose;
  std::vector<std::string> rules, exclude;
  bool expert_stacks = false;
  std::string job_id;  // the spec's job id; empty = "job"
  std::string out;     // empty or "-" = stdout
};

// `validate-rank`, the internal command `validate` runs per rank.
struct ValidateRankFlags {
  ValidateOptions validate;
  int rank = -1;
  std::string out_dir, port_file;
};

struct CheckpointFlags {
  std::string dir;  // checkpoint directory
};

std::string Shape(int64_t r, int64_t c) {
  return absl::StrCat("[", r, ", ", c, "]");
}

Json FieldJson(const google::protobuf::Message& m,
               const google::protobuf::FieldDescriptor* f, int index);

// `m` as JSON for jq users: every field, defaults included, under its
// proto name; int64 and uint64 as JSON numbers (protobuf's JSON mapping
// prints them as strings); enums by their full names, as protobuf's
// JSON mapping prints and parses them (OP_KIND_GATHER); maps as objects; NaN
// and infinities as null. Built with nlohmann::json from protobuf reflection.
Json ProtoJson(const google::protobuf::Message& m) {
  Json out = Json::object();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      Json map = Json::object();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        const google::protobuf::Message& entry = r->GetRepeatedMessage(m, f, k);
        const Json key = FieldJson(entry, entry.GetDescriptor()->field(0), -1);
        map[key.is_string() ? key.get<std::string>() : key.dump()] =
            FieldJson(entry, entry.GetDescriptor()->field(1), -1);
      }
      out[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json list = Json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        list.push_back(FieldJson(m, f, k));
      }
      out[f->name()] = std::move(list);
    } else {
      out[f->name()] = FieldJson(m, f, -1);
    }
  }
  return out;
}

Json Number(double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); }

// One value of field `f` (element `index` of a repeated field, -1 for a
// singular one).
Json FieldJson(const google::protobuf::Message& m,
               const google::protobuf::FieldDescriptor* f, int index) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FD::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FD::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FD::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FD::CPPTYPE_DOUBLE:
      return Number(rep ? r->GetRepeatedDouble(m, f, index)
                        : r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return Number(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FD::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FD::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case FD::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case FD::CPPTYPE_MESSAGE:
      return ProtoJson(rep ? r->GetRepeatedMessage(m, f, index)
                           : r->GetMessage(m, f));
  }
  return nullptr;
}

std::string ToJson(const google::protobuf::Message& m) {
  return ProtoJson(m).dump(2);
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "muonctl: " << s.ToString() << "\n";
  return 1;
}

// Writes `text` to the file `path` (created or truncated). Errors:
// Unavailable naming the path when it cannot be written.
absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    return absl::UnavailableError(absl::StrCat("cannot write \"", path, "\""));
  }
  return absl::OkStatus();
}

// "[r, c] ... (holders/ranks)": the distinct local shapes of one box list
// and how many ranks hold a part. Ranks outside a pp/ep sub-mesh, holding
// other experts, or with an empty torch.chunk shard hold none of a matrix.
std::string LocalShapes(const BoxList& boxes) {
  std::vector<std::string> locals;
  std::set<std::pair<int64_t, int64_t>> seen;
  int holders = 0;
  for (const Box& b : boxes) {
    if (b.empty()) continue;
    ++holders;
    if (seen.insert({b.rows.size(), b.cols.size()}).second) {
      locals.push_back(Shape(b.rows.size(), b.cols.size()));
    }
  }
  return absl::StrCat(absl::StrJoin(locals, " "), " (", holders, "/",
                      boxes.size(), ")");
}

// The plan's matrices: owner, bucket, global shape, the distinct local
// shapes with how many ranks hold a part, and Newton-Schulz FLOPs; the
// first `rows` of them (all when rows < 0), then how many were left out.
void PrintPlanMatrices(const JobPlan& p, int rows, std::ostream& out) {
  int name_width = 36;
  for (const MatrixLayout& ml : p.layout.matrices) {
    name_width = std::max(name_width, static_cast<int>(ml.name.size()));
  }
  out << absl::StrFormat("%-*s %5s %6s %-14s %-28s %12s\n", name_width,
                         "matrix", "owner", "bucket", "global shape",
                         "local shapes (holders)", "NS per step");
  // Matrices of one layout share their box list: scan each list once.
  absl::flat_hash_map<const void*, std::string> locals;
  const int n = p.plan.matrices_size();
  const int shown = rows < 0 ? n : std::min(n, rows);
  for (int i = 0; i < shown; ++i) {
    const v1::MatrixPlan& m = p.plan.matrices(i);
    const MatrixLayout& ml = p.layout.matrices[m.index()];
    auto [it, added] = locals.try_emplace(ml.boxes.id());
    if (added) it->second = LocalShapes(ml.boxes);
    out << absl::StrFormat(
        "%-*s %5d %6d %-14s %-28s %12s\n", name_width, ml.name, m.owner(),
        m.bucket(), Shape(m.rows(), m.cols()), it->second, Flops(m.ns_flops()));
  }
  if (shown < n) {
    out << "... " << n - shown << " more matrices (--full prints every one)\n";
  }
}

// What the spec's optimizer keeps per rank besides the exchange, from its
// options as a rank resolves them (ResolveOptions, for host parameters:
// a combination no rank could run, e.g. normuon with the bf16 exchange,
// is refused by name): U formed in the slots (Nesterov, the default, or
// bf16 momentum), NorMuon's row state in them, and the momentum dtype
// ("param" is float32: a spec's parameters are float32).
absl::StatusOr<PlanMemoryOptions> SpecMemoryOptions(const v1::JobSpec& spec,
                                                    const JobLayout& layout) {
  MUON_ASSIGN_OR_RETURN(MuonOptions options,
                        MuonOptionsFromProto(spec.optimizer()));
  MUON_ASSIGN_OR_RETURN(
      options, ResolveOptions(options, spec.execution(), OptionContext()));
  PlanMemoryOptions m;
  const int bytes = options.momentum_dtype == MomentumDType::kBFloat16 ? 2 : 4;
  m.form_update = options.nesterov || bytes == 2;
  m.row_state = options.normuon;
  m.momentum_element_bytes.assign(layout.params.size(), bytes);
  return m;
}

// Per rank: load, then from `t` (PlanTraffic's; empty above its size
// bound: not shown) bytes per step (fp32 exchange; bf16 in "sent bf16"),
// buffer memory, momentum and their sum; then the whole step's exchange
// bytes in both dtypes.
void PrintPlanRanks(const JobPlan& p, const std::vector<RankTraffic>& t,
                    int rows, std::ostream& out) {
  const bool traffic = !t.empty();
  // All ranks in order, or the `rows` most loaded (ties: lower rank).
  std::vector<const v1::RankLoad*> listed;
  for (const v1::RankLoad& l : p.plan.loads()) listed.push_back(&l);
  const bool summary = rows >= 0 && static_cast<int>(listed.size()) > rows;
  if (summary) {
    std::stable_sort(listed.begin(), listed.end(),
                     [](const v1::RankLoad* a, const v1::RankLoad* b) {
                       return a->ns_flops() > b->ns_flops();
                     });
    out << "the " << rows << " most loaded of " << listed.size()
        << " ranks (--full prints every one):\n";
    listed.resize(rows);
  }
  out << absl::StrFormat("%-6s %9s %12s %12s %12s %12s %12s %12s %12s %12s\n",
                         "rank", "matrices", "NS per step", "gathered", "sent",
                         "received", "sent bf16", "peak buffer", "momentum",
                         "peak");
  int64_t sent = 0, sent_bf16 = 0;
  for (const v1::RankLoad* load : listed) {
    const v1::RankLoad& l = *load;
    const int r = l.rank();
    out << absl::StrFormat(
        "%-6d %9d %12s %12s %12s %12s %12s %12s %12s %12s\n", r, l.matrices(),
        Flops(l.ns_flops()), traffic ? Bytes(t[r].gathered) : "-",
        traffic ? Bytes(t[r].sent) : "-", traffic ? Bytes(t[r].received) : "-",
        traffic ? Bytes(t[r].sent_bf16) : "-",
        traffic ? Bytes(t[r].peak_buffer) : "-",
        traffic ? Bytes(t[r].momentum) : "-", traffic ? Bytes(t[r].peak) : "-");
  }
  for (const RankTraffic& rank : t) {
    sent += rank.sent;
    sent_bf16 += rank.sent_bf16;
  }
  if (!traffic) {
    out << "(bytes per rank not computed: ranks^2 x matrices above "
           "kMaxTrafficWork)\n";
    return;
  }
  out << absl::StrFormat(
      "exchange per step, all ranks: %s with float32, %s with bfloat16 "
      "(execution.exchange_dtype; this spec: %s)\n",
      Bytes(sent), Bytes(sent_bf16),
      ExchangeIsBf16(p.layout.execution) ? "bfloat16" : "float32");
}

int CmdPlan(const PlanFlags& f, std::ostream& out, std::ostream& err) {
  // --spec is required and checked to exist by its flag (BindPlan).
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(f.spec);
  if (!spec.ok()) return Fail(err, spec.status());
  absl::StatusOr<JobPlan> p = PlanJobSpec(*spec, f.policy);
  if (!p.ok()) return Fail(err, p.status());
  if (f.json) {
    out << ToJson(p->plan) << "\n";
    return 0;
  }
  absl::StatusOr<PlanMemoryOptions> memory =
      SpecMemoryOptions(*spec, p->layout);
  if (!memory.ok()) return Fail(err, memory.status());
  absl::StatusOr<std::vector<RankTraffic>> traffic = PlanTraffic(*p, *memory);
  if (!traffic.ok()) return Fail(err, traffic.status());
  const v1::Plan& plan = p->plan;
  out << absl::StrFormat(
      "plan %s: %d matri%s over %d rank%s (mesh %s), policy %s, %d "
      "bucket%s\n",
      plan.hash(), plan.matrices_size(),
      plan.matrices_size() == 1 ? "x" : "ces", plan.world_size(),
      plan.world_size() == 1 ? "" : "s", p->layout.mesh.ToString(),
      plan.policy(), plan.buckets_size(), plan.buckets_size() == 1 ? "" : "s");
  const bool large = plan.matrices_size() > kFullTableRows ||
                     plan.world_size() > kFullTableRows;
  const int rows = f.full || !large ? -1 : kSummaryRows;
  PrintPlanMatrices(*p, rows, out);
  PrintPlanRanks(*p, *traffic, rows, out);
  const std::string& momentum = spec->optimizer().momentum_dtype();
  if (momentum.empty() || momentum == "param") {
    out << "momentum counted as float32: a spec's parameters carry no "
           "dtype (optimizer.momentum_dtype \"bfloat16\" for a bf16 model)\n";
  }
  // Both policies side by side.
  for (const char* policy : {"lpt", "round_robin"}) {
    // The plan above is one of them: planned once.
    const JobPlan* q = &*p;
    absl::StatusOr<JobPlan> other;
    if (plan.policy() != policy) {
      other = PlanJobSpec(*spec, policy);
      if (!other.ok()) return Fail(err, other.status());
      q = &*other;
    }
    const double mean = q->plan.mean_load_flops();
    const double bound = LoadLowerBoundFlops(q->plan);
    out << absl::StrFormat(
        "policy %-11s max load %s, mean %s, max/mean %.3f, lower bound %s, "
        "max/bound %.3f\n",
        policy, Flops(q->plan.max_load_flops()), Flops(mean),
        mean > 0 ? q->plan.max_load_flops() / mean : 0.0, Flops(bound),
        bound > 0 ? q->plan.max_load_flops() / bound : 0.0);
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<CoordinationClient>> Connect(const LiveFlags& f,
                                                            std::ostream& err) {
  const std::string address = f.coordinator;
  if (address.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  }
  GrpcClientSecurity security;
  const std::string token_file = f.token_file;
  if (!token_file.empty()) {
    MUON_ASSIGN_OR_RETURN(security.token, ReadSecretFile(token_file));
  } else {
    MUON_ASSIGN_OR_RETURN(security.token, JobSecretFromEnv());
  }
  security.tls_ca_file = f.tls_ca_file;
  if (security.tls_ca_file.empty()) {
    const char* ca = std::getenv("MUON_TLS_CA_FILE");
    if (ca != nullptr) security.tls_ca_file = ca;
  }
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<GrpcCoordinationClient> c,
                        GrpcCoordinationClient::Create(
                            address, f.job_id, absl::Seconds(5), security));
  return std::unique_ptr<CoordinationClient>(std::move(c));
}

int CmdAssignments(const AssignmentsFlags& f, std::ostream& out,
                   std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(f.live, err);
  if (!c.ok()) return Fail(err, c.status());
  absl::StatusOr<v1::GetAssignmentsResponse> a = (*c)->GetAssignments();
  if (!a.ok()) return Fail(err, a.status());
  if (f.json) {
    out << ToJson(*a) << "\n";
    return 0;
  }
  out << absl::StrFormat("%-6s %12s  %s\n", "rank", "NS per step", "matrices");
  for (const v1::RankAssignment& r : a->ranks()) {
    out << absl::StrFormat("%-6d %12s  %s\n", r.rank(), Flops(r.ns_flops()),
                           absl::StrJoin(r.matrices(), ", "));
  }
  return 0;
}

// Why the job is unhealthy ("rank 3 lost", "job failed: ..."), or "" when
// no rank is lost or failed and the job has not failed.
std::string Unhealthy(const v1::JobInfo& job,
                      const v1::ListRanksResponse& ranks) {
  std::vector<std::string> bad;
  for (const v1::RankStatus& r : ranks.ranks()) {
    if (r.state() == v1::RANK_STATE_LOST ||
        r.state() == v1::RANK_STATE_FAILED) {
      bad.push_back(absl::StrCat("rank ", r.rank(), " ", WireName(r.state())));
    }
  }
  if (job.state() == v1::JOB_STATE_FAILED) {
    bad.push_back(absl::StrCat("job failed: ", job.error()));
  }
  return absl::StrJoin(bad, "; ");
}

// One status snapshot: the job line and a table per rank (or one JSON
// object {"job": {...}, "ranks": [...]} with --json). Sets *unhealthy to
// why a rank is lost or failed or the job failed ("" when none).
absl::Status PrintStatus(const StatusFlags& f, CoordinationClient& c,
                         std::ostream& out, std::string* unhealthy) {
  MUON_ASSIGN_OR_RETURN(v1::JobInfo job, c.GetJob());
  MUON_ASSIGN_OR_RETURN(v1::ListRanksResponse ranks, c.ListRanks());
  *unhealthy = Unhealthy(job, ranks);
  if (f.json) {
    Json doc = Json::object();
    doc["job"] = ProtoJson(job);
    doc["ranks"] = ProtoJson(ranks)["ranks"];
    out << doc.dump(2) << "\n";
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "job %s: %s, %d/%d ranks joined, plan %s%s\n", job.job_id(),
      WireName(job.state()), job.ranks_joined(), job.world_size(),
      job.plan_hash().empty() ? "-" : job.plan_hash(),
      job.error().empty() ? "" : absl::StrCat(", error: ", job.error()));
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  out << absl::StrFormat("%-6s %-9s %13s %8s %12s %9s %9s %9s\n", "rank",
                         "state", "heartbeat age", "step", "step time",
                         "straggler", "dropped", "matrices");
  for (const v1::RankStatus& r : ranks.ranks()) {
    const std::string age =
        r.last_heartbeat_unix_s() > 0
            ? absl::StrFormat("%.1f s",
                              std::max(0.0, now - r.last_heartbeat_unix_s()))
            : "-";
    const bool reported = r.last_step() >= 0;
    out << absl::StrFormat(
        "%-6d %-9s %13s %8s %12s %9s %9d %9d\n", r.rank(), WireName(r.state()),
        age, reported ? absl::StrCat(r.last_step()) : "-",
        reported ? absl::StrFormat("%.1f ms", r.last_step_time_s() * 1e3) : "-",
        r.straggler() ? "yes" : "", r.reports_dropped(),
        r.matrices_orthogonalized());
  }
  return absl::OkStatus();
}

int CmdStatus(const StatusFlags& f, std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(f.live, err);
  if (!c.ok()) return Fail(err, c.status());
  // A probe: exit 1 when a rank is lost or failed or the job failed.
  auto outcome = [&](const absl::Status& s, const std::string& unhealthy) {
    if (!s.ok()) return Fail(err, s);
    if (unhealthy.empty()) return 0;
    err << "muonctl status: " << unhealthy << "\n";
    return 1;
  };
  std::string unhealthy;
  if (!f.watch) return outcome(PrintStatus(f, **c, out, &unhealthy), unhealthy);
  const double interval_s = f.interval_s;
  const int count = f.count;
  // Like watch(1): a failed refresh is reported and the next one tried; the
  // exit code is the last refresh's.
  int rc = 0;
  for (int i = 0; count == 0 || i < count; ++i) {
    if (i > 0) absl::SleepFor(absl::Seconds(interval_s));
    if (!f.json) {
      out << absl::StrFormat(
          "--- %s ---\n", absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(),
                                           absl::LocalTimeZone()));
    }
    absl::Status s = PrintStatus(f, **c, out, &unhealthy);
    rc = outcome(s, unhealthy);
    out.flush();
  }
  return rc;
}

// Nearest-rank percentile of sorted values: the ceil(p/100 * n)-th smallest.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double n = static_cast<double>(sorted.size());
  int64_t k = static_cast<int64_t>(std::ceil(p / 100.0 * n)) - 1;
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(sorted.size()) - 1);
  return sorted[k];
}

absl::StatusOr<v1::GetReportsResponse> FetchReports(const ReportsFlags& f,
                                                    std::ostream& err) {
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CoordinationClient> c,
                        Connect(f.live, err));
  // --last_steps >= 0 is checked by its flag (BindReports).
  return c->GetReports(/*rank=*/-1, f.last_steps);
}

// `muonctl timings`: per rank and operation, the count and the p50 / p99 of
// the operation's duration (end - start) over the kept reports; "step" is
// the whole step (StepReport.step_time_s).
int CmdTimings(const TimingsFlags& f, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::GetReportsResponse> reports = FetchReports(f.reports, err);
  if (!reports.ok()) return Fail(err, reports.status());
  // rank -> op -> durations in ms, the operations in step order (the
  // OpKind numbers) and the whole step last.
  constexpr int kStep = std::numeric_limits<int>::max();
  std::map<int, std::map<int, std::vector<double>>> ms;
  for (const v1::StepReport& r : reports->reports()) {
    for (const v1::OpTiming& op : r.ops()) {
      ms[r.rank()][op.op()].push_back((op.end_s() - op.start_s()) * 1e3);
    }
    ms[r.rank()][kStep].push_back(r.step_time_s() * 1e3);
  }
  struct Row {
    int rank;
    std::string op;
    size_t count;
    double p50, p99;
  };
  std::vector<Row> rows;
  for (auto& [rank, ops] : ms) {
    for (auto& [op, v] : ops) {
      std::sort(v.begin(), v.end());
      const std::string name =
          op == kStep ? "step" : WireName(static_cast<v1::OpKind>(op));
      rows.push_back(
          {rank, name, v.size(), Percentile(v, 50), Percentile(v, 99)});
    }
  }
  if (f.json) {
    // {"reports": N, "timings": [{"rank", "op", "count", "p50_ms", "p99_ms"}]}
    Json timings = Json::array();
    for (const Row& row : rows) {
      timings.push_back(Json{{"rank", row.rank},
                             {"op", row.op},
                             {"count", row.count},
                             {"p50_ms", Number(row.p50)},
                             {"p99_ms", Number(row.p99)}});
    }
    out << Json{{"reports", reports->reports_size()},
                {"timings", std::move(timings)}}
               .dump(2)
        << "\n";
    return 0;
  }
  out << absl::StrFormat(
      "%d reports; durations in ms (nearest-rank percentiles)\n",
      reports->reports_size());
  out << absl::StrFormat("%-6s %-14s %7s %11s %11s\n", "rank", "op", "count",
                         "p50 ms", "p99 ms");
  for (const Row& row : rows) {
    out << absl::StrFormat("%-6d %-14s %7d %11.3f %11.3f\n", row.rank, row.op,
                           row.count, row.p50, row.p99);
  }
  return 0;
}

// The stream an operation was recorded on (reports without one ran on
// "main").
v1::StreamKind StreamOf(const v1::OpTiming& op) {
  return op.stream() == v1::STREAM_KIND_UNSPECIFIED ? v1::STREAM_KIND_MAIN
                                                    : op.stream();
}

// Track (tid) of a stream: its StreamKind number (main 1, comm 2, compute
// 3; a kind from a newer agent keeps its own number).
int StreamTid(v1::StreamKind stream) { return static_cast<int>(stream); }

// A metadata ("M") event naming or ordering a process or thread.
Json MetadataEvent(const std::string& name, int pid, int tid, Json args) {
  return Json{{"name", name},
              {"ph", "M"},
              {"pid", pid},
              {"tid", tid},
              {"args", std::move(args)}};
}

// The step span of report `r` (first operation start to last end, on
// track 0 "step", cat "muon.step") and, per stream, a "wait" span (cat
// "muon.wait") for each gap between one operation's end and the next's
// start: where a stream waited for the other or for a peer.
void AddStepAndWaitSpans(const v1::StepReport& r, double t0,
                         std::set<std::pair<int, int>>* threads, Json* events) {
  if (r.ops_size() == 0) return;
  const int pid = r.rank();
  if (threads->insert({pid, 0}).second) {
    events->push_back(MetadataEvent("thread_name", pid, 0, {{"name", "step"}}));
    events->push_back(
        MetadataEvent("thread_sort_index", pid, 0, {{"sort_index", 0}}));
  }
  double start = r.ops(0).start_s(), end = r.ops(0).end_s();
  std::map<v1::StreamKind, std::vector<std::pair<double, double>>> by_stream;
  for (const v1::OpTiming& op : r.ops()) {
    start = std::min(start, op.start_s());
    end = std::max(end, op.end_s());
    by_stream[StreamOf(op)].push_back({op.start_s(), op.end_s()});
  }
  auto span = [&](const std::string& name, const char* cat, int tid, double a,
                  double b) {
    events->push_back(Json{{"name", name},
                           {"cat", cat},
                           {"ph", "X"},
                           {"pid", pid},
                           {"tid", tid},
                           {"ts", Number((a - t0) * 1e6)},
                           {"dur", Number(std::max(0.0, b - a) * 1e6)},
                           {"args", Json{{"step", r.step()}}}});
  };
  span(absl::StrCat("step ", r.step()), "muon.step", 0, start, end);
  for (auto& [stream, ops] : by_stream) {
    std::sort(ops.begin(), ops.end());
    const int tid = StreamTid(stream);
    double busy_until = ops[0].second;
    for (size_t i = 1; i < ops.size(); ++i) {
      if (ops[i].first > busy_until) {
        span("wait", "muon.wait", tid, busy_until, ops[i].first);
      }
      busy_until = std::max(busy_until, ops[i].second);
    }
  }
}

// The earliest operation start of the reports (seconds since the Unix
// epoch), 0 when none has an operation: the trace's ts 0.
double EarliestStart(const v1::GetReportsResponse& reports) {
  double t0 = 0;
  bool any = false;
  for (const v1::StepReport& r : reports.reports()) {
    for (const v1::OpTiming& op : r.ops()) {
      if (!any || op.start_s() < t0) t0 = op.start_s();
      any = true;
    }
  }
  return t0;
}

// One complete event ("X", cat "muon") per operation of report `r`, on its
// stream's thread (named the first time `threads` sees it); returns the
// number of events added.
int AddOperationEvents(const v1::StepReport& r, double t0,
                       std::set<std::pair<int, int>>* threads, Json* events) {
  const int pid = r.rank();
  int slices = 0;
  for (const v1::OpTiming& op : r.ops()) {
    const v1::StreamKind stream = StreamOf(op);
    const int tid = StreamTid(stream);
    if (threads->insert({pid, tid}).second) {
      events->push_back(
          MetadataEvent("thread_name", pid, tid, {{"name", WireName(stream)}}));
      events->push_back(
          MetadataEvent("thread_sort_index", pid, tid, {{"sort_index", tid}}));
    }
    // ts and dur in microseconds, to the nanosecond.
    events->push_back(
        Json{{"name", WireName(op.op())},
             {"cat", "muon"},
             {"ph", "X"},
             {"pid", pid},
             {"tid", tid},
             {"ts", Number((op.start_s() - t0) * 1e6)},
             {"dur", Number(std::max(0.0, op.end_s() - op.start_s()) * 1e6)},
             {"args", Json{{"step", r.step()},
                           {"bucket", op.bucket()},
                           {"bytes", op.bytes()},
                           {"flops", Number(op.flops())}}}});
    ++slices;
  }
  return slices;
}

// `muonctl trace --out FILE`: the kept reports as Chrome trace event JSON
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
// one process per rank (pid = rank, named "rank N"), one thread per stream
// (main, comm, compute), one complete event ("X") per operation; ts and dur
// in microseconds from the earliest operation start of the trace.
int CmdTrace(const TraceFlags& f, std::ostream& out, std::ostream& err) {
  const std::string path = f.out;
  if (path.empty()) {
    err << "muonctl trace: --out FILE is required (- = stdout)\n";
    return 2;
  }
  absl::StatusOr<v1::GetReportsResponse> reports = FetchReports(f.reports, err);
  if (!reports.ok()) return Fail(err, reports.status());

  const double t0 = EarliestStart(*reports);
  Json events = Json::array();
  std::set<int> ranks;
  std::set<std::pair<int, int>> threads;  // (pid, tid) named
  std::set<int64_t> steps;
  int slices = 0;
  for (const v1::StepReport& r : reports->reports()) {
    const int pid = r.rank();
    if (ranks.insert(pid).second) {
      events.push_back(MetadataEvent("process_name", pid, 0,
                                     {{"name", absl::StrCat("rank ", pid)}}));
      events.push_back(
          MetadataEvent("process_sort_index", pid, 0, {{"sort_index", pid}}));
    }
    steps.insert(r.step());
    AddStepAndWaitSpans(r, t0, &threads, &events);
    slices += AddOperationEvents(r, t0, &threads, &events);
  }
  const std::string json =
      Json{{"displayTimeUnit", "ms"},
           {"traceEvents", std::move(events)},
           // ts 0 as seconds since the Unix epoch, to line the trace up
           // with a trainer's own clock (Chrome's trace format keeps
           // otherData as metadata).
           {"otherData", Json{{"t0_unix_s", Number(t0)}}}}
          .dump() +
      "\n";
  if (path == "-") {
    out << json;
    return 0;
  }
  if (absl::Status s = WriteTextFile(path, json); !s.ok()) {
    return Fail(err, s);
  }
  out << absl::StrFormat(
      "wrote %s: %d operations of %d steps on %d ranks (open in "
      "https://ui.perfetto.dev "
      "or chrome://tracing)\n",
      path, slices, steps.size(), ranks.size());
  return 0;
}

// Sets in->traffic: PlanTraffic of in->plan with `spec`'s memory options.
absl::Status AddTraffic(const v1::JobSpec& spec, ReportInput* in) {
  MUON_ASSIGN_OR_RETURN(PlanMemoryOptions memory,
                        SpecMemoryOptions(spec, in->plan.layout));
  MUON_ASSIGN_OR_RETURN(in->traffic, PlanTraffic(in->plan, memory));
  return absl::OkStatus();
}

// The report of a live job: its layout (GetJobSpec) and the plan it runs
// (GetPlan, re-plans included), round-robin of the same layout, and the
// kept step reports. A `given` spec (--spec) must describe the same layout.
absl::Status LiveReportInput(const ReportFlags& f, CoordinationClient& live,
                             const v1::JobSpec* given, ReportInput* in) {
  MUON_ASSIGN_OR_RETURN(v1::JobSpec spec, live.GetJobSpec());
  if (given != nullptr) {
    const std::string difference = DescribeLayoutDifference(*given, spec);
    if (!difference.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--spec ", f.spec, " does not describe the live job \"",
          spec.job_id(), "\": ", difference,
          " (leave out --spec to report the live job as it runs)"));
    }
  }
  MUON_ASSIGN_OR_RETURN(in->plan.layout, LayoutFromSpec(spec));
  MUON_ASSIGN_OR_RETURN(in->plan.plan, live.GetPlan());
  MUON_ASSIGN_OR_RETURN(JobPlan rr, PlanJobSpec(spec, "round_robin"));
  in->round_robin = std::move(rr.plan);
  MUON_ASSIGN_OR_RETURN(v1::GetReportsResponse reports,
                        live.GetReports(/*rank=*/-1, f.reports.last_steps));
  in->reports.assign(reports.reports().begin(), reports.reports().end());
  in->source = absl::StrCat("live job \"", spec.job_id(), "\" at ",
                            f.reports.live.coordinator);
  return AddTraffic(spec, in);
}

// The report of a spec planned offline with --policy, next to round-robin.
absl::Status OfflineReportInput(const ReportFlags& f, const v1::JobSpec& spec,
                                ReportInput* in) {
  MUON_ASSIGN_OR_RETURN(in->plan, PlanJobSpec(spec, f.policy));
  MUON_ASSIGN_OR_RETURN(JobPlan rr, PlanJobSpec(spec, "round_robin"));
  in->round_robin = std::move(rr.plan);
  in->source = f.spec;
  return AddTraffic(spec, in);
}

// `muonctl report (--spec FILE | --coordinator HOST:PORT) --out FILE`: the
// one-page HTML report (tools/report.h). Offline, of the spec's plan next to
// round-robin; live, of the job's own layout and plan with its step
// reports (a --spec given with --coordinator must match the live job).
int CmdReport(const ReportFlags& f, std::ostream& out, std::ostream& err) {
  if (f.spec.empty() && f.reports.live.coordinator.empty()) {
    err << "muonctl report: --spec FILE or --coordinator HOST:PORT is "
           "required\n";
    return 2;
  }
  std::optional<v1::JobSpec> spec;
  if (!f.spec.empty()) {
    absl::StatusOr<v1::JobSpec> loaded = LoadJobSpec(f.spec);
    if (!loaded.ok()) return Fail(err, loaded.status());
    spec = *std::move(loaded);
  }
  ReportInput in;
  if (!f.reports.live.coordinator.empty()) {
    absl::StatusOr<std::unique_ptr<CoordinationClient>> c =
        Connect(f.reports.live, err);
    if (!c.ok()) return Fail(err, c.status());
    absl::Status s = LiveReportInput(f, **c, spec ? &*spec : nullptr, &in);
    if (!s.ok()) return Fail(err, s);
  } else if (absl::Status s = OfflineReportInput(f, *spec, &in); !s.ok()) {
    return Fail(err, s);
  }
  in.lower_bound_flops = LoadLowerBoundFlops(in.plan.plan);
  absl::StatusOr<std::string> html = RenderReportHtml(in);
  if (!html.ok()) return Fail(err, html.status());
  if (absl::Status s = WriteTextFile(f.out, *html); !s.ok()) {
    return Fail(err, s);
  }
  const v1::Plan& plan = in.plan.plan;
  out << absl::StrFormat(
      "wrote %s: %s, plan %s, %d ranks, %d step reports (open it in a "
      "browser; it needs no network)\n",
      f.out, in.source, plan.hash(), plan.world_size(), in.reports.size());
  return 0;
}

// `muonctl spec --safetensors FILE --mesh ... [--rule REGEX=PLACEMENTS]...`:
// a job spec from a Hugging Face checkpoint's header (tools/spec_builder.h),
// to --out or stdout; the tensors left out, and why, on stderr.
int CmdSpec(const SpecFlags& f, std::ostream& out, std::ostream& err) {
  absl::StatusOr<SafetensorsHeader> header =
      ReadSafetensorsHeader(f.safetensors);
  if (!header.ok()) return Fail(err, header.status());
  absl::StatusOr<SpecBuildOptions> options = ParseSpecBuildOptions(
      f.mesh, f.default_placements, f.rules, f.exclude, f.transpose,
      f.job_id.empty() ? "job" : f.job_id, f.expert_stacks);
  if (!options.ok()) {
    err << "muonctl spec: " << options.status().message() << "\n";
    return 2;
  }
  std::vector<SkippedTensor> skipped;
  absl::StatusOr<v1::JobSpec> spec =
      BuildSpec(header->tensors, *options, &skipped);
  if (!spec.ok()) return Fail(err, spec.status());
  for (const SkippedTensor& t : skipped) {
    err << "muonctl spec: skipped " << t.name << ": " << t.reason << "\n";
  }
  const std::string json = JobSpecToJson(*spec);
  if (f.out.empty() || f.out == "-") {
    out << json << "\n";
    return 0;
  }
  if (absl::Status s = WriteTextFile(f.out, json + "\n"); !s.ok()) {
    return Fail(err, s);
  }
  out << absl::StrFormat(
      "wrote %s: %d matrices (%d tensors skipped), mesh %s\n", f.out,
      spec->params_size(), skipped.size(),
      MeshFromProto(spec->mesh()).ToString());
  return 0;
}

// "g0@s1" (gather of bucket 0 into slot 1), "o0", "r0", "a0".
std::string OpToken(const v1::ScheduledOp& op) {
  switch (op.op()) {
    case v1::OP_KIND_GATHER:
      return absl::StrCat("g", op.bucket(), "@s", op.slot());
    case v1::OP_KIND_ORTHOGONALIZE:
      return absl::StrCat("o", op.bucket());
    case v1::OP_KIND_REDISTRIBUTE:
      return absl::StrCat("r", op.bucket());
    case v1::OP_KIND_APPLY:
      return absl::StrCat("a", op.bucket());
    default:
      return absl::StrCat(WireName(op.op()), op.bucket());
  }
}

// `muonctl schedule`: the plan's stream schedule, offline from --spec or
// live from --coordinator.
int CmdSchedule(const ScheduleFlags& f, std::ostream& out, std::ostream& err) {
  v1::Plan plan;
  const std::string path = f.spec;
  if (!path.empty()) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
    if (!spec.ok()) return Fail(err, spec.status());
    absl::StatusOr<JobPlan> p = PlanJobSpec(*spec, f.policy);
    if (!p.ok()) return Fail(err, p.status());
    plan = std::move(p->plan);
  } else if (!f.live.coordinator.empty()) {
    absl::StatusOr<std::unique_ptr<CoordinationClient>> c =
        Connect(f.live, err);
    if (!c.ok()) return Fail(err, c.status());
    absl::StatusOr<v1::Plan> live = (*c)->GetPlan();
    if (!live.ok()) return Fail(err, live.status());
    plan = *std::move(live);
  } else {
    err << "muonctl schedule: --spec FILE or --coordinator HOST:PORT is "
           "required\n";
    return 2;
  }
  if (!plan.has_schedule()) {
    return Fail(err, absl::FailedPreconditionError(absl::StrCat(
                         "plan ", plan.hash(), " has no stream schedule")));
  }
  // The plan's schedule is compact (each rank derives its list): expand it.
  const v1::Schedule s =
      plan.schedule().ranks_size() > 0
          ? plan.schedule()
          : MakeSchedule(plan,
                         plan.schedule().mode() == v1::SCHEDULE_MODE_ASYNC,
                         plan.schedule().prefetch_count());
  if (f.json) {
    out << ToJson(s) << "\n";
    return 0;
  }
  out << absl::StrFormat(
      "schedule of plan %s: mode %s, prefetch %d, %d buffer slot%s, %d "
      "buckets, %d ranks\n",
      plan.hash(), WireName(s.mode()), s.prefetch_count(), s.slots(),
      s.slots() == 1 ? "" : "s", plan.buckets_size(), s.ranks_size());
  out << "g<b>@s<k> = gather bucket b into slot k, o = orthogonalize, r = "
         "redistribute, "
         "a = apply\n";
  for (const v1::RankSchedule& rs : s.ranks()) {
    out << "rank " << rs.rank() << "\n";
    std::vector<v1::StreamKind> streams;  // in order of first appearance
    std::map<v1::StreamKind, std::vector<std::string>> tokens;
    for (const v1::ScheduledOp& op : rs.ops()) {
      if (!tokens.count(op.stream())) streams.push_back(op.stream());
      tokens[op.stream()].push_back(OpToken(op));
    }
    for (v1::StreamKind stream : streams) {
      out << absl::StrFormat("  %-8s %s\n", WireName(stream),
                             absl::StrJoin(tokens[stream], " "));
    }
  }
  return 0;
}

int CmdValidate(const ValidateOptions& f, std::ostream& out,
                std::ostream& err) {
  // --spec (required, existing) and --steps (positive, default 3) are
  // checked by their flags (BindValidate).
  absl::Status s = RunValidate(f, out);
  return s.ok() ? 0 : Fail(err, s);
}

int CmdValidateRank(const ValidateRankFlags& f, std::ostream& out,
                    std::ostream& err) {
  const int rank = f.rank;
  absl::Status s = RunValidateRank(f.validate, rank, f.out_dir, f.port_file);
  if (!s.ok()) {
    err << "muonctl validate: rank " << rank << ": " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}

// `checkpoint inspect DIR`: what a checkpoint holds.
int CmdCheckpoint(const CheckpointFlags& f, std::ostream& out,
                  std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(f.dir);
  if (!reader.ok()) return Fail(err, reader.status());
  (*reader)->Describe(out);
  return 0;
}

// The registrars: each binds its command's flags to the command's struct.

// Refuses a numeric flag's value that is not a finite number ("nan",
// "inf", "1e999"): CLI::PositiveNumber and CLI::NonNegativeNumber compare
// the parsed double, and NaN compares false, so they take "nan" (a NaN
// --interval_s would sleep forever). CLI11 prefixes the flag's name:
// "--interval_s: value \"nan\" is not a finite number".
CLI::Validator FiniteNumber() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const char* begin = value.c_str();
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(begin, &end);
        if (end == begin || *end != '\0' || errno == ERANGE ||
            !std::isfinite(x)) {
          return absl::StrCat("value \"", value, "\" is not a finite number");
        }
        return std::string();
      },
      "FINITE");
}

// --coordinator (required unless `required` is false), --job_id,
// --token_file and --tls_ca_file.
void BindLive(CLI::App* app, LiveFlags& f, bool required = true) {
  CLI::Option* c = app->add_option("--coordinator", f.coordinator,
                                   "host:port of the coordinator");
  if (required) c->required();
  app->add_option("--job_id", f.job_id,
                  "Job id (default: the coordinator's job)");
  app->add_option("--token_file", f.token_file,
                  "File (mode 0600) with the coordinator's read-only token "
                  "or the job secret (default: MUON_JOB_SECRET or "
                  "MUON_JOB_SECRET_FILE)");
  app->add_option("--tls_ca_file", f.tls_ca_file,
                  "PEM CA certificate to verify a TLS coordinator with "
                  "(default: MUON_TLS_CA_FILE; none = plaintext)");
}

void BindJson(CLI::App* app, bool& json) {
  app->add_flag("--json", json,
                "Print JSON (every field, int64 as numbers) instead of a "
                "table");
}

// BindLive (--coordinator required unless `coordinator_required` is false)
// and --last_steps.
void BindReports(CLI::App* app, ReportsFlags& f,
                 bool coordinator_required = true) {
  BindLive(app, f.live, coordinator_required);
  app->add_option("--last_steps", f.last_steps,
                  "Each rank's last N kept steps (0 = all kept)")
      ->check(FiniteNumber())
      ->check(CLI::NonNegativeNumber);
}

// --policy (lpt or round_robin) described by `help`.
CLI::Option* BindPolicy(CLI::App* app, std::string& policy,
                        const std::string& help) {
  return app->add_option("--policy", policy, help)
      ->check(CLI::IsMember({"lpt", "round_robin"}));
}

void BindPlan(CLI::App* app, PlanFlags& f) {
  app->add_option("--spec", f.spec, "Job spec file (JSON, muon.v1.JobSpec)")
      ->required()
      ->check(CLI::ExistingFile);
  BindPolicy(app, f.policy,
             "Assignment policy: lpt or round_robin (default: the spec's, "
             "else lpt)");
  BindJson(app, f.json);
  app->add_flag("--full", f.full,
                "Every matrix and rank (default above 1000 of either: the "
                "first 20 matrices and the 20 most loaded ranks)");
}

void BindAssignments(CLI::App* app, AssignmentsFlags& f) {
  BindLive(app, f.live);
  BindJson(app, f.json);
}

void BindStatus(CLI::App* app, StatusFlags& f) {
  BindLive(app, f.live);
  BindJson(app, f.json);
  CLI::Option* watch =
      app->add_flag("--watch", f.watch, "Refresh every --interval_s");
  app->add_option("--interval_s", f.interval_s,
                  "Seconds between refreshes (--watch)")
      ->needs(watch)
      ->check(FiniteNumber())
      ->check(CLI::PositiveNumber);
  app->add_option("--count", f.count,
                  "Refreshes (--watch; 0 = until interrupted)")
      ->needs(watch)
      ->check(FiniteNumber())
      ->check(CLI::NonNegativeNumber);
}

void BindTimings(CLI::App* app, TimingsFlags& f) {
  BindReports(app, f.reports);
  BindJson(app, f.json);
}

void BindTrace(CLI::App* app, TraceFlags& f) {
  BindReports(app, f.reports);
  app->add_option("--out", f.out,
                  "Output file (Chrome trace event JSON; - = stdout)")
      ->required();
}

void BindSchedule(CLI::App* app, ScheduleFlags& f) {
  CLI::Option* spec =
      app->add_option("--spec", f.spec, "Job spec file (offline)")
          ->check(CLI::ExistingFile);
  BindLive(app, f.live, /*required=*/false);
  app->get_option("--coordinator")->excludes(spec);
  BindPolicy(app, f.policy, "Assignment policy (with --spec)")->needs(spec);
  // Neither --spec nor --coordinator: CmdSchedule refuses it (exit 2).
  BindJson(app, f.json);
}

void BindValidate(CLI::App* app, ValidateOptions& f) {
  app->add_option("--spec", f.spec_path, "Job spec file")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--steps", f.steps, "Optimizer steps")
      ->check(FiniteNumber())
      ->check(CLI::PositiveNumber);
  app->add_option("--init", f.init_dir, "Initial parameters DIR/<param>.npy")
      ->check(CLI::ExistingDirectory);
  app->add_option("--grads", f.grads_dir, "Gradients DIR/<step>/<param>.npy")
      ->check(CLI::ExistingDirectory);
  app->add_option("--dump", f.dump_dir, "Write the final parameters under DIR");
  app->add_option("--seed", f.seed, "Seed of the synthetic values");
  app->add_option("--coordinator", f.coordinator,
                  "Use this daemon instead of one embedded in rank 0");
  app->add_option("--tolerance", f.tolerance,
                  "Accepted max abs difference (0 = bitwise)")
      ->check(FiniteNumber())
      ->check(CLI::NonNegativeNumber);
  app->add_option("--timeout_s", f.timeout_s,
                  "Bound on the distributed run, seconds")
      ->check(FiniteNumber())
      ->check(CLI::PositiveNumber);
  app->add_option("--checkpoint_at", f.checkpoint_at,
                  "Save a checkpoint after step J, resume it in fresh rank "
                  "processes and continue to --steps (0 = none)")
      ->check(FiniteNumber())
      ->check(CLI::NonNegativeNumber);
  app->add_option("--resume_spec", f.resume_spec_path,
                  "Job spec of the resumed run (--checkpoint_at)")
      ->check(CLI::ExistingFile);
}

void BindValidateRank(CLI::App* app, ValidateRankFlags& f) {
  BindValidate(app, f.validate);
  app->add_option("--rank", f.rank)->required();
  app->add_option("--out_dir", f.out_dir)->required();
  app->add_option("--port_file", f.port_file);
  app->add_option("--phase_from", f.validate.phase_from);
  app->add_option("--phase_to", f.validate.phase_to);
  app->add_option("--load_dir", f.validate.load_dir);
  app->add_option("--save_dir", f.validate.save_dir);
}

void BindReport(CLI::App* app, ReportFlags& f) {
  app->add_option("--spec", f.spec,
                  "Job spec file: the report of its plan (offline); with "
                  "--coordinator it must describe the live job")
      ->check(CLI::ExistingFile);
  BindPolicy(app, f.policy,
             "Assignment policy shown next to round-robin (offline; "
             "default: the spec's, else lpt)");
  BindReports(app, f.reports, /*coordinator_required=*/false);
  app->get_option("--policy")->excludes("--coordinator");
  // Neither --spec nor --coordinator: CmdReport refuses it (exit 2).
  app->add_option("--out", f.out, "Output HTML file")->required();
}

void BindSpec(CLI::App* app, SpecFlags& f) {
  app->add_option("--safetensors", f.safetensors,
                  "A Hugging Face .safetensors file (only its header is read)")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--mesh", f.mesh,
                  "Mesh dims in order, e.g. dp_shard=8,tp=8 (empty: one "
                  "device)");
  app->add_option("--default_placements", f.default_placements,
                  "Every matrix's placements: one per dim "
                  "(Shard(0),Replicate()) or dim:placement items "
                  "(default: Shard(0) on dp_shard, Replicate() elsewhere)");
  app->add_option("--rule", f.rules,
                  "REGEX=PLACEMENTS, repeatable, first match wins, e.g. "
                  "'o_proj|down_proj=tp:Shard(1)'. Split at the first '=' "
                  "followed by a valid placement list, so either side may "
                  "hold '=': 'a(?=b)=tp:Shard(1)', "
                  "'w=_StridedShard(dim=0, sf=8),Shard(0)'");
  app->add_option("--exclude", f.exclude,
                  "REGEX of tensors that are not Muon matrices, repeatable "
                  "(replaces the defaults: embed, wte, wpe, lm_head, norm, "
                  "ln_)");
  app->add_option("--transpose", f.transpose,
                  "REGEX of tensors stored [in, out] (GPT-2's Conv1D: "
                  "c_attn|c_proj|c_fc): the spec holds [out, in]");
  app->add_flag("--expert_stacks", f.expert_stacks,
                "Take 3-D tensors as expert stacks [experts, rows, cols]");
  app->add_option("--job_id", f.job_id, "The spec's job id (default: job)");
  app->add_option("--out", f.out, "Output file (default: stdout)");
}

void BindCheckpoint(CLI::App* app, CheckpointFlags& f) {
  CLI::App* inspect = app->add_subcommand(
      "inspect",
      "Format version, step, mesh, plan hash and per tensor its shape, "
      "placements and per-rank boxes");
  inspect->add_option("DIR", f.dir, "Checkpoint directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  app->require_subcommand(1);
}

// A command registered on the app: its subcommand, and its run with the
// flags its registrar bound (owned by the closure).
struct BoundCommand {
  const char* name;
  const char* help;  // empty: hidden
  CLI::App* app;
  std::function<int(std::ostream&, std::ostream&)> run;
};

// Adds command `name` to `app` with flags of type F, bound by `bind` and
// passed to `run` once parsed.
template <typename F>
void AddCommand(CLI::App& app, const char* name, const char* help,
                void (*bind)(CLI::App*, F&),
                int (*run)(const F&, std::ostream&, std::ostream&),
                std::vector<BoundCommand>* commands) {
  auto flags = std::make_shared<F>();
  CLI::App* sub = app.add_subcommand(name, help);
  if (*help == '\0') sub->group("");  // hidden
  bind(sub, *flags);
  commands->push_back(
      {name, help, sub, [flags, run](std::ostream& out, std::ostream& err) {
         return run(*flags, out, err);
       }});
}

// Every command, in the order `muonctl --help` lists them.
std::vector<BoundCommand> AddCommands(CLI::App& app) {
  std::vector<BoundCommand> c;
  AddCommand(app, "plan",
             "Plan a job spec offline: owners, buckets, Newton-Schulz cost, "
             "per-rank load, bytes and buffer memory",
             BindPlan, CmdPlan, &c);
  AddCommand(app, "assignments",
             "Matrices each rank of a live job orthogonalizes", BindAssignments,
             CmdAssignments, &c);
  AddCommand(app, "status",
             "Job state and per-rank health, step time, stragglers (exit 1 "
             "when a rank is lost or failed)",
             BindStatus, CmdStatus, &c);
  AddCommand(app, "timings",
             "Per rank and operation: count, p50 and p99 duration", BindTimings,
             CmdTimings, &c);
  AddCommand(app, "trace",
             "The kept step reports as a Chrome trace (Perfetto, "
             "chrome://tracing)",
             BindTrace, CmdTrace, &c);
  AddCommand(app, "schedule",
             "The plan's stream schedule per rank (offline with --spec, or "
             "live)",
             BindSchedule, CmdSchedule, &c);
  AddCommand(app, "validate",
             "Run a spec distributed (optionally checkpointed, resumed, "
             "resharded) and compare with one device",
             BindValidate, CmdValidate, &c);
  AddCommand(app, "report",
             "One self-contained HTML page of a spec's plan (--spec) or a "
             "live job's (--coordinator): per-rank load vs round-robin, "
             "bytes, step times and the step timeline",
             BindReport, CmdReport, &c);
  AddCommand(app, "spec",
             "Build a job spec from a .safetensors checkpoint's header, a "
             "mesh and placement rules",
             BindSpec, CmdSpec, &c);
  AddCommand(app, "checkpoint", "Inspect a checkpoint directory",
             BindCheckpoint, CmdCheckpoint, &c);
  AddCommand(app, "validate-rank", "", BindValidateRank, CmdValidateRank, &c);
  return c;
}

}  // namespace

absl::StatusOr<JobPlan> PlanJobSpec(const v1::JobSpec& spec,
                                    const std::string& policy) {
  v1::JobSpec job = spec;
  if (!policy.empty()) job.mutable_execution()->set_assignment_policy(policy);
  return PlanJobFromSpec(job);
}

int RunMuonctl(const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err) {
  CLI::App app("muonctl: plan a Muon job offline and inspect a live one",
               "muonctl");
  app.require_subcommand(0, 1);
  app.set_help_all_flag("--help-all", "Every command's flags");
  app.footer(
      "Exit codes: 0 ok, 1 runtime error (or, for status, a lost or failed "
      "rank), 2 usage error.\nRun `muonctl help COMMAND` or `muonctl "
      "COMMAND --help` for a command's flags.");
  const std::vector<BoundCommand> commands = AddCommands(app);
  std::string help_topic;
  CLI::App* help = app.add_subcommand("help", "Help on a command");
  help->add_option("COMMAND", help_topic, "The command");
  const std::string top_help = app.help();  // before a subcommand is parsed
  // CLI11 parses a reversed argument vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    return code == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    err << "muonctl: " << e.what() << "\n";
    return 1;
  }
  if (help->parsed()) {
    if (help_topic.empty()) {
      out << top_help;
      return 0;
    }
    for (const BoundCommand& c : commands) {
      if (help_topic == c.name && *c.help != '\0') {
        out << c.app->help("muonctl");
        return 0;
      }
    }
    err << "muonctl help: unknown command \"" << help_topic << "\"\n";
    return 2;
  }
  for (const BoundCommand& c : commands) {
    if (!c.app->parsed()) continue;
    // No exception escapes (e.g. std::bad_alloc, or a library's
    // std::length_error): it is reported as a runtime error.
    try {
      return c.run(out, err);
    } catch (const std::exception& e) {
      err << "muonctl " << c.name << ": " << e.what() << "\n";
      return 1;
    }
  }
  err << top_help;
  return 2;
}

}  // namespace muon
