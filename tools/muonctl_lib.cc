#include "tools/muonctl_lib.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/checkpoint.h"
#include "client/grpc_coordination_client.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "coordination/credentials.h"
#include "google/protobuf/util/json_util.h"
#include "plan/manifest_validation.h"
#include "plan/plan_job.h"
#include "plan/schedule.h"
#include "tools/validate.h"

ABSL_FLAG(std::string, spec, "", "Job spec file (JSON, muon.v1.JobSpec).");
ABSL_FLAG(bool, json, false,
          "Print JSON (protobuf's JSON mapping) instead of a table.");
ABSL_FLAG(std::string, policy, "",
          "Assignment policy for `plan`: lpt or round_robin (default: the "
          "spec's, else lpt).");
ABSL_FLAG(std::string, coordinator, "",
          "host:port of the coordinator (live commands; for validate: use "
          "this daemon instead of one embedded in rank 0).");
ABSL_FLAG(std::string, job_id, "", "Job id (empty = the coordinator's job).");
ABSL_FLAG(std::string, token_file, "",
          "File (mode 0600) with the coordinator's read-only token or the job "
          "secret; default: MUON_JOB_SECRET or MUON_JOB_SECRET_FILE.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificate to verify a TLS coordinator with (default: "
          "MUON_TLS_CA_FILE); empty = plaintext.");
ABSL_FLAG(int, steps, 3, "validate: optimizer steps.");
ABSL_FLAG(std::string, init, "",
          "validate: initial parameters DIR/<param>.npy.");
ABSL_FLAG(std::string, grads, "",
          "validate: gradients DIR/<step>/<param>.npy.");
ABSL_FLAG(std::string, dump, "", "validate: write final parameters under DIR.");
ABSL_FLAG(uint64_t, seed, 0, "validate: seed of the synthetic values.");
ABSL_FLAG(double, tolerance, 0.0,
          "validate: accepted max abs difference (0 = bitwise).");
ABSL_FLAG(int, timeout_s, 600,
          "validate: bound on the distributed run, seconds.");
ABSL_FLAG(int, checkpoint_at, 0,
          "validate: save a checkpoint after step J, resume it in fresh rank "
          "processes and continue to --steps (0 = no checkpoint).");
ABSL_FLAG(std::string, resume_spec, "",
          "validate --checkpoint_at: job spec of the resumed run (another "
          "layout or world size; same parameters).");
ABSL_FLAG(bool, watch, false,
          "status: refresh the table every --interval_s seconds.");
ABSL_FLAG(double, interval_s, 1.0,
          "status --watch: seconds between refreshes.");
ABSL_FLAG(int, count, 0,
          "status --watch: number of refreshes (0 = until interrupted).");
ABSL_FLAG(int, last_steps, 0,
          "timings, trace: use each rank's last N kept steps (0 = all the "
          "coordinator keeps).");
ABSL_FLAG(std::string, out, "",
          "trace: output file (Chrome trace event JSON; - = stdout).");
// Internal (validate-rank).
ABSL_FLAG(int, rank, -1, "Internal: rank of a validate-rank process.");
ABSL_FLAG(std::string, out_dir, "", "Internal: validate-rank output folder.");
ABSL_FLAG(std::string, port_file, "",
          "Internal: rank 0 writes its coordinator port here.");
ABSL_FLAG(int64_t, phase_from, 0, "Internal: validate-rank's first step.");
ABSL_FLAG(int64_t, phase_to, -1, "Internal: validate-rank's end step.");
ABSL_FLAG(std::string, load_dir, "",
          "Internal: validate-rank resumes from this checkpoint.");
ABSL_FLAG(std::string, save_dir, "",
          "Internal: validate-rank saves a checkpoint here.");

namespace muon {
namespace {

std::string Shape(int64_t r, int64_t c) {
  return absl::StrCat("[", r, ", ", c, "]");
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return s;
}

int Fail(std::ostream& err, const absl::Status& s) {
  err << "muonctl: " << s.ToString() << "\n";
  return 1;
}

int CmdPlan(const std::vector<std::string>&, std::ostream& out,
            std::ostream& err) {
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    err << "muonctl plan: --spec FILE is required\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
  if (!spec.ok()) return Fail(err, spec.status());
  absl::StatusOr<JobPlan> p = PlanJobSpec(*spec, absl::GetFlag(FLAGS_policy));
  if (!p.ok()) return Fail(err, p.status());
  if (absl::GetFlag(FLAGS_json)) {
    out << ToJson(p->plan) << "\n";
    return 0;
  }
  const v1::Plan& plan = p->plan;
  out << absl::StrFormat(
      "plan %s: %d matrices over %d ranks (mesh %s), policy %s, %d buckets\n",
      plan.hash(), plan.matrices_size(), plan.world_size(),
      p->layout.mesh.ToString(), plan.policy(), plan.buckets_size());
  // Local shapes: the distinct non-empty boxes of the matrix, then how many
  // ranks hold part of it (ranks outside a pp/ep sub-mesh, holding other
  // experts, or with an empty torch.chunk shard hold none).
  int name_width = 36;
  for (const MatrixLayout& ml : p->layout.matrices) {
    name_width = std::max(name_width, static_cast<int>(ml.name.size()));
  }
  out << absl::StrFormat("%-*s %5s %6s %-14s %-28s %10s\n", name_width,
                         "matrix", "owner", "bucket", "global shape",
                         "local shapes (holders)", "NS GFLOP");
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
    out << absl::StrFormat("%-*s %5d %6d %-14s %-28s %10.4g\n", name_width,
                           ml.name, m.owner(), m.bucket(),
                           Shape(m.rows(), m.cols()),
                           absl::StrCat(absl::StrJoin(locals, " "), " (",
                                        holders, "/", ml.boxes.size(), ")"),
                           m.ns_flops() / 1e9);
  }
  out << absl::StrFormat("%-6s %9s %10s\n", "rank", "matrices", "NS GFLOP");
  for (const v1::RankLoad& l : plan.loads()) {
    out << absl::StrFormat("%-6d %9d %10.4g\n", l.rank(), l.matrices(),
                           l.ns_flops() / 1e9);
  }
  // Both policies side by side.
  for (const char* policy : {"lpt", "round_robin"}) {
    absl::StatusOr<JobPlan> q = PlanJobSpec(*spec, policy);
    if (!q.ok()) return Fail(err, q.status());
    const double mean = q->plan.mean_load_flops();
    const double bound = LoadLowerBoundFlops(q->plan);
    out << absl::StrFormat(
        "policy %-11s max load %.4g GFLOP, mean %.4g GFLOP, max/mean %.3f, "
        "lower bound %.4g GFLOP, max/bound %.3f\n",
        policy, q->plan.max_load_flops() / 1e9, mean / 1e9,
        mean > 0 ? q->plan.max_load_flops() / mean : 0.0, bound / 1e9,
        bound > 0 ? q->plan.max_load_flops() / bound : 0.0);
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<CoordinationClient>> Connect(std::ostream& err) {
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty()) {
    return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  }
  GrpcClientSecurity security;
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (!token_file.empty()) {
    MUON_ASSIGN_OR_RETURN(security.token, ReadSecretFile(token_file));
  } else {
    MUON_ASSIGN_OR_RETURN(security.token, JobSecretFromEnv());
  }
  security.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  if (security.tls_ca_file.empty()) {
    const char* ca = std::getenv("MUON_TLS_CA_FILE");
    if (ca != nullptr) security.tls_ca_file = ca;
  }
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<GrpcCoordinationClient> c,
      GrpcCoordinationClient::Create(address, absl::GetFlag(FLAGS_job_id),
                                     absl::Seconds(5), security));
  return std::unique_ptr<CoordinationClient>(std::move(c));
}

int CmdAssignments(const std::vector<std::string>&, std::ostream& out,
                   std::ostream& err) {
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

// One status snapshot: the job line and a table per rank (or one JSON
// object with --json).
absl::Status PrintStatus(CoordinationClient& c, std::ostream& out) {
  MUON_ASSIGN_OR_RETURN(v1::JobInfo job, c.GetJob());
  MUON_ASSIGN_OR_RETURN(v1::ListRanksResponse ranks, c.ListRanks());
  if (absl::GetFlag(FLAGS_json)) {
    out << "{\"job\": " << ToJson(job) << ",\n\"ranks\": " << ToJson(ranks)
        << "}\n";
    return absl::OkStatus();
  }
  out << absl::StrFormat(
      "job %s: %s, %d/%d ranks joined, plan %s%s\n", job.job_id(), job.state(),
      job.ranks_joined(), job.world_size(),
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
        "%-6d %-9s %13s %8s %12s %9s %9d %9d\n", r.rank(), r.state(), age,
        reported ? absl::StrCat(r.last_step()) : "-",
        reported ? absl::StrFormat("%.1f ms", r.last_step_time_s() * 1e3) : "-",
        r.straggler() ? "yes" : "", r.reports_dropped(),
        r.matrices_orthogonalized());
  }
  return absl::OkStatus();
}

int CmdStatus(const std::vector<std::string>&, std::ostream& out,
              std::ostream& err) {
  absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(err);
  if (!c.ok()) return Fail(err, c.status());
  if (!absl::GetFlag(FLAGS_watch)) {
    absl::Status s = PrintStatus(**c, out);
    return s.ok() ? 0 : Fail(err, s);
  }
  const double interval_s = absl::GetFlag(FLAGS_interval_s);
  const int count = absl::GetFlag(FLAGS_count);
  if (!(interval_s > 0) || count < 0) {
    err << "muonctl status --watch: --interval_s must be > 0 and --count >= "
           "0\n";
    return 2;
  }
  // Like watch(1): a failed refresh is reported and the next one tried; the
  // exit code is the last refresh's.
  int rc = 0;
  for (int i = 0; count == 0 || i < count; ++i) {
    if (i > 0) absl::SleepFor(absl::Seconds(interval_s));
    if (!absl::GetFlag(FLAGS_json)) {
      out << absl::StrFormat(
          "--- %s ---\n", absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::Now(),
                                           absl::LocalTimeZone()));
    }
    absl::Status s = PrintStatus(**c, out);
    rc = s.ok() ? 0 : Fail(err, s);
    out.flush();
  }
  return rc;
}

// Display order of the operations of a step; others after, by name.
int OpOrder(const std::string& op) {
  static const char* const kOps[] = {"gather", "orthogonalize", "redistribute",
                                     "apply"};
  for (int i = 0; i < 4; ++i) {
    if (op == kOps[i]) return i;
  }
  return 4;
}

bool OpLess(const std::string& a, const std::string& b) {
  return std::make_pair(OpOrder(a), a) < std::make_pair(OpOrder(b), b);
}

// Nearest-rank percentile of sorted values: the ceil(p/100 * n)-th smallest.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double n = static_cast<double>(sorted.size());
  int64_t k = static_cast<int64_t>(std::ceil(p / 100.0 * n)) - 1;
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(sorted.size()) - 1);
  return sorted[k];
}

// A JSON string literal: quotes, backslashes and control characters
// escaped (RFC 8259 section 7); other bytes (UTF-8) kept.
std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += ch;
        }
    }
  }
  out += "\"";
  return out;
}

// A JSON number: `decimals` >= 0 prints fixed-point with that many
// decimals, else 15 significant digits; NaN and infinities (not JSON
// numbers) print as null.
std::string JsonNumber(double x, int decimals = -1) {
  if (!std::isfinite(x)) return "null";
  return decimals >= 0 ? absl::StrFormat("%.*f", decimals, x)
                       : absl::StrFormat("%.15g", x);
}

// One JSON object, keys in the order they are added (so output is stable
// and readable: protobuf's Struct printer orders keys by hash).
class JsonObject {
 public:
  JsonObject& Raw(absl::string_view key, absl::string_view json) {
    absl::StrAppend(&text_, text_.empty() ? "{" : ",", JsonString(key), ":",
                    json);
    return *this;
  }
  JsonObject& Str(absl::string_view key, absl::string_view value) {
    return Raw(key, JsonString(value));
  }
  JsonObject& Int(absl::string_view key, int64_t value) {
    return Raw(key, absl::StrCat(value));
  }
  JsonObject& Num(absl::string_view key, double value, int decimals = -1) {
    return Raw(key, JsonNumber(value, decimals));
  }
  std::string Build() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  std::string text_;
};

absl::StatusOr<v1::GetReportsResponse> FetchReports(std::ostream& err) {
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CoordinationClient> c, Connect(err));
  const int last_steps = absl::GetFlag(FLAGS_last_steps);
  if (last_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--last_steps is ", last_steps, "; must be >= 0"));
  }
  return c->GetReports(/*rank=*/-1, last_steps);
}

// `muonctl timings`: per rank and operation, the count and the p50 / p99 of
// the operation's duration (end - start) over the kept reports; "step" is
// the whole step (StepReport.step_time_s).
int CmdTimings(const std::vector<std::string>&, std::ostream& out,
               std::ostream& err) {
  absl::StatusOr<v1::GetReportsResponse> reports = FetchReports(err);
  if (!reports.ok()) return Fail(err, reports.status());
  // rank -> op -> durations in ms.
  std::map<int, std::map<std::string, std::vector<double>>> ms;
  for (const v1::StepReport& r : reports->reports()) {
    for (const v1::OpTiming& op : r.ops()) {
      ms[r.rank()][op.op()].push_back((op.end_s() - op.start_s()) * 1e3);
    }
    ms[r.rank()]["step"].push_back(r.step_time_s() * 1e3);
  }
  struct Row {
    int rank;
    std::string op;
    size_t count;
    double p50, p99;
  };
  std::vector<Row> rows;
  for (auto& [rank, ops] : ms) {
    std::vector<std::string> names;
    for (const auto& [name, v] : ops) {
      if (name != "step") names.push_back(name);
    }
    std::sort(names.begin(), names.end(), OpLess);
    names.push_back("step");
    for (const std::string& name : names) {
      std::vector<double>& v = ops[name];
      std::sort(v.begin(), v.end());
      rows.push_back(
          {rank, name, v.size(), Percentile(v, 50), Percentile(v, 99)});
    }
  }
  if (absl::GetFlag(FLAGS_json)) {
    // {"reports": N, "timings": [{"rank", "op", "count", "p50_ms", "p99_ms"}]}
    out << "{\"reports\": " << reports->reports_size() << ", \"timings\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      out << JsonObject()
                 .Int("rank", row.rank)
                 .Str("op", row.op)
                 .Int("count", static_cast<int64_t>(row.count))
                 .Num("p50_ms", row.p50, 6)
                 .Num("p99_ms", row.p99, 6)
                 .Build()
          << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    out << "]}\n";
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

// Track (tid) of a stream: main 1, comm 2, compute 3, others 4, 5, ... in
// order of first appearance.
int StreamTid(const std::string& stream, std::map<std::string, int>& others) {
  if (stream.empty() || stream == "main") return 1;
  if (stream == "comm") return 2;
  if (stream == "compute") return 3;
  auto it = others.find(stream);
  if (it != others.end()) return it->second;
  const int tid = 4 + static_cast<int>(others.size());
  others[stream] = tid;
  return tid;
}

// A metadata ("M") event naming or ordering a process or thread.
std::string MetadataEvent(const std::string& name, int pid, int tid,
                          const std::string& arg_json) {
  return JsonObject()
      .Str("name", name)
      .Str("ph", "M")
      .Int("pid", pid)
      .Int("tid", tid)
      .Raw("args", arg_json)
      .Build();
}

// `muonctl trace --out FILE`: the kept reports as Chrome trace event JSON
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU):
// one process per rank (pid = rank, named "rank N"), one thread per stream
// (main, comm, compute), one complete event ("X") per operation; ts and dur
// in microseconds from the earliest operation start of the trace.
int CmdTrace(const std::vector<std::string>&, std::ostream& out,
             std::ostream& err) {
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    err << "muonctl trace: --out FILE is required (- = stdout)\n";
    return 2;
  }
  absl::StatusOr<v1::GetReportsResponse> reports = FetchReports(err);
  if (!reports.ok()) return Fail(err, reports.status());

  double t0 = 0;
  bool any = false;
  for (const v1::StepReport& r : reports->reports()) {
    for (const v1::OpTiming& op : r.ops()) {
      if (!any || op.start_s() < t0) t0 = op.start_s();
      any = true;
    }
  }
  std::vector<std::string> events;
  std::map<std::string, int> other_streams;
  std::set<int> ranks;
  std::set<std::pair<int, int>> threads;  // (pid, tid) named
  std::set<int64_t> steps;
  int slices = 0;
  for (const v1::StepReport& r : reports->reports()) {
    const int pid = r.rank();
    if (ranks.insert(pid).second) {
      events.push_back(MetadataEvent(
          "process_name", pid, 0,
          JsonObject().Str("name", absl::StrCat("rank ", pid)).Build()));
      events.push_back(
          MetadataEvent("process_sort_index", pid, 0,
                        JsonObject().Int("sort_index", pid).Build()));
    }
    steps.insert(r.step());
    for (const v1::OpTiming& op : r.ops()) {
      const std::string stream = op.stream().empty() ? "main" : op.stream();
      const int tid = StreamTid(stream, other_streams);
      if (threads.insert({pid, tid}).second) {
        events.push_back(MetadataEvent(
            "thread_name", pid, tid, JsonObject().Str("name", stream).Build()));
        events.push_back(
            MetadataEvent("thread_sort_index", pid, tid,
                          JsonObject().Int("sort_index", tid).Build()));
      }
      // ts and dur in microseconds, to the nanosecond.
      events.push_back(
          JsonObject()
              .Str("name", op.op())
              .Str("cat", "muon")
              .Str("ph", "X")
              .Int("pid", pid)
              .Int("tid", tid)
              .Num("ts", (op.start_s() - t0) * 1e6, 3)
              .Num("dur", std::max(0.0, op.end_s() - op.start_s()) * 1e6, 3)
              .Raw("args", JsonObject()
                               .Int("step", r.step())
                               .Int("bucket", op.bucket())
                               .Int("bytes", op.bytes())
                               .Num("flops", op.flops())
                               .Build())
              .Build());
      ++slices;
    }
  }
  // One event per line: readable, and still one JSON document.
  std::string json = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) {
    absl::StrAppend(&json, events[i], i + 1 < events.size() ? ",\n" : "\n");
  }
  json += "]}\n";
  if (path == "-") {
    out << json;
    return 0;
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << json;
  file.close();
  if (!file) {
    return Fail(err, absl::UnavailableError(
                         absl::StrCat("cannot write \"", path, "\"")));
  }
  out << absl::StrFormat(
      "wrote %s: %d operations of %d steps on %d ranks (open in "
      "https://ui.perfetto.dev "
      "or chrome://tracing)\n",
      path, slices, steps.size(), ranks.size());
  return 0;
}

// "g0@s1" (gather of bucket 0 into slot 1), "o0", "r0", "a0".
std::string OpToken(const v1::ScheduledOp& op) {
  if (op.op() == "gather")
    return absl::StrCat("g", op.bucket(), "@s", op.slot());
  if (op.op() == "orthogonalize") return absl::StrCat("o", op.bucket());
  if (op.op() == "redistribute") return absl::StrCat("r", op.bucket());
  if (op.op() == "apply") return absl::StrCat("a", op.bucket());
  return absl::StrCat(op.op(), op.bucket());
}

// `muonctl schedule`: the plan's stream schedule, offline from --spec or
// live from --coordinator.
int CmdSchedule(const std::vector<std::string>&, std::ostream& out,
                std::ostream& err) {
  v1::Plan plan;
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (!path.empty()) {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
    if (!spec.ok()) return Fail(err, spec.status());
    absl::StatusOr<JobPlan> p = PlanJobSpec(*spec, absl::GetFlag(FLAGS_policy));
    if (!p.ok()) return Fail(err, p.status());
    plan = std::move(p->plan);
  } else if (!absl::GetFlag(FLAGS_coordinator).empty()) {
    absl::StatusOr<std::unique_ptr<CoordinationClient>> c = Connect(err);
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
          : MakeSchedule(plan, plan.schedule().mode() == "async",
                         plan.schedule().prefetch_count());
  if (absl::GetFlag(FLAGS_json)) {
    out << ToJson(s) << "\n";
    return 0;
  }
  out << absl::StrFormat(
      "schedule of plan %s: mode %s, prefetch %d, %d buffer slot%s, %d "
      "buckets, %d ranks\n",
      plan.hash(), s.mode(), s.prefetch_count(), s.slots(),
      s.slots() == 1 ? "" : "s", plan.buckets_size(), s.ranks_size());
  out << "g<b>@s<k> = gather bucket b into slot k, o = orthogonalize, r = "
         "redistribute, "
         "a = apply\n";
  for (const v1::RankSchedule& rs : s.ranks()) {
    out << "rank " << rs.rank() << "\n";
    std::vector<std::string> streams;  // in order of first appearance
    std::map<std::string, std::vector<std::string>> tokens;
    for (const v1::ScheduledOp& op : rs.ops()) {
      if (!tokens.count(op.stream())) streams.push_back(op.stream());
      tokens[op.stream()].push_back(OpToken(op));
    }
    for (const std::string& stream : streams) {
      out << absl::StrFormat("  %-8s %s\n", stream,
                             absl::StrJoin(tokens[stream], " "));
    }
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
  o.checkpoint_at = absl::GetFlag(FLAGS_checkpoint_at);
  o.resume_spec_path = absl::GetFlag(FLAGS_resume_spec);
  o.phase_from = absl::GetFlag(FLAGS_phase_from);
  o.phase_to = absl::GetFlag(FLAGS_phase_to);
  o.load_dir = absl::GetFlag(FLAGS_load_dir);
  o.save_dir = absl::GetFlag(FLAGS_save_dir);
  return o;
}

int CmdValidate(const std::vector<std::string>&, std::ostream& out,
                std::ostream& err) {
  ValidateOptions o = ValidateFlags();
  if (o.spec_path.empty() || o.steps < 1) {
    err << "muonctl validate: --spec FILE and --steps K >= 1 are required\n";
    return 2;
  }
  absl::Status s = RunValidate(o, out);
  return s.ok() ? 0 : Fail(err, s);
}

int CmdValidateRank(const std::vector<std::string>&, std::ostream& out,
                    std::ostream& err) {
  const int rank = absl::GetFlag(FLAGS_rank);
  absl::Status s =
      RunValidateRank(ValidateFlags(), rank, absl::GetFlag(FLAGS_out_dir),
                      absl::GetFlag(FLAGS_port_file));
  if (!s.ok()) {
    err << "muonctl validate: rank " << rank << ": " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}

// `checkpoint inspect DIR`: what a checkpoint holds.
int CmdCheckpoint(const std::vector<std::string>& args, std::ostream& out,
                  std::ostream& err) {
  if (args.size() != 3 || args[1] != "inspect") {
    err << "usage: muonctl checkpoint inspect DIR\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(args[2]);
  if (!reader.ok()) return Fail(err, reader.status());
  (*reader)->Describe(out);
  return 0;
}

struct Command {
  const char* name;
  int (*fn)(const std::vector<std::string>&, std::ostream&, std::ostream&);
  const char* help;
  bool hidden;
};

constexpr Command kCommands[] = {
    {"plan", CmdPlan,
     "plan --spec FILE [--policy lpt|round_robin] [--json]: owners, shapes, NS "
     "cost, loads",
     false},
    {"assignments", CmdAssignments,
     "assignments --coordinator HOST:PORT [--json]: matrices per rank of a "
     "live job",
     false},
    {"status", CmdStatus,
     "status --coordinator HOST:PORT [--json] [--watch [--interval_s S] "
     "[--count N]]: job state and per-rank health, step time, stragglers",
     false},
    {"timings", CmdTimings,
     "timings --coordinator HOST:PORT [--last_steps N] [--json]: per rank and "
     "operation, count and p50/p99 duration",
     false},
    {"trace", CmdTrace,
     "trace --coordinator HOST:PORT --out FILE [--last_steps N]: Chrome trace "
     "event JSON (Perfetto, chrome://tracing)",
     false},
    {"schedule", CmdSchedule,
     "schedule (--spec FILE [--policy P] | --coordinator HOST:PORT) [--json]: "
     "the plan's stream schedule per rank",
     false},
    {"validate", CmdValidate,
     "validate --spec FILE --steps K [--init DIR] [--grads DIR] [--dump DIR] "
     "[--checkpoint_at J [--resume_spec FILE]]: distributed (optionally "
     "checkpointed, resumed and resharded) vs uninterrupted single-device",
     false},
    {"checkpoint", CmdCheckpoint,
     "checkpoint inspect DIR: format version, step, mesh, plan hash and per "
     "tensor its shape, placements and per-rank boxes",
     false},
    {"validate-rank", CmdValidateRank, "", true},
};

}  // namespace

absl::StatusOr<JobPlan> PlanJobSpec(const v1::JobSpec& spec,
                                    const std::string& policy) {
  v1::JobSpec job = spec;
  if (!policy.empty()) job.mutable_execution()->set_assignment_policy(policy);
  return PlanJobFromSpec(job);
}

int RunMuonctl(const std::vector<std::string>& args, std::ostream& out,
               std::ostream& err) {
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
