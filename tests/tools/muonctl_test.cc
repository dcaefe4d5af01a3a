// Tests of muonctl's live commands (tools/muonctl_lib.h) against an
// in-process CoordinatorServer on 127.0.0.1:0 fed with synthetic step
// reports: status (and --watch), timings, trace (parsed back as JSON), and
// schedule (live and offline from a spec). Also offline: usage errors (a
// missing source, non-finite numbers), spec files that are not regular or
// too large, and RenderReportHtml on malformed plans.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "plan/schedule.h"
#include "server/coordinator_server.h"
#include "tests/common/safetensors_test_util.h"
#include "tests/status_matchers.h"
#include "tools/muonctl_lib.h"
#include "tools/report.h"

namespace muon {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kRanks = 4;
constexpr int kSteps = 3;
constexpr int kBuckets = 2;
constexpr v1::OpKind kOps[] = {v1::OP_KIND_GATHER, v1::OP_KIND_ORTHOGONALIZE,
                               v1::OP_KIND_REDISTRIBUTE, v1::OP_KIND_APPLY};

// dp_shard=4, four matrices, one bucket each (bucket_size_bytes = 1), async
// with prefetch 1.
v1::JobSpec CtlSpec(bool async) {
  v1::JobSpec spec;
  spec.set_job_id("ctl");
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(kRanks);
  const std::vector<std::pair<int, int>> shapes = {
      {16, 16}, {16, 8}, {8, 8}, {8, 4}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    v1::ParamSpec* p = spec.add_params();
    p->set_name(absl::StrCat("w", i));
    p->add_shape(shapes[i].first);
    p->add_shape(shapes[i].second);
    p->add_placements("Shard(0)");
  }
  spec.mutable_execution()->set_bucket_size_bytes(1);
  spec.mutable_execution()->set_async_gpu_parallelism(async);
  spec.mutable_execution()->set_prefetch_count(async ? 1 : 0);
  return spec;
}

// Rank r's operation durations are scaled by Slowdown(r): rank 3 is 10x
// slower (a straggler).
double Slowdown(int rank) { return rank == 3 ? 10.0 : 1.0; }

// Per step, per bucket b: gather (1 + b) ms, orthogonalize 2 ms,
// redistribute 1 ms, apply 0.5 ms, times Slowdown(rank); steps 10 ms apart.
v1::StepReport SyntheticReport(int rank, int64_t step) {
  const double k = Slowdown(rank);
  v1::StepReport report;
  report.set_job_id("ctl");
  report.set_rank(rank);
  report.set_incarnation(40 + rank);
  report.set_step(step);
  report.set_mode(v1::SCHEDULE_MODE_ASYNC);
  report.set_prefetch_count(1);
  report.set_reports_dropped(rank == 2 ? 5 : 0);
  double t = 1.7e9 + 0.1 * static_cast<double>(step);
  const double start = t;
  for (int b = 0; b < kBuckets; ++b) {
    const double ms[] = {1.0 + b, 2.0, 1.0, 0.5};
    for (int o = 0; o < 4; ++o) {
      v1::OpTiming* op = report.add_ops();
      op->set_op(kOps[o]);
      op->set_bucket(b);
      op->set_stream(o == 1 ? v1::STREAM_KIND_COMPUTE : v1::STREAM_KIND_COMM);
      op->set_start_s(t);
      t += ms[o] * k * 1e-3;
      op->set_end_s(t);
      op->set_bytes(4096 * (b + 1));
      op->set_flops(o == 1 ? 1e6 : 0);
    }
  }
  report.set_step_time_s(t - start);
  return report;
}

class MuonctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServerOptions options;
    options.service.job_id = "ctl";
    options.service.default_join_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options);
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);

    absl::StatusOr<std::vector<v1::RankManifest>> manifests =
        ManifestsFromSpec(CtlSpec(/*async=*/true));
    ASSERT_THAT(manifests, IsOk());
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        v1::JoinRequest join;
        *join.mutable_manifest() = (*manifests)[r];
        join.set_incarnation(40 + r);
        join.set_timeout_ms(5000);
        EXPECT_THAT(server_->service()->Join(join), IsOk());
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      for (int s = 0; s < kSteps; ++s) {
        ASSERT_THAT(server_->service()->ReportStep(SyntheticReport(r, s)),
                    IsOk());
      }
    }
  }

  // Runs muonctl with `args`; returns its exit code, output in out_ / err_.
  int Run(const std::vector<std::string>& args) {
    out_.str("");
    err_.str("");
    return RunMuonctl(args, out_, err_);
  }

  // The same for a live command: `command --coordinator ADDRESS extra...`.
  int Live(const std::string& command,
           const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {command, "--coordinator",
                                     server_->address()};
    args.insert(args.end(), extra.begin(), extra.end());
    return Run(args);
  }

  // The table row of `rank` split on whitespace.
  std::vector<std::string> Row(int rank) {
    for (absl::string_view line : absl::StrSplit(out_.str(), '\n')) {
      std::vector<std::string> tokens =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (!tokens.empty() && tokens[0] == absl::StrCat(rank)) return tokens;
    }
    return {};
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(MuonctlTest, Status_LiveJob_TableWithStepTimeStragglerAndDropped) {
  ASSERT_EQ(Live("status"), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("job ctl: running, 4/4 ranks joined"));
  EXPECT_THAT(out_.str(), HasSubstr("heartbeat age"));
  EXPECT_THAT(out_.str(), HasSubstr("straggler"));
  EXPECT_THAT(out_.str(), HasSubstr("dropped"));
  // rank state age "s" step time "ms" [yes] dropped matrices
  const std::vector<std::string> r2 = Row(2);
  ASSERT_EQ(r2.size(), 9u) << out_.str();
  EXPECT_EQ(r2[1], "running");
  EXPECT_EQ(r2[4], "2");     // last step
  EXPECT_EQ(r2[5], "10.0");  // 2 x (1 + 2 + 1 + 0.5) + 1 ms
  EXPECT_EQ(r2[7], "5");     // reports dropped
  const std::vector<std::string> r3 = Row(3);
  ASSERT_EQ(r3.size(), 10u) << out_.str();
  EXPECT_EQ(r3[5], "100.0");
  EXPECT_EQ(r3[7], "yes");
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(Row(r), ::testing::Not(::testing::Contains("yes"))) << r;
  }

  ASSERT_EQ(Live("status", {"--json"}), 0) << err_.str();
  Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok())
      << out_.str();
  // Every field, zero values included (rank 0), int64 as numbers, the
  // ranks a list of the job's object.
  const auto& ranks = parsed.fields().at("ranks");
  const auto& rank0 = ranks.list_value().values(0).struct_value().fields();
  EXPECT_EQ(rank0.at("rank").kind_case(), Value::kNumberValue);
  EXPECT_EQ(rank0.at("rank").number_value(), 0);
  EXPECT_EQ(rank0.at("incarnation").kind_case(), Value::kNumberValue);
  EXPECT_EQ(rank0.at("incarnation").number_value(), 40);
  EXPECT_EQ(parsed.fields()
                .at("job")
                .struct_value()
                .fields()
                .at("generation")
                .kind_case(),
            Value::kNumberValue);
  ASSERT_EQ(ranks.list_value().values_size(), kRanks);
  EXPECT_TRUE(ranks.list_value()
                  .values(3)
                  .struct_value()
                  .fields()
                  .at("straggler")
                  .bool_value());
}

TEST_F(MuonctlTest, Status_WatchCount2_PrintsTwoTables) {
  const absl::Time start = absl::Now();
  ASSERT_EQ(Live("status", {"--watch", "--count", "2", "--interval_s", "0.05"}),
            0)
      << err_.str();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  const std::string out = out_.str();
  int tables = 0;
  for (size_t at = out.find("heartbeat age"); at != std::string::npos;
       at = out.find("heartbeat age", at + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 2) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2 * (1 + 2 + kRanks))
      << out;
}

TEST_F(MuonctlTest, Status_WatchBadInterval_Usage) {
  EXPECT_EQ(Live("status", {"--watch", "--interval_s", "0"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--interval_s"));
}

TEST_F(MuonctlTest, Timings_LiveJob_PercentilesPerRankAndOp) {
  ASSERT_EQ(Live("timings"), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("12 reports"));
  // Rank 3's orthogonalize: 20 ms every time (6 = 3 steps x 2 buckets).
  const std::string out = out_.str();
  bool found = false;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (t.size() == 5 && t[0] == "3" && t[1] == "orthogonalize") {
      found = true;
      EXPECT_EQ(t[2], "6");
      EXPECT_EQ(t[3], "20.000");
      EXPECT_EQ(t[4], "20.000");
    }
  }
  EXPECT_TRUE(found) << out;

  ASSERT_EQ(Live("timings", {"--json"}), 0) << err_.str();
  Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(out_.str(), &parsed).ok())
      << out_.str();
  const auto& rows = parsed.fields().at("timings").list_value();
  ASSERT_EQ(rows.values_size(), kRanks * 5) << out_.str();  // 4 ops + step
  // (rank, op) -> (count, p50, p99).
  std::map<std::pair<int, std::string>, std::vector<double>> got;
  for (const Value& v : rows.values()) {
    const auto& f = v.struct_value().fields();
    got[{static_cast<int>(f.at("rank").number_value()),
         f.at("op").string_value()}] = {f.at("count").number_value(),
                                        f.at("p50_ms").number_value(),
                                        f.at("p99_ms").number_value()};
  }
  auto at = [&](int rank, const std::string& op) {
    return got[std::make_pair(rank, op)];
  };
  // Gather: 1 ms (bucket 0) and 2 ms (bucket 1), three times each;
  // nearest-rank p50 is the 3rd of 6, p99 the 6th.
  ASSERT_EQ(at(0, "gather").size(), 3u);
  EXPECT_EQ(at(0, "gather")[0], 6);
  EXPECT_NEAR(at(0, "gather")[1], 1.0, 1e-3);
  EXPECT_NEAR(at(0, "gather")[2], 2.0, 1e-3);
  EXPECT_NEAR(at(3, "gather")[1], 10.0, 1e-3);
  EXPECT_NEAR(at(3, "gather")[2], 20.0, 1e-3);
  EXPECT_EQ(at(1, "step")[0], kSteps);
  EXPECT_NEAR(at(1, "step")[1], 10.0, 1e-3);
  EXPECT_NEAR(at(3, "step")[1], 100.0, 1e-2);

  ASSERT_EQ(Live("timings", {"--json", "--last_steps", "1"}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"reports\": 4"));
}

TEST_F(MuonctlTest, Trace_LiveJob_ChromeTraceEventsParseBack) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_trace.json");
  ASSERT_EQ(Live("trace", {"--out", path}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("96 operations of 3 steps on 4 ranks"));
  std::ifstream file(path);
  ASSERT_TRUE(file.good());
  std::stringstream text;
  text << file.rdbuf();

  Struct trace;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(text.str(), &trace).ok())
      << text.str().substr(0, 2000);
  EXPECT_EQ(trace.fields().at("displayTimeUnit").string_value(), "ms");
  const auto& events = trace.fields().at("traceEvents").list_value().values();

  int slices = 0, step_spans = 0, wait_spans = 0;
  std::set<int> slice_pids;
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  double min_ts = 1e300;
  std::map<std::string, int> per_op;
  for (const Value& v : events) {
    const auto& e = v.struct_value().fields();
    const std::string ph = e.at("ph").string_value();
    const int pid = static_cast<int>(e.at("pid").number_value());
    const int tid = static_cast<int>(e.at("tid").number_value());
    if (ph == "X" && e.at("cat").string_value() == "muon.step") {
      ++step_spans;
      EXPECT_EQ(thread_names[std::make_pair(pid, tid)], "step");
      continue;
    }
    if (ph == "X" && e.at("cat").string_value() == "muon.wait") {
      ++wait_spans;
      EXPECT_EQ(e.at("name").string_value(), "wait");
      EXPECT_GT(e.at("dur").number_value(), 0);
      continue;
    }
    if (ph == "X") {
      ++slices;
      slice_pids.insert(pid);
      ++per_op[e.at("name").string_value()];
      min_ts = std::min(min_ts, e.at("ts").number_value());
      EXPECT_GE(e.at("ts").number_value(), 0);
      EXPECT_GT(e.at("dur").number_value(), 0);
      const auto& args = e.at("args").struct_value().fields();
      for (const char* key : {"bucket", "bytes", "flops", "step"}) {
        EXPECT_TRUE(args.count(key)) << key;
      }
      // The thread is named after the operation's stream.
      const std::string want =
          e.at("name").string_value() == "orthogonalize" ? "compute" : "comm";
      EXPECT_EQ(thread_names[std::make_pair(pid, tid)], want);
    } else if (ph == "M") {
      const std::string name = e.at("name").string_value();
      const auto& args = e.at("args").struct_value().fields();
      if (name == "process_name") {
        process_names[pid] = args.at("name").string_value();
      } else if (name == "thread_name") {
        thread_names[{pid, tid}] = args.at("name").string_value();
      }
    } else {
      ADD_FAILURE() << "unexpected phase " << ph;
    }
  }
  EXPECT_EQ(slices, kRanks * kSteps * kBuckets * 4);
  // A step span per report; waits: per bucket the comm stream waits for
  // orthogonalize between gather and redistribute, and the compute stream
  // between its two buckets: 2 + 1 per step.
  EXPECT_EQ(step_spans, kRanks * kSteps);
  EXPECT_EQ(wait_spans, kRanks * kSteps * (kBuckets + 1));
  EXPECT_EQ(slice_pids, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(per_op["orthogonalize"], kRanks * kSteps * kBuckets);
  EXPECT_DOUBLE_EQ(min_ts, 0);
  ASSERT_EQ(process_names.size(), 4u);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(process_names[r], absl::StrCat("rank ", r));
  }
  // step, comm and compute per rank.
  EXPECT_EQ(thread_names.size(), 3u * kRanks);

  // Durations in microseconds: rank 3's first orthogonalize is 20 ms.
  for (const Value& v : events) {
    const auto& e = v.struct_value().fields();
    if (e.at("ph").string_value() == "X" && e.at("pid").number_value() == 3 &&
        e.at("name").string_value() == "orthogonalize") {
      EXPECT_NEAR(e.at("dur").number_value(), 20000, 1);
      break;
    }
  }
}

// An agent newer than this muonctl may report operation and stream kinds
// it does not know: they print as "unknown(N)" on a track of their own.
TEST_F(MuonctlTest, Trace_UnknownKindsAndOddNumbers_StillValidJson) {
  v1::StepReport report = SyntheticReport(1, 99);
  report.clear_ops();
  v1::OpTiming* op = report.add_ops();
  op->set_op(static_cast<v1::OpKind>(9));
  op->set_stream(static_cast<v1::StreamKind>(7));
  op->set_start_s(1.7e9 + 50);
  op->set_end_s(1.7e9 + 50.5);
  op->set_flops(std::numeric_limits<double>::infinity());
  op->set_bytes(int64_t{1} << 40);
  ASSERT_THAT(server_->service()->ReportStep(report), IsOk());
  ASSERT_EQ(Live("trace", {"--out", "-"}), 0) << err_.str();
  Struct trace;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(out_.str(), &trace).ok())
      << out_.str();
  bool found = false;
  for (const Value& v :
       trace.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    if (e.at("ph").string_value() == "M" &&
        e.at("name").string_value() == "thread_name" &&
        e.at("args").struct_value().fields().at("name").string_value() ==
            "unknown(7)") {
      EXPECT_EQ(e.at("tid").number_value(), 7);
      found = true;
    }
    if (e.at("ph").string_value() != "X" ||
        e.at("cat").string_value() != "muon" ||
        e.at("args").struct_value().fields().at("step").number_value() != 99) {
      continue;
    }
    EXPECT_EQ(e.at("name").string_value(), "unknown(9)");
    const auto& args = e.at("args").struct_value().fields();
    EXPECT_EQ(args.at("flops").kind_case(), Value::kNullValue);
    EXPECT_EQ(args.at("bytes").number_value(), 1099511627776.0);
    EXPECT_NEAR(e.at("dur").number_value(), 500000, 1);
  }
  EXPECT_TRUE(found) << out_.str();
}

TEST_F(MuonctlTest, Trace_NoOut_Usage) {
  EXPECT_EQ(Live("trace"), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--out"));
}

TEST_F(MuonctlTest, Schedule_LiveAndOfflineFromSpec_SameStreams) {
  ASSERT_EQ(Live("schedule"), 0) << err_.str();
  const std::string live = out_.str();
  EXPECT_THAT(live,
              HasSubstr("mode async, prefetch 1, 2 buffer slots, 4 buckets"));
  EXPECT_THAT(live, HasSubstr("rank 3\n"));
  // Every rank's comm stream: G0 G1, then R(b) A(b) G(b+2).
  EXPECT_THAT(live, HasSubstr("  comm     g0@s0 g1@s1 r0 a0 g2@s0 r1 a1 "
                              "g3@s1 r2 a2 r3 a3\n"));
  EXPECT_THAT(live, HasSubstr("  compute  o"));

  // Offline from the same spec: the same plan, so the same output.
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_schedule_spec.json");
  {
    std::ofstream f(path);
    f << JobSpecToJson(CtlSpec(/*async=*/true));
  }
  ASSERT_EQ(Run({"schedule", "--spec", path}), 0) << err_.str();
  EXPECT_EQ(out_.str(), live);

  ASSERT_EQ(Run({"schedule", "--spec", path, "--json"}), 0) << err_.str();
  v1::Schedule schedule;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(out_.str(), &schedule).ok());
  absl::StatusOr<v1::Plan> plan =
      server_->service()->GetPlan(v1::GetPlanRequest());
  ASSERT_THAT(plan, IsOk());
  // The plan's schedule is compact; muonctl prints every rank's list.
  EXPECT_EQ(plan->schedule().ranks_size(), 0);
  EXPECT_EQ(
      schedule.SerializeAsString(),
      MakeSchedule(*plan, /*async=*/true, plan->schedule().prefetch_count())
          .SerializeAsString());

  // Sequential: one stream, one slot.
  {
    std::ofstream f(path);
    f << JobSpecToJson(CtlSpec(/*async=*/false));
  }
  ASSERT_EQ(Run({"schedule", "--spec", path}), 0) << err_.str();
  EXPECT_THAT(
      out_.str(),
      HasSubstr("mode sequential, prefetch 0, 1 buffer slot, 4 buckets"));
  EXPECT_THAT(out_.str(), HasSubstr("  main     g0@s0 "));
  EXPECT_THAT(out_.str(), ::testing::Not(HasSubstr("comm")));
}

TEST_F(MuonctlTest, Schedule_NoSource_Usage) {
  EXPECT_EQ(Run({"schedule"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--spec"));
}

TEST_F(MuonctlTest, Timings_CoordinatorStopped_FailsWithUnavailable) {
  server_->Stop();
  EXPECT_EQ(Live("timings"), 1);
  EXPECT_THAT(err_.str(), HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(err_.str(), HasSubstr("GetReports"));
}

// Per-command flags and help, exit codes 0 / 1 / 2.
TEST(MuonctlCliTest, Help_TopLevelHelpCommandAndPerCommand_ExitZero) {
  std::ostringstream out, err;
  EXPECT_EQ(RunMuonctl({"--help"}, out, err), 0) << err.str();
  for (const char* command : {"plan", "assignments", "status", "timings",
                              "trace", "schedule", "validate", "checkpoint"}) {
    EXPECT_THAT(out.str(), HasSubstr(command));
  }
  EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("validate-rank")));
  std::ostringstream help_out;
  EXPECT_EQ(RunMuonctl({"help"}, help_out, err), 0);
  EXPECT_EQ(help_out.str(), out.str());

  std::ostringstream plan_help, plan_flag_help;
  EXPECT_EQ(RunMuonctl({"help", "plan"}, plan_help, err), 0);
  EXPECT_EQ(RunMuonctl({"plan", "--help"}, plan_flag_help, err), 0);
  for (const std::string& text : {plan_help.str(), plan_flag_help.str()}) {
    EXPECT_THAT(text, HasSubstr("--spec"));
    EXPECT_THAT(text, HasSubstr("--policy"));
    // Only plan's flags: no other command's, no internal ones.
    for (const char* other :
         {"--watch", "--coordinator", "--rank", "--port_file", "--out_dir"}) {
      EXPECT_THAT(text, ::testing::Not(HasSubstr(other))) << other;
    }
  }
  std::ostringstream unknown_err;
  EXPECT_EQ(RunMuonctl({"help", "bogus"}, out, unknown_err), 2);
  EXPECT_THAT(unknown_err.str(), HasSubstr("unknown command \"bogus\""));
}

TEST(MuonctlCliTest, Flags_UnknownIrrelevantMissingOrStray_UsageTwo) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_cli_spec.json");
  {
    std::ofstream f(path);
    f << JobSpecToJson(CtlSpec(/*async=*/false));
  }
  const std::vector<std::vector<std::string>> usage = {
      {"bogus"},                                     // unknown command
      {"plan"},                                      // missing --spec
      {"plan", "--spec", path, "--watch"},           // another command's flag
      {"plan", "--spec", path, "--steps", "9"},      // validate's flag
      {"plan", "--spec", path, "--json", "false"},   // stray argument
      {"plan", "--spec", path, "--policy", "best"},  // not a policy
      {"plan", "--spec", "/nonexistent/spec.json"},
      {"status"},                                 // missing --coordinator
      {"trace", "--coordinator", "127.0.0.1:1"},  // missing --out
      {"checkpoint", "inspect"},                  // missing DIR
  };
  for (const std::vector<std::string>& args : usage) {
    std::ostringstream out, err;
    EXPECT_EQ(RunMuonctl(args, out, err), 2)
        << absl::StrJoin(args, " ") << ": " << err.str();
    EXPECT_FALSE(err.str().empty()) << absl::StrJoin(args, " ");
  }
  // --json=false is a valid spelling of the flag's value.
  std::ostringstream out, err;
  EXPECT_EQ(RunMuonctl({"plan", "--spec", path, "--json=false"}, out, err), 0)
      << err.str();
  EXPECT_THAT(out.str(), HasSubstr("policy lpt"));
}

// One of each: no "1 buckets".
TEST(MuonctlCliTest, Plan_OneMatrixOneRankOneBucket_Singular) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_one_spec.json");
  {
    v1::JobSpec spec;
    spec.set_job_id("one");
    v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
    dim->set_name("dp_shard");
    dim->set_size(1);
    v1::ParamSpec* p = spec.add_params();
    p->set_name("w");
    p->add_shape(8);
    p->add_shape(8);
    p->add_placements("Replicate()");
    std::ofstream f(path);
    f << JobSpecToJson(spec);
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("1 matrix over 1 rank (mesh dp_shard=1)"));
  EXPECT_THAT(out.str(), HasSubstr("policy lpt, 1 bucket\n"));
}

// A job of more than 1000 matrices or ranks prints the first 20 matrices
// and the 20 most loaded ranks, saying how many were left out; --full
// prints every row.
TEST(MuonctlCliTest, Plan_LargeJob_SummaryByDefaultFullOnRequest) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_large_spec.json");
  {
    v1::JobSpec spec;
    spec.set_job_id("large");
    v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
    dim->set_name("dp_shard");
    dim->set_size(1024);
    for (int i = 0; i < 1001; ++i) {
      v1::ParamSpec* p = spec.add_params();
      p->set_name(absl::StrCat("layers.", i, ".w"));
      p->add_shape(8);
      p->add_shape(8);
      p->add_placements("Shard(0)");
    }
    std::ofstream f(path);
    f << JobSpecToJson(spec);
  }
  std::ostringstream out, err;
  ASSERT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 0) << err.str();
  const std::string summary = out.str();
  EXPECT_THAT(summary, HasSubstr("layers.19.w "));
  EXPECT_THAT(summary, Not(HasSubstr("layers.20.w ")));
  EXPECT_THAT(summary,
              HasSubstr("... 981 more matrices (--full prints every one)"));
  EXPECT_THAT(summary, HasSubstr("the 20 most loaded of 1024 ranks"));
  EXPECT_THAT(summary, HasSubstr("policy round_robin"));
  std::ostringstream full_out, full_err;
  ASSERT_EQ(RunMuonctl({"plan", "--full", "--spec", path}, full_out, full_err),
            0)
      << full_err.str();
  EXPECT_THAT(full_out.str(), HasSubstr("layers.1000.w "));
  EXPECT_THAT(full_out.str(), Not(HasSubstr("more matrices")));
  EXPECT_THAT(full_out.str(), Not(HasSubstr("most loaded")));
  // Every rank has a row: 1024 rank lines follow the header.
  EXPECT_THAT(full_out.str(), HasSubstr("\n1023 "));
}

// A spec file of one [8, 8] fp32 matrix "w" FSDP-sharded over 4 ranks
// (dp_shard), with or without NorMuon; returns its path.
std::string WriteFsdpSpec(const std::string& job_id, bool normuon) {
  v1::JobSpec spec;
  spec.set_job_id(job_id);
  v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(4);
  v1::ParamSpec* p = spec.add_params();
  p->set_name("w");
  p->add_shape(8);
  p->add_shape(8);
  p->add_placements("Shard(0)");
  if (normuon) spec.mutable_optimizer()->set_normuon(true);
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_", job_id, "_spec.json");
  std::ofstream f(path);
  f << JobSpecToJson(spec);
  return path;
}

TEST(MuonctlCliTest, Plan_ScaledUnitsAndBytesPerRankPerStep) {
  // One [8, 8] matrix FSDP over 4 ranks: shards of 2 x 8 fp32 = 64 B. The
  // owner receives 3 shards (192 B) and sends them back; every other rank
  // sends and receives its own 64 B. Peak buffers: the owner's full U and
  // O (2 x 256 B) + send and receive buffers (192 B each) = 896 B; the
  // others' 64 + 64 = 128 B; every rank's slot also holds its own shard's
  // U and O (2 x 64 B). Momentum: 64 B each (fp32); peak = momentum +
  // buffers.
  const std::string path = WriteFsdpSpec("units", /*normuon=*/false);
  std::ostringstream out, err;
  ASSERT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("gathered"));
  EXPECT_THAT(out.str(), HasSubstr("peak buffer"));
  EXPECT_THAT(out.str(), HasSubstr("kFLOP"));
  EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("e+")));
  int owners = 0, others = 0;
  for (absl::string_view line : absl::StrSplit(out.str(), '\n')) {
    // rank matrices NS(value unit) gathered sent received, sent bf16
    // (two values per word: half), peak buffer, momentum, peak (value
    // unit)
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (t.size() != 18 || t[0].size() != 1 || !isdigit(t[0][0])) continue;
    if (t[1] == "1") {
      ++owners;
      EXPECT_EQ(absl::StrJoin(t.begin() + 4, t.end(), " "),
                "192 B 192 B 192 B 96 B 1 KiB 64 B 1.06 KiB")
          << line;
    } else {
      ++others;
      EXPECT_EQ(absl::StrJoin(t.begin() + 4, t.end(), " "),
                "0 B 64 B 64 B 32 B 256 B 64 B 320 B")
          << line;
    }
  }
  EXPECT_EQ(owners, 1) << out.str();
  EXPECT_EQ(others, 3) << out.str();
  // 192 + 3 x 64 bytes sent by all ranks, half with bf16.
  EXPECT_THAT(out.str(),
              HasSubstr("exchange per step, all ranks: 384 B with float32, "
                        "192 B with bfloat16"));
}

TEST(MuonctlCliTest, Plan_NorMuon_RowStateInTheExchangesAndTheSlot) {
  // As Plan_ScaledUnitsAndBytesPerRankPerStep, plus NorMuon's row state
  // (one fp32 per row) travelling with each shard: 2 values to and from
  // each non-owner. The owner gathers 3 x (16 + 2) values = 216 B and
  // sends them back; the others send and receive 18 values (72 B). Its
  // slot adds the 8 rows' state: (32 + 2 x 64 + 8) x 4 B + send and
  // receive buffers of 54 values each = 1104 B. The others: slot 32
  // values, send and receive 18 each: 272 B. Peak: + 64 B of momentum.
  const std::string path = WriteFsdpSpec("normuon", /*normuon=*/true);
  std::ostringstream out, err;
  ASSERT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 0) << err.str();
  int owners = 0, others = 0;
  for (absl::string_view line : absl::StrSplit(out.str(), '\n')) {
    std::vector<std::string> t = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (t.size() != 18 || t[0].size() != 1 || !isdigit(t[0][0])) continue;
    // gathered, sent, received, then peak buffer, momentum and peak
    // (value unit each; "sent bf16" left out).
    const std::string columns =
        absl::StrCat(absl::StrJoin(t.begin() + 4, t.begin() + 10, " "), " | ",
                     absl::StrJoin(t.begin() + 12, t.end(), " "));
    if (t[1] == "1") {
      ++owners;
      EXPECT_EQ(columns, "216 B 216 B 216 B | 1.08 KiB 64 B 1.14 KiB") << line;
    } else {
      ++others;
      EXPECT_EQ(columns, "0 B 72 B 72 B | 272 B 64 B 336 B") << line;
    }
  }
  EXPECT_EQ(owners, 1) << out.str();
  EXPECT_EQ(others, 3) << out.str();
}

// A spec no rank could run (NorMuon's float32 row state with the bf16
// exchange) is refused by muonctl plan with the runtime's own message.
TEST(MuonctlCliTest, Plan_NorMuonWithBf16Exchange_RefusedAsTheRuntimeDoes) {
  const std::string path = WriteFsdpSpec("normuon_bf16", /*normuon=*/true);
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(path);
  ASSERT_THAT(spec, IsOk());
  spec->mutable_execution()->set_exchange_dtype("bfloat16");
  {
    std::ofstream f(path);
    f << JobSpecToJson(*spec);
  }
  std::ostringstream out, err;
  EXPECT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 1) << out.str();
  EXPECT_THAT(err.str(),
              HasSubstr("normuon keeps its row state in float32 and sends it "
                        "with the built-in exchange: it cannot run with "
                        "execution.exchange_dtype \"bfloat16\""));
}

// PlanTraffic of a plan that is not its layout's (another world size, a
// matrix more) is refused naming both, instead of reading past the
// layout's boxes.
TEST(MuonctlCliTest, PlanTraffic_PlanNotOfItsLayout_InvalidArgument) {
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpec(WriteFsdpSpec("mismatch", /*normuon=*/false));
  ASSERT_THAT(spec, IsOk());
  absl::StatusOr<JobPlan> job = PlanJobSpec(*spec, "lpt");
  ASSERT_THAT(job, IsOk());
  ASSERT_THAT(PlanTraffic(*job), IsOk());
  JobPlan wider = *job;
  wider.plan.set_world_size(8);
  absl::StatusOr<std::vector<RankTraffic>> t = PlanTraffic(wider);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("the plan (1 matrices, world size 8) is not of its "
                        "layout (1 matrices, world size 4)"));
  JobPlan more = *job;
  *more.plan.add_matrices() = job->plan.matrices(0);
  t = PlanTraffic(more);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("the plan (2 matrices, world size 4) is not of"));
}

TEST(MuonctlCliTest, Status_RankLost_ExitsOneNamingIt) {
  CoordinatorServerOptions options;
  options.service.job_id = "probe";
  options.service.default_join_timeout = absl::Seconds(5);
  options.service.heartbeat_timeout = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      CoordinatorServer::Start(options);
  ASSERT_THAT(server, IsOk());
  absl::StatusOr<std::vector<v1::RankManifest>> manifests =
      ManifestsFromSpec(CtlSpec(/*async=*/false));
  ASSERT_THAT(manifests, IsOk());
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      v1::JoinRequest join;
      *join.mutable_manifest() = (*manifests)[r];
      join.set_incarnation(70 + r);
      join.set_timeout_ms(5000);
      EXPECT_THAT((*server)->service()->Join(join), IsOk());
    });
  }
  for (std::thread& t : threads) t.join();
  std::ostringstream out, err;
  EXPECT_EQ(
      RunMuonctl({"status", "--coordinator", (*server)->address()}, out, err),
      0)
      << err.str();
  // Nobody heartbeats: every rank is lost after the timeout.
  int rc = 0;
  for (int i = 0; i < 50 && rc == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    out.str("");
    err.str("");
    rc =
        RunMuonctl({"status", "--coordinator", (*server)->address()}, out, err);
  }
  EXPECT_EQ(rc, 1) << out.str();
  EXPECT_THAT(err.str(), HasSubstr("lost")) << out.str();
  EXPECT_THAT(err.str(), HasSubstr("rank 0")) << out.str();
}

// A .safetensors file of F32 `tensors` (name, shape), zero-filled.
void WriteSafetensors(
    const std::string& path,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  std::vector<::muon::testing::TestTensor> t;
  for (const auto& [name, shape] : tensors) t.push_back({name, "F32", shape});
  ASSERT_TRUE(::muon::testing::WriteSafetensorsFile(path, t)) << path;
}

TEST(MuonctlCliTest, Spec_FromSafetensorsHeader_TransposedAndPlannable) {
  const std::string dir = ::testing::TempDir();
  const std::string model = dir + "/gpt2_tiny.safetensors";
  WriteSafetensors(model, {{"transformer.wte.weight", {50, 16}},
                           {"transformer.h.0.ln_1.weight", {16}},
                           {"transformer.h.0.attn.c_attn.weight", {16, 48}},
                           {"transformer.h.0.attn.c_proj.weight", {16, 16}},
                           {"transformer.h.0.mlp.c_fc.weight", {16, 64}},
                           {"transformer.h.0.mlp.c_proj.weight", {64, 16}}});
  const std::string spec_path = dir + "/gpt2_tiny_spec.json";
  std::ostringstream out, err;
  ASSERT_EQ(
      RunMuonctl({"spec", "--safetensors", model, "--mesh", "dp_shard=2,tp=2",
                  "--rule", "c_attn|c_fc=tp:Shard(0)", "--rule",
                  "c_proj=tp:Shard(1)", "--transpose", "c_attn|c_proj|c_fc",
                  "--job_id", "gpt2-tiny", "--out", spec_path},
                 out, err),
      0)
      << err.str();
  EXPECT_THAT(out.str(), HasSubstr("4 matrices (2 tensors skipped)"));
  EXPECT_THAT(err.str(), HasSubstr("skipped transformer.wte.weight"));
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(spec_path);
  ASSERT_THAT(spec, IsOk());
  ASSERT_EQ(spec->params_size(), 4);
  EXPECT_EQ(spec->job_id(), "gpt2-tiny");
  // Conv1D [in, out] -> [out, in]; column-parallel on tp, FSDP on dp_shard.
  EXPECT_EQ(spec->params(0).name(), "transformer.h.0.attn.c_attn.weight");
  EXPECT_THAT(spec->params(0).shape(), ::testing::ElementsAre(48, 16));
  // Shapes are JSON numbers, as in every example spec (not "48").
  std::ifstream written(spec_path);
  const std::string text((std::istreambuf_iterator<char>(written)),
                         std::istreambuf_iterator<char>());
  EXPECT_THAT(text, ::testing::ContainsRegex("\"shape\": \\[\n +48,\n +16\n"));
  EXPECT_THAT(text, Not(HasSubstr("\"48\"")));
  EXPECT_THAT(spec->params(0).placements(),
              ::testing::ElementsAre("Shard(0)", "Shard(0)"));
  EXPECT_THAT(spec->params(1).placements(),
              ::testing::ElementsAre("Shard(0)", "Shard(1)"));
  // The spec plans.
  std::ostringstream plan_out, plan_err;
  EXPECT_EQ(RunMuonctl({"plan", "--spec", spec_path}, plan_out, plan_err), 0)
      << plan_err.str();
  EXPECT_THAT(plan_out.str(), HasSubstr("4 matrices over 4 ranks"));
  // A bad rule is a usage error naming it.
  std::ostringstream bad_out, bad_err;
  EXPECT_EQ(RunMuonctl({"spec", "--safetensors", model, "--mesh", "tp=2",
                        "--rule", "c_attn=xx:Shard(0)"},
                       bad_out, bad_err),
            2);
  EXPECT_THAT(bad_err.str(), HasSubstr("xx"));
}

// report and schedule need a source: with neither --spec nor
// --coordinator (other flags given) both are usage errors naming the two.
TEST(MuonctlCliTest,
     ReportOrSchedule_NeitherSpecNorCoordinator_UsageNamesBoth) {
  const std::string html =
      absl::StrCat(::testing::TempDir(), "/muonctl_no_source.html");
  std::remove(html.c_str());
  const std::vector<std::vector<std::string>> commands = {
      {"report", "--out", html},
      {"report", "--out", html, "--last_steps", "2"},
      {"schedule", "--json"},
  };
  for (const std::vector<std::string>& args : commands) {
    std::ostringstream out, err;
    EXPECT_EQ(RunMuonctl(args, out, err), 2) << absl::StrJoin(args, " ");
    EXPECT_THAT(err.str(), HasSubstr("--spec")) << absl::StrJoin(args, " ");
    EXPECT_THAT(err.str(), HasSubstr("--coordinator"))
        << absl::StrJoin(args, " ");
  }
  EXPECT_FALSE(std::ifstream(html).good()) << "no report is written";
}

// A spec path that is not a regular file is refused before anything is
// read: /dev/zero (endless) and a FIFO (no writer: opening it must not
// wait).
TEST(MuonctlCliTest, Plan_SpecNotARegularFile_RefusedQuicklyNamingPath) {
  const std::string path = "/dev/zero";
  std::ostringstream out, err;
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 1) << path;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << path;
  EXPECT_THAT(err.str(), HasSubstr(absl::StrCat("\"", path, "\"")));
  EXPECT_THAT(err.str(), HasSubstr("neither a regular file nor a pipe"));
  EXPECT_THAT(LoadJobSpec(path),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("neither a regular file nor a pipe")));
}

// A pipe (bash's --spec <(command)) is read until its writer closes it;
// one with no writer reads as empty at once (not JSON), without hanging.
TEST(MuonctlCliTest, LoadJobSpec_Pipe_ReadUntilItsWriterCloses) {
  const std::string fifo =
      absl::StrCat(::testing::TempDir(), "/muonctl_spec_fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // A reader held open keeps the pipe (and what was written) while the
  // writer opens, writes and closes, as a command behind <(...) would.
  const int keep = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(keep, 0) << std::strerror(errno);
  const int w = open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(w, 0) << std::strerror(errno);
  const std::string json = "{\"job_id\": \"from-a-pipe\"}";
  ASSERT_EQ(write(w, json.data(), json.size()),
            static_cast<ssize_t>(json.size()));
  ASSERT_EQ(close(w), 0);
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(fifo);
  ASSERT_EQ(close(keep), 0);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->job_id(), "from-a-pipe");
  const absl::Time start = absl::Now();
  EXPECT_THAT(LoadJobSpec(fifo),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(fifo)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(std::remove(fifo.c_str()), 0);
}

// A (sparse) spec file one byte over kMaxJobSpecFileBytes is refused from
// its size, naming the size and the limit; one of exactly the limit is
// read (and, being NUL bytes, is not JSON).
TEST(MuonctlCliTest, Plan_SpecOverSizeLimit_RefusedNamingSizeAndLimit) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_huge_spec.json");
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, kMaxJobSpecFileBytes + 1), 0) << std::strerror(errno);
  std::ostringstream out, err;
  EXPECT_EQ(RunMuonctl({"plan", "--spec", path}, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr(path));
  EXPECT_THAT(err.str(),
              HasSubstr(absl::StrCat(kMaxJobSpecFileBytes + 1, " bytes")));
  EXPECT_THAT(err.str(),
              HasSubstr(absl::StrCat("at most ", kMaxJobSpecFileBytes)));
  ASSERT_EQ(ftruncate(fd, kMaxJobSpecFileBytes), 0) << std::strerror(errno);
  EXPECT_EQ(close(fd), 0);
  EXPECT_THAT(LoadJobSpec(path), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("not valid JSON"),
                                                Not(HasSubstr("at most")))));
  EXPECT_EQ(std::remove(path.c_str()), 0);
}

// CLI11's PositiveNumber and NonNegativeNumber take "nan"; every numeric
// flag also requires a finite number (a usage error naming the flag and
// the value), so --interval_s nan cannot become an endless sleep.
TEST(MuonctlCliTest, Flags_NanOrInfNumber_UsageNamingFlagAndValue) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/muonctl_nan_spec.json");
  {
    std::ofstream f(path);
    f << JobSpecToJson(CtlSpec(/*async=*/false));
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"validate", "--spec", path, "--timeout_s", "nan"},
       "--timeout_s: value \"nan\" is not a finite number"},
      {{"validate", "--spec", path, "--tolerance", "nan"},
       "--tolerance: value \"nan\" is not a finite number"},
      {{"validate", "--spec", path, "--tolerance", "1e999"},
       "--tolerance: value \"1e999\" is not a finite number"},
      {{"status", "--coordinator", "127.0.0.1:1", "--watch", "--interval_s",
        "inf"},
       "--interval_s: value \"inf\" is not a finite number"},
      {{"status", "--coordinator", "127.0.0.1:1", "--watch", "--interval_s",
        "nan"},
       "--interval_s: value \"nan\" is not a finite number"},
      {{"timings", "--coordinator", "127.0.0.1:1", "--last_steps", "nan"},
       "--last_steps"},
  };
  for (const auto& [args, message] : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(RunMuonctl(args, out, err), 2) << absl::StrJoin(args, " ");
    EXPECT_THAT(err.str(), HasSubstr(message)) << absl::StrJoin(args, " ");
  }
}

// A plan (as a faulty live coordinator might send) whose load names a rank
// outside its world, or whose world size is negative, is refused by name
// instead of indexing out of bounds; the same plan with its loads in range
// renders.
TEST(ReportTest, RenderReportHtml_LoadRankOutsideWorldOrNegativeWorld_Refused) {
  ReportInput in;
  in.plan.plan.set_hash("h1");
  in.plan.plan.set_world_size(2);
  for (int rank : {0, 1}) {
    v1::RankLoad* load = in.plan.plan.add_loads();
    load->set_rank(rank);
    load->set_ns_flops(1e6 * (rank + 1));
  }
  absl::StatusOr<std::string> html = RenderReportHtml(in);
  ASSERT_THAT(html, IsOk());
  EXPECT_THAT(*html, HasSubstr("\"ns_flops\":[1000000.0,2000000.0]"));

  for (int bad_rank : {2, 7, -1}) {
    ReportInput bad = in;
    bad.plan.plan.mutable_loads(1)->set_rank(bad_rank);
    EXPECT_THAT(RenderReportHtml(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("plan h1"),
                               HasSubstr(absl::StrCat("rank ", bad_rank)),
                               HasSubstr("world size 2"))));
  }
  ReportInput negative = in;
  negative.plan.plan.set_world_size(-3);
  EXPECT_THAT(
      RenderReportHtml(negative),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world size -3")));
}

}  // namespace
}  // namespace muon
