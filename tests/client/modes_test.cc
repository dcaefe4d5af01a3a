// Execution modes (async_gpu_parallelism, prefetch_count): sequential debug
// mode and async mode with prefetch 0, 1, 2 give bitwise identical parameters;
// debug mode runs owners in rank order, proved from the timestamps the ranks
// report to the coordinator; buffers stay within (prefetch_count + 1) bucket
// slots.
#include <cblas.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tests/client/rank_threads.h"
#include "tests/client/thread_world.h"

namespace muon {
namespace {

using ::muon::testing::BitwiseEqual;
using ::muon::testing::RandomValues;
using ::muon::testing::RunOnRanks;
using ::muon::testing::ThreadWorld;

constexpr int kWorld = 4;
constexpr int kSteps = 3;

struct Shape {
  std::string name;
  int64_t rows, cols;
};

// 12 matrices: 3 buckets of one matrix per owner with the default bucketing.
std::vector<Shape> Shapes() {
  std::vector<Shape> out;
  for (int i = 0; i < 12; ++i) {
    out.push_back({absl::StrCat("w", i), 8 + (i % 5) * 3, 6 + (i % 4) * 5});
  }
  return out;
}

struct ModeResult {
  std::vector<std::vector<float>> full;  // reassembled parameters
  std::vector<StepStats> last_stats;     // per rank
  std::vector<v1::Plan> plans;           // per rank
};

// Runs kSteps on kWorld ranks (FSDP Shard(0)) in the given mode.
ModeResult RunMode(bool async, int prefetch, ThreadWorld* tw) {
  const Mesh mesh{{"dp_shard"}, {kWorld}};
  const std::vector<Shape> shapes = Shapes();
  ModeResult out;
  out.full.resize(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    out.full[i].assign(shapes[i].rows * shapes[i].cols, 0.0f);
  }
  out.last_stats.resize(kWorld);
  out.plans.resize(kWorld);
  std::vector<absl::Status> st =
      RunOnRanks(kWorld, [&](int rank) -> absl::Status {
        std::vector<Parameter> params(shapes.size());
        std::vector<Parameter*> ptrs;
        std::vector<Box> boxes;
        for (size_t i = 0; i < shapes.size(); ++i) {
          const Box whole{Range{0, shapes[i].rows}, Range{0, shapes[i].cols}};
          absl::StatusOr<Box> box =
              LocalBox(shapes[i].rows, shapes[i].cols, {Placement::Shard(0)},
                       mesh, mesh.Coord(rank));
          if (!box.ok()) return box.status();
          boxes.push_back(*box);
          Parameter& p = params[i];
          p.name = shapes[i].name;
          p.global_shape = {shapes[i].rows, shapes[i].cols};
          p.local_shape = {box->rows.size(), box->cols.size()};
          const std::vector<float> init = RandomValues(whole.numel(), 11 + i);
          p.data.resize(box->numel());
          p.grad.resize(box->numel());
          CopyRegion(init.data(), whole, p.data.data(), *box, *box);
          ptrs.push_back(&p);
        }
        AutoConfigOptions ao;
        ao.fsdp = tw->comm(rank);
        ao.coordinator = tw->client(rank);
        absl::StatusOr<DistributedConfig> config = CreateAutoConfig(ptrs, ao);
        if (!config.ok()) return config.status();
        config->execution.set_async_gpu_parallelism(async);
        config->execution.set_prefetch_count(prefetch);
        absl::StatusOr<std::unique_ptr<Muon>> opt =
            Muon::Create(ptrs, MuonOptions{}, *config);
        if (!opt.ok()) return opt.status();
        for (int s = 0; s < kSteps; ++s) {
          for (size_t i = 0; i < shapes.size(); ++i) {
            const Box whole{Range{0, shapes[i].rows}, Range{0, shapes[i].cols}};
            const std::vector<float> g =
                RandomValues(whole.numel(), 1000 * (s + 1) + i);
            CopyRegion(g.data(), whole, params[i].grad.data(), boxes[i],
                       boxes[i]);
          }
          absl::Status s_ = (*opt)->Step();
          if (!s_.ok()) return s_;
        }
        out.last_stats[rank] = (*opt)->last_step_stats();
        out.plans[rank] = (*opt)->plan();
        for (size_t i = 0; i < shapes.size(); ++i) {
          const Box whole{Range{0, shapes[i].rows}, Range{0, shapes[i].cols}};
          CopyRegion(params[i].data.data(), boxes[i], out.full[i].data(), whole,
                     boxes[i]);
        }
        return absl::OkStatus();
      });
  for (int r = 0; r < kWorld; ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  return out;
}

ModeResult RunModeInNewWorld(bool async, int prefetch) {
  ThreadWorld tw(kWorld);
  EXPECT_TRUE(tw.Connect());
  return RunMode(async, prefetch, &tw);
}

TEST(ModesTest, Step_AsyncPrefetch012_BitwiseEqualToSequential) {
  openblas_set_num_threads(1);
  const ModeResult seq = RunModeInNewWorld(/*async=*/false, 0);
  EXPECT_EQ(seq.plans[0].schedule().mode(), v1::SCHEDULE_MODE_SEQUENTIAL);
  for (int p : {0, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("prefetch ", p));
    const ModeResult async = RunModeInNewWorld(/*async=*/true, p);
    EXPECT_EQ(async.plans[0].schedule().mode(), v1::SCHEDULE_MODE_ASYNC);
    EXPECT_EQ(async.plans[0].schedule().prefetch_count(), p);
    for (size_t i = 0; i < seq.full.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(async.full[i], seq.full[i])) << "matrix " << i;
    }
  }
}

TEST(ModesTest, Step_Async_BuffersWithinPrefetchPlusOneSlots) {
  openblas_set_num_threads(1);
  int64_t slot_bytes = -1;
  for (int p : {0, 1, 2}) {
    SCOPED_TRACE(absl::StrCat("prefetch ", p));
    const ModeResult r = RunModeInNewWorld(/*async=*/true, p);
    for (int rank = 0; rank < kWorld; ++rank) {
      const StepStats& s = r.last_stats[rank];
      EXPECT_GT(s.buffer_bytes, 0);
      EXPECT_LE(s.buffer_bytes, s.buffer_bound_bytes);
    }
    EXPECT_EQ(r.plans[0].schedule().slots(), p + 1);
    // Each extra prefetched bucket costs one slot.
    if (p == 0) {
      slot_bytes = r.last_stats[0].buffer_bytes;
    } else {
      EXPECT_GT(r.last_stats[0].buffer_bytes, slot_bytes);
    }
  }
}

// In debug mode, rank i's orthogonalization of a bucket ends before rank
// i+1's starts.
TEST(ModesTest, Step_DebugMode_OwnersOrthogonalizeInRankOrder) {
  openblas_set_num_threads(1);
  ThreadWorld tw(kWorld);
  ASSERT_TRUE(tw.Connect());
  const ModeResult r = RunMode(/*async=*/false, 0, &tw);
  // The timestamps the ranks reported to the coordinator (the optimizers are
  // gone, so their agents have flushed their queues).
  absl::StatusOr<v1::GetReportsResponse> reports =
      tw.client(0)->GetReports(-1, 0);
  ASSERT_TRUE(reports.ok()) << reports.status();
  // bucket -> rank -> (start, end) of its orthogonalize op, per step.
  std::map<std::pair<int64_t, int>, std::map<int, std::pair<double, double>>>
      ns;
  for (const v1::StepReport& report : reports->reports()) {
    EXPECT_EQ(report.mode(), v1::SCHEDULE_MODE_SEQUENTIAL);
    for (const v1::OpTiming& op : report.ops()) {
      if (op.op() == v1::OP_KIND_ORTHOGONALIZE) {
        ns[{report.step(), op.bucket()}][report.rank()] = {op.start_s(),
                                                           op.end_s()};
      }
    }
  }
  ASSERT_EQ(ns.size(), static_cast<size_t>(kSteps * r.plans[0].buckets_size()));
  int shared_buckets = 0;  // buckets where several ranks orthogonalize
  for (const auto& [key, by_rank] : ns) {
    SCOPED_TRACE(absl::StrCat("step ", key.first, " bucket ", key.second));
    shared_buckets += by_rank.size() >= 2;
    double previous_end = 0;
    int previous_rank = -1;
    for (const auto& [rank, interval] : by_rank) {
      EXPECT_LE(interval.first, interval.second);
      if (previous_rank >= 0) {
        EXPECT_LT(previous_end, interval.first)
            << "rank " << previous_rank << " must finish before rank " << rank
            << " starts";
      }
      previous_end = interval.second;
      previous_rank = rank;
    }
  }
  EXPECT_GE(shared_buckets, kSteps);  // the ordering was exercised
}

}  // namespace
}  // namespace muon
