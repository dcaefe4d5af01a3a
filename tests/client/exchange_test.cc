// The data movement of a distributed step, observed on the wire: per bucket
// exactly one all-to-all(v) toward the owners and one back, on every rank;
// split sizes exact (no padding); the gather delivers to an owner only the
// elements of its own matrices it does not already hold, and nothing to a
// rank that owns nothing in the bucket (no rank receives a full matrix it
// does not own); the redistribution delivers each holder exactly its box.
#include <cblas.h>

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

using ::muon::testing::RandomValues;
using ::muon::testing::RunOnRanks;
using ::muon::testing::ThreadWorld;

// Forwards to another communicator, recording every AllToAllV's counts.
class RecordingCommunicator : public Communicator {
 public:
  struct Call {
    std::vector<int64_t> send_counts;
    std::vector<int64_t> recv_counts;
  };
  explicit RecordingCommunicator(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  absl::Status AllToAllV(const float* send, const std::vector<int64_t>& sc,
                         float* recv, const std::vector<int64_t>& rc) override {
    calls.push_back({sc, rc});
    return inner_->AllToAllV(send, sc, recv, rc);
  }
  absl::Status AllGatherV(const float* send, int64_t n, float* recv,
                          const std::vector<int64_t>& rc) override {
    return inner_->AllGatherV(send, n, recv, rc);
  }
  absl::Status Broadcast(float* data, int64_t n, int root) override {
    return inner_->Broadcast(data, n, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  void Abort() override { inner_->Abort(); }

  std::vector<Call> calls;

 private:
  Communicator* inner_;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // 2-D, or 3-D expert stack
  std::vector<Placement> placements;
};

int64_t Total(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

// Runs one step on every rank and checks the recorded exchanges against
// the plan and the layout.
void CheckExchanges(const Mesh& mesh, const std::vector<TensorSpec>& specs,
                    int64_t bucket_size_bytes) {
  openblas_set_num_threads(1);
  const int world = mesh.world_size();
  ThreadWorld tw(world);
  ASSERT_TRUE(tw.Connect());
  std::vector<std::unique_ptr<RecordingCommunicator>> rec;
  for (int r = 0; r < world; ++r) {
    rec.push_back(std::make_unique<RecordingCommunicator>(tw.comm(r)));
  }
  // Matrices of every tensor with every rank's box, keyed by (name, slice).
  std::map<std::pair<std::string, int>, MatrixBoxes> matrices;
  for (const TensorSpec& t : specs) {
    absl::StatusOr<std::vector<MatrixBoxes>> mb =
        ParamMatrices(t.shape, t.placements, mesh);
    ASSERT_TRUE(mb.ok()) << mb.status();
    for (MatrixBoxes& m : *mb) matrices[{t.name, m.slice}] = m;
  }
  std::vector<v1::Plan> plans(world);
  std::vector<absl::Status> st =
      RunOnRanks(world, [&](int rank) -> absl::Status {
        std::vector<Parameter> params(specs.size());
        std::vector<Parameter*> ptrs;
        std::vector<ParamPlacement> placements;
        for (size_t i = 0; i < specs.size(); ++i) {
          absl::StatusOr<std::vector<Range>> ranges = LocalRanges(
              specs[i].shape, specs[i].placements, mesh, mesh.Coord(rank));
          if (!ranges.ok()) return ranges.status();
          Parameter& p = params[i];
          p.name = specs[i].name;
          p.global_shape = specs[i].shape;
          p.expert_stack = specs[i].shape.size() == 3;
          for (const Range& x : *ranges) p.local_shape.push_back(x.size());
          p.data = RandomValues(p.local_numel(), 7 + i);
          p.grad = RandomValues(p.local_numel(), 100 + i);
          ptrs.push_back(&p);
          placements.push_back(ParamPlacement{specs[i].placements, {}});
        }
        absl::StatusOr<DistributedConfig> config = CreateMeshConfig(
            mesh, placements, rec[rank].get(), tw.client(rank));
        if (!config.ok()) return config.status();
        config->execution.set_bucket_size_bytes(bucket_size_bytes);
        absl::StatusOr<std::unique_ptr<Muon>> opt =
            Muon::Create(ptrs, MuonOptions{}, *config);
        if (!opt.ok()) return opt.status();
        plans[rank] = (*opt)->plan();
        return (*opt)->Step();
      });
  for (int r = 0; r < world; ++r)
    ASSERT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
  const v1::Plan& plan = plans[0];
  ASSERT_GT(plan.buckets_size(), 0);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    // One all-to-all(v) each way per bucket, the same number on every rank.
    ASSERT_EQ(rec[r]->calls.size(), 2u * plan.buckets_size());
  }
  for (int b = 0; b < plan.buckets_size(); ++b) {
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("bucket ", b, ", rank ", r));
      int64_t want_gather = 0, want_back = 0;
      for (int mi : plan.buckets(b).matrices()) {
        const v1::MatrixPlan& m = plan.matrices(mi);
        const MatrixBoxes& mb = matrices.at({m.param(), m.slice()});
        if (m.owner() == r) {
          want_gather += mb.rows * mb.cols - mb.boxes[r].numel();
        } else {
          want_back += mb.boxes[r].numel();
        }
      }
      const auto& gather = rec[r]->calls[2 * b];
      const auto& back = rec[r]->calls[2 * b + 1];
      EXPECT_EQ(Total(gather.recv_counts), want_gather);
      EXPECT_EQ(Total(back.recv_counts), want_back);
      // Exact splits: what r sends to q is what q expects from r.
      for (int q = 0; q < world; ++q) {
        EXPECT_EQ(gather.send_counts[q], rec[q]->calls[2 * b].recv_counts[r]);
        EXPECT_EQ(back.send_counts[q], rec[q]->calls[2 * b + 1].recv_counts[r]);
      }
      EXPECT_EQ(gather.recv_counts[r], 0) << "no self-traffic through the wire";
    }
  }
}

const Placement kR = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }

TEST(ExchangeTest,
     Step_FsdpFourRanks_ExactSplitsOwnersReceiveOnlyMissingElements) {
  CheckExchanges(Mesh{{"dp_shard"}, {4}},
                 {{"a", {10, 7}, {S(0)}},
                  {"b", {3, 5}, {S(0)}},
                  {"c", {12, 16}, {S(1)}},
                  {"d", {16, 12}, {S(0)}},
                  {"e", {5, 9}, {S(1)}}},
                 /*bucket_size_bytes=*/0);
}

TEST(ExchangeTest, Step_DdpFourRanks_NoGatherTrafficResultsToEveryReplica) {
  CheckExchanges(
      Mesh{{"dp_replicate"}, {4}},
      {{"a", {10, 7}, {kR}}, {"b", {12, 16}, {kR}}, {"c", {6, 6}, {kR}}},
      /*bucket_size_bytes=*/0);
}

TEST(ExchangeTest, Step_TpHsdpEightRanksLargeBuckets_ExactSplits) {
  CheckExchanges(Mesh{{"dp_replicate", "dp_shard", "tp"}, {2, 2, 2}},
                 {{"q", {12, 12}, {kR, S(0), S(0)}},
                  {"o", {12, 10}, {kR, S(0), S(1)}},
                  {"up", {20, 12}, {kR, S(0), S(0)}}},
                 /*bucket_size_bytes=*/4096);
}

TEST(ExchangeTest, Step_EpTpFourRanks_ExpertSlicesNeverCrossEp) {
  CheckExchanges(
      Mesh{{"ep", "tp"}, {2, 2}},
      {{"attn", {12, 12}, {kR, S(0)}}, {"experts", {4, 12, 10}, {S(0), S(1)}}},
      /*bucket_size_bytes=*/0);
}

}  // namespace
}  // namespace muon
