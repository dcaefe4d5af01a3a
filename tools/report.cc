#include "tools/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/bucket_layout.h"
#include "common/checked_math.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/wire_names.h"
#include "nlohmann/json.hpp"

namespace muon {

// `value` with the largest prefix that keeps it >= 1, 3 significant
// digits: "52.8 kFLOP", "9.81 GFLOP", "11.0 TFLOP" (SI, 1000).
std::string Flops(double value) {
  static const char* const kPrefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int k = 0;
  while (k < 6 && std::abs(value) >= 1000) {
    value /= 1000;
    ++k;
  }
  return absl::StrFormat("%.3g %sFLOP", value, kPrefix[k]);
}

// Bytes in binary units: "512 B", "1.50 KiB", "3.20 MiB", "1.07 GiB".
std::string Bytes(double value) {
  static const char* const kUnit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int k = 0;
  while (k < 5 && std::abs(value) >= 1024) {
    value /= 1024;
    ++k;
  }
  return k == 0 ? absl::StrFormat("%.0f B", value)
                : absl::StrFormat("%.3g %s", value, kUnit[k]);
}

namespace {

// Every matrix of `job` in plan order, as a step executor sees it. One
// list serves every rank: a matrix a rank holds no part of (an empty box:
// another pipeline stage or expert, an empty shard) adds nothing to its
// exchanges or slots, as in the executor of a rank that has it empty.
std::vector<MatrixGeometry> JobGeometry(const JobPlan& job) {
  std::vector<MatrixGeometry> geometry;
  geometry.reserve(job.plan.matrices_size());
  for (int i = 0; i < job.plan.matrices_size(); ++i) {
    const v1::MatrixPlan& mp = job.plan.matrices(i);
    const MatrixLayout& m = job.layout.matrices[i];
    MatrixGeometry g;
    g.param = mp.param();
    g.param_index = m.param_index;
    g.slice = mp.slice();
    g.rows = m.rows;
    g.cols = m.cols;
    g.boxes = m.boxes.vec();
    geometry.push_back(std::move(g));
  }
  return geometry;
}

// Rank r's bytes per step and buffers, from its bucket layout: the sizes
// StepExecutor::Create allocates (client/step_executor.h).
absl::StatusOr<RankTraffic> RankTrafficOf(
    const v1::Plan& plan, const std::vector<MatrixGeometry>& geometry,
    const BucketLayoutOptions& options, int r) {
  MUON_ASSIGN_OR_RETURN(
      BucketLayout layout,
      BucketLayout::Compile(r, plan.world_size(), plan, geometry, options));
  RankTraffic t;
  for (const LocalBucket& b : layout.buckets()) {
    t.sent += 4 * (b.gather.send_total + b.redistribute.send_total);
    t.received += 4 * (b.gather.recv_total + b.redistribute.recv_total);
    t.sent_bf16 += 4 * (b.gather.send_words_bf16_total +
                        b.redistribute.send_words_bf16_total);
    t.received_bf16 += 4 * (b.gather.recv_words_bf16_total +
                            b.redistribute.recv_words_bf16_total);
    t.gathered += 4 * b.gather.recv_total;
  }
  const BufferSizes& sizes = layout.sizes();
  const int64_t slots = std::max(1, plan.schedule().slots());
  t.peak_buffer =
      4 * (slots * layout.slot_elems() + sizes.max_send + sizes.max_recv);
  return t;
}

}  // namespace

absl::StatusOr<std::vector<RankTraffic>> PlanTraffic(
    const JobPlan& job, const PlanMemoryOptions& memory) {
  const v1::Plan& plan = job.plan;
  const int world = plan.world_size();
  if (plan.matrices_size() != static_cast<int>(job.layout.matrices.size()) ||
      world != job.layout.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the plan (", plan.matrices_size(), " matrices, world size ", world,
        ") is not of its layout (", job.layout.matrices.size(),
        " matrices, world size ", job.layout.world_size, ")"));
  }
  if (static_cast<int64_t>(world) * world * plan.matrices_size() >
      kMaxTrafficWork) {
    return std::vector<RankTraffic>();
  }
  // The buffers the runtime allocates for this job's options; a custom
  // gather function is the trainer's, unknown here.
  BucketLayoutOptions options;
  options.form_update = memory.form_update;
  options.bf16_exchange = ExchangeIsBf16(job.layout.execution);
  options.row_state = memory.row_state;
  const std::vector<MatrixGeometry> geometry = JobGeometry(job);
  std::vector<RankTraffic> t(world);
  for (int r = 0; r < world; ++r) {
    MUON_ASSIGN_OR_RETURN(t[r], RankTrafficOf(plan, geometry, options, r));
  }
  for (const MatrixLayout& m : job.layout.matrices) {
    const int bytes = memory.momentum_element_bytes.empty()
                          ? 4
                          : memory.momentum_element_bytes[m.param_index];
    for (int r = 0; r < world; ++r) t[r].momentum += bytes * m.boxes[r].numel();
  }
  for (int r = 0; r < world; ++r) t[r].peak = t[r].momentum + t[r].peak_buffer;
  return t;
}

namespace {

using Json = nlohmann::ordered_json;

// Text for HTML element content and attribute values.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

constexpr int kWidth = 960;  // SVG width, px
constexpr int kLeft = 64;    // left margin (axis labels)
constexpr int kRight = 16;
constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#59a14f",
                                   "#e15759", "#76b7b2", "#edc948"};

// A bar chart: for each rank, one bar per series (value[series][rank]),
// with an optional horizontal line at `line` (0 = none).
std::string Bars(const std::string& title, const std::string& unit,
                 const std::vector<std::string>& series,
                 const std::vector<std::vector<double>>& values, double line,
                 const std::string& line_label) {
  const int ranks = values.empty() ? 0 : static_cast<int>(values[0].size());
  double top = line;
  for (const auto& v : values) {
    for (double x : v) top = std::max(top, x);
  }
  if (!(top > 0)) top = 1;
  const int height = 270, plot = 200;
  const int base = plot + 40;  // the x axis; the legend sits above the bars
  const double slot =
      static_cast<double>(kWidth - kLeft - kRight) / std::max(1, ranks);
  const double bar =
      std::max(0.5, slot * 0.8 / std::max<size_t>(1, series.size()));
  std::string svg = absl::StrFormat(
      "<h2>%s</h2>\n<svg width=\"%d\" height=\"%d\" role=\"img\">\n",
      Escape(title), kWidth, height + 20);
  svg += absl::StrFormat(
      "<text x=\"4\" y=\"14\" class=\"axis\">%s</text>\n"
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>\n",
      Escape(unit == "B" ? Bytes(top) : Flops(top)), kLeft, base,
      kWidth - kRight, base);
  for (size_t k = 0; k < values.size(); ++k) {
    for (int r = 0; r < ranks; ++r) {
      const double h = plot * values[k][r] / top;
      svg += absl::StrFormat(
          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
          "fill=\"%s\"><title>rank %d, %s: %s</title></rect>\n",
          kLeft + r * slot + k * bar, base - h, bar, h, kColors[k % 6], r,
          Escape(series[k]),
          Escape(unit == "B" ? Bytes(values[k][r]) : Flops(values[k][r])));
    }
  }
  if (line > 0) {
    const double y = base - plot * line / top;
    svg += absl::StrFormat(
        "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" "
        "class=\"bound\"/><text x=\"%d\" y=\"%.1f\" "
        "class=\"axis\">%s</text>\n",
        kLeft, y, kWidth - kRight, y, kLeft + 4, y - 3, Escape(line_label));
  }
  // Legend and rank labels (every rank up to 32, else every 8th).
  for (size_t k = 0; k < series.size(); ++k) {
    svg += absl::StrFormat(
        "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
        "<text x=\"%d\" y=\"%d\" class=\"axis\">%s</text>\n",
        kWidth - 220, 4 + 14 * static_cast<int>(k), kColors[k % 6],
        kWidth - 206, 13 + 14 * static_cast<int>(k), Escape(series[k]));
  }
  const int every = ranks <= 32 ? 1 : 8;
  for (int r = 0; r < ranks; r += every) {
    svg +=
        absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"axis\">%d</text>\n",
                        kLeft + r * slot, base + 14, r);
  }
  return svg + "</svg>\n";
}

// Step time (ms) over steps, one polyline per rank.
std::string StepTimes(const std::map<int, std::map<int64_t, double>>& ms) {
  double top = 0;
  int64_t first = -1, last = -1;
  for (const auto& [rank, steps] : ms) {
    for (const auto& [step, t] : steps) {
      top = std::max(top, t);
      first = first < 0 ? step : std::min(first, step);
      last = std::max(last, step);
    }
  }
  if (!(top > 0)) top = 1;
  const int plot = 200;
  const double span = std::max<int64_t>(1, last - first);
  std::string svg = absl::StrFormat(
      "<h2>Step time per rank</h2>\n<svg width=\"%d\" height=\"%d\">\n"
      "<text x=\"4\" y=\"14\" class=\"axis\">%.3g ms</text>\n"
      "<text x=\"%d\" y=\"%d\" class=\"axis\">step %d</text>"
      "<text x=\"%d\" y=\"%d\" class=\"axis\">step %d</text>\n",
      kWidth, plot + 30, top, kLeft, plot + 26, first, kWidth - 80, plot + 26,
      last);
  int k = 0;
  for (const auto& [rank, steps] : ms) {
    std::string points;
    for (const auto& [step, t] : steps) {
      absl::StrAppendFormat(
          &points, "%.1f,%.1f ",
          kLeft + (kWidth - kLeft - kRight) * (step - first) / span,
          plot + 10 - plot * t / top);
    }
    svg += absl::StrFormat(
        "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
        "stroke-width=\"2\"><title>rank %d</title></polyline>\n",
        points, kColors[k++ % 6], rank);
  }
  return svg + "</svg>\n";
}

// Color index of an operation kind in kColors (4 for one unknown here).
int OpColor(v1::OpKind op) {
  switch (op) {
    case v1::OP_KIND_GATHER:
      return 0;
    case v1::OP_KIND_ORTHOGONALIZE:
      return 1;
    case v1::OP_KIND_REDISTRIBUTE:
      return 2;
    case v1::OP_KIND_APPLY:
      return 3;
    default:
      return 4;
  }
}

// The stream a timing was recorded on (reports without one ran on "main").
v1::StreamKind StreamOf(const v1::OpTiming& op) {
  return op.stream() == v1::STREAM_KIND_UNSPECIFIED ? v1::STREAM_KIND_MAIN
                                                    : op.stream();
}

using TimelineRow = std::pair<int, v1::StreamKind>;  // (rank, stream)

// The timeline's rows and time axis: one row per (rank, stream) of each
// rank's last reported step, each rank's step on its own clock (times from
// its first operation's start), and the longest step in seconds.
struct TimelineAxes {
  std::map<int, const v1::StepReport*> last;  // per rank
  std::vector<TimelineRow> rows;
  std::map<int, double> start_of;  // per rank, seconds since the epoch
  double t1 = 0;                   // seconds
};

TimelineAxes MakeTimelineAxes(const std::vector<v1::StepReport>& reports) {
  TimelineAxes axes;
  for (const v1::StepReport& r : reports) {
    auto it = axes.last.find(r.rank());
    if (it == axes.last.end() || it->second->step() < r.step()) {
      axes.last[r.rank()] = &r;
    }
  }
  for (const auto& [rank, r] : axes.last) {
    std::set<v1::StreamKind> streams;
    for (const v1::OpTiming& op : r->ops()) streams.insert(StreamOf(op));
    for (v1::StreamKind s : streams) axes.rows.push_back({rank, s});
    if (r->ops().empty()) continue;
    double start = r->ops(0).start_s(), end = r->ops(0).end_s();
    for (const v1::OpTiming& op : r->ops()) {
      start = std::min(start, op.start_s());
      end = std::max(end, op.end_s());
    }
    axes.start_of[rank] = start;
    axes.t1 = std::max(axes.t1, end - start);
  }
  return axes;
}

// One rank's operations as rectangles on their rows, with hatched waits
// between consecutive operations of a stream. `scale`: pixels per second.
std::string RankTimeline(int rank, const v1::StepReport& r, double start,
                         const std::map<TimelineRow, int>& row_of, int row_h,
                         double scale) {
  std::string svg;
  std::map<v1::StreamKind, double> stream_end;  // waits: gaps in a stream
  for (const v1::OpTiming& op : r.ops()) {
    const v1::StreamKind stream = StreamOf(op);
    const std::string stream_name = WireName(stream);
    const int y = 20 + row_of.at({rank, stream}) * row_h;
    const double x0 = op.start_s() - start, x1 = op.end_s() - start;
    auto prev = stream_end.find(stream);
    if (prev != stream_end.end() && x0 > prev->second) {
      svg += absl::StrFormat(
          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
          "fill=\"url(#wait)\"><title>rank %d %s: wait %.3f ms</title>"
          "</rect>\n",
          kLeft + 40 + prev->second * scale, y, (x0 - prev->second) * scale,
          row_h - 4, rank, stream_name, (x0 - prev->second) * 1e3);
    }
    stream_end[stream] =
        std::max(x1, prev == stream_end.end() ? x1 : prev->second);
    svg += absl::StrFormat(
        "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
        "fill=\"%s\"><title>rank %d %s bucket %d: %s %.3f ms</title>"
        "</rect>\n",
        kLeft + 40 + x0 * scale, y, std::max(0.5, (x1 - x0) * scale), row_h - 4,
        kColors[OpColor(op.op())], rank, stream_name, op.bucket(),
        WireName(op.op()), (x1 - x0) * 1e3);
  }
  return svg;
}

// The legend under the timeline: one swatch per operation kind and the
// wait hatching, on the baseline of a timeline `height` pixels high.
std::string TimelineLegend(int height) {
  std::string svg;
  int k = 0;
  for (v1::OpKind op : SpecifiedValues<v1::OpKind>()) {
    svg += absl::StrFormat(
        "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
        "<text x=\"%d\" y=\"%d\" class=\"axis\">%s</text>\n",
        kLeft + 120 * k, height - 12, kColors[OpColor(op)],
        kLeft + 120 * k + 14, height - 3, WireName(op));
    ++k;
  }
  svg += absl::StrFormat(
      "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" "
      "fill=\"url(#wait)\"/><text x=\"%d\" y=\"%d\" "
      "class=\"axis\">wait</text>\n",
      kLeft + 480, height - 12, kLeft + 494, height - 3);
  return svg;
}

// The last reported step of each rank: one row per (rank, stream), one
// rectangle per operation, hatched waits between consecutive operations.
std::string Timeline(const std::vector<v1::StepReport>& reports) {
  const TimelineAxes axes = MakeTimelineAxes(reports);
  if (axes.start_of.empty()) return "";
  const int row_h = 18;
  const int height = static_cast<int>(axes.rows.size()) * row_h + 40;
  const double scale = (kWidth - kLeft - kRight - 40) / std::max(axes.t1, 1e-9);
  std::string svg = absl::StrFormat(
      "<h2>Step timeline (each rank's last reported step, from its start)"
      "</h2>\n<svg width=\"%d\" height=\"%d\">\n"
      "<defs><pattern id=\"wait\" width=\"6\" height=\"6\" "
      "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
      "<rect width=\"3\" height=\"6\" fill=\"#bbb\"/></pattern></defs>\n",
      kWidth + 40, height);
  std::map<TimelineRow, int> row_of;
  for (size_t i = 0; i < axes.rows.size(); ++i) {
    row_of[axes.rows[i]] = static_cast<int>(i);
    svg +=
        absl::StrFormat("<text x=\"4\" y=\"%d\" class=\"axis\">%d %s</text>\n",
                        20 + static_cast<int>(i) * row_h + 12,
                        axes.rows[i].first, WireName(axes.rows[i].second));
  }
  for (const auto& [rank, r] : axes.last) {
    if (r->ops().empty()) continue;
    svg += RankTimeline(rank, *r, axes.start_of.at(rank), row_of, row_h, scale);
  }
  return svg + TimelineLegend(height) + "</svg>\n";
}

// Per rank (index = rank): the bytes it sends and receives per step, in
// the job's exchange dtype.
void ExchangeBytes(const ReportInput& in, std::vector<double>* sent,
                   std::vector<double>* received) {
  for (const RankTraffic& t : in.traffic) {
    // The bytes of the job's exchange dtype.
    const bool bf16 = ExchangeIsBf16(in.plan.layout.execution);
    sent->push_back(static_cast<double>(bf16 ? t.sent_bf16 : t.sent));
    received->push_back(
        static_cast<double>(bf16 ? t.received_bf16 : t.received));
  }
}

// The report's numbers as JSON, embedded in the page for scripts: the
// plan, per-rank loads and bytes, and step times per rank and step.
Json ReportData(const ReportInput& in, const std::vector<double>& chosen,
                const std::vector<double>& rr, const std::vector<double>& sent,
                const std::vector<double>& received,
                const std::map<int, std::map<int64_t, double>>& step_ms) {
  const v1::Plan& plan = in.plan.plan;
  Json data = {{"plan_hash", plan.hash()},
               {"policy", plan.policy()},
               {"world_size", plan.world_size()},
               {"matrices", plan.matrices_size()},
               {"ns_flops", chosen},
               {"round_robin_ns_flops", rr},
               {"lower_bound_flops", in.lower_bound_flops},
               {"bytes_sent", sent},
               {"bytes_received", received}};
  Json steps = Json::object();
  for (const auto& [rank, s] : step_ms) {
    Json per = Json::object();
    for (const auto& [step, ms] : s) per[std::to_string(step)] = ms;
    steps[std::to_string(rank)] = std::move(per);
  }
  data["step_time_ms"] = std::move(steps);
  return data;
}

// The page's head (title, styles) and its heading and summary paragraph:
// the plan's source, size, policy and balance.
std::string ReportHeader(const ReportInput& in) {
  const v1::Plan& plan = in.plan.plan;
  std::string html =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\n"
      "<title>muon report</title>\n<style>\n"
      "body{font-family:sans-serif;margin:24px;background:#fff;color:#222}\n"
      ".axis{font-size:11px;fill:#555;stroke:#555}\n"
      "text.axis{stroke:none}\n"
      ".bound{stroke:#e15759;stroke-dasharray:6 4;stroke-width:2}\n"
      "</style></head><body>\n";
  const double mean = plan.mean_load_flops();
  absl::StrAppendFormat(
      &html,
      "<h1>muon plan %s</h1>\n<p>%s: %d matrices over %d ranks (mesh %s), "
      "policy %s, %d bucket%s; max/mean %.3f, max/lower bound %.3f; "
      "round-robin max/mean %.3f.</p>\n",
      Escape(plan.hash()), Escape(in.source), plan.matrices_size(),
      plan.world_size(), Escape(in.plan.layout.mesh.ToString()),
      Escape(plan.policy()), plan.buckets_size(),
      plan.buckets_size() == 1 ? "" : "s",
      mean > 0 ? plan.max_load_flops() / mean : 0,
      in.lower_bound_flops > 0 ? plan.max_load_flops() / in.lower_bound_flops
                               : 0,
      in.round_robin.mean_load_flops() > 0
          ? in.round_robin.max_load_flops() / in.round_robin.mean_load_flops()
          : 0);
  return html;
}

}  // namespace

absl::StatusOr<std::string> RenderReportHtml(const ReportInput& in) {
  const v1::Plan& plan = in.plan.plan;
  const int world = plan.world_size();
  if (world < 0 || world > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan ", plan.hash(), " has world size ", world,
                     "; a report needs 0 to ", kMaxWorldSize, " ranks"));
  }
  std::vector<double> chosen(world, 0), rr(world, 0);
  for (const v1::RankLoad& l : plan.loads()) {
    if (l.rank() < 0 || l.rank() >= world) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan ", plan.hash(), " has a load of rank ", l.rank(),
          ", outside its world size ", world, " (ranks 0 to ", world - 1, ")"));
    }
    chosen[l.rank()] = l.ns_flops();
  }
  for (const v1::RankLoad& l : in.round_robin.loads()) {
    if (l.rank() >= 0 && l.rank() < world) rr[l.rank()] = l.ns_flops();
  }
  std::vector<double> sent, received;
  ExchangeBytes(in, &sent, &received);
  std::map<int, std::map<int64_t, double>> step_ms;
  for (const v1::StepReport& r : in.reports) {
    step_ms[r.rank()][r.step()] = r.step_time_s() * 1e3;
  }
  const Json data = ReportData(in, chosen, rr, sent, received, step_ms);
  std::string html = ReportHeader(in);
  html += Bars("Newton-Schulz load per rank (FLOPs per step)", "FLOP",
               {plan.policy(), "round_robin"}, {chosen, rr},
               in.lower_bound_flops, "lower bound");
  if (!in.traffic.empty()) {
    html += Bars("Bytes per rank per step (gather + redistribute)", "B",
                 {"sent", "received"}, {sent, received}, 0, "");
  }
  if (!step_ms.empty()) html += StepTimes(step_ms);
  html += Timeline(in.reports);
  html += "<script type=\"application/json\" id=\"muon-report-data\">\n" +
          data.dump() + "\n</script>\n</body></html>\n";
  return html;
}

}  // namespace muon
