// The CUDA Newton-Schulz path's call comparison, MUON_NS_CUDA_GRAPHS and graph
// cache (kernels/cuda/ns_graph_cache.h), without a GPU: a graph is only
// replayed for a call whose every argument and option equals the captured
// one's, and the cache hands back each graph it stops holding exactly once.
#include "kernels/cuda/ns_graph_cache.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"

namespace muon {
namespace kernels {
namespace cuda {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

struct Call {
  const float* u;
  float* out;
  int64_t batch = 2, rows = 1024, cols = 4096;
  GpuPrecision precision = GpuPrecision::kBf16;
  NewtonSchulzOptions options;
  NsCall View() const {
    return {u, out, batch, rows, cols, precision, &options};
  }
};

bool Same(const Call& x, const Call& y) {
  return SameGraphCall(x.View(), y.View());
}

TEST(SameGraphCallTest, EqualCalls_Same_AnyArgumentOrOptionChanged_Differs) {
  float u[4], out[4];
  const Call base{u, out};
  EXPECT_TRUE(Same(base, Call(base)));
  std::vector<Call> changed(15, base);
  changed[0].u = u + 1;
  changed[1].out = out + 1;
  changed[2].batch = 3;
  changed[3].rows = 4096;
  changed[4].rows = 4096;  // the transposed shape
  changed[4].cols = 1024;
  changed[5].precision = GpuPrecision::kFp32;
  changed[6].options.a = std::nextafter(base.options.a, 4.0);
  changed[7].options.b += 1;
  changed[8].options.c += 1;
  changed[9].options.eps = 1e-6;
  changed[10].options.steps = 6;
  changed[11].options.norm_scale = 1.01;
  changed[12].options.method = NewtonSchulzMethod::kGram;
  changed[13].options.gram_restart_every = 3;
  changed[14].options.coefficients = {{3.0, -4.0, 2.0}};
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_FALSE(Same(changed[i], base)) << "change " << i;
    EXPECT_FALSE(Same(base, changed[i])) << "change " << i;
  }
  // Schedules that differ only in their last coefficient, or in length.
  Call one = base, other = base;
  one.options.coefficients = {{3.0, -4.0, 2.0}, {3.0, -4.0, 2.0}};
  other.options.coefficients = {{3.0, -4.0, 2.0}, {3.0, -4.0, 2.5}};
  EXPECT_FALSE(Same(one, other));
  other.options.coefficients.back() = one.options.coefficients.back();
  EXPECT_TRUE(Same(one, other));
  other.options.coefficients.pop_back();
  EXPECT_FALSE(Same(one, other));
  // Equal as doubles, other bits: 0.0 and -0.0.
  Call zero = base, negative_zero = base;
  zero.options.eps = 0.0;
  negative_zero.options.eps = -0.0;
  EXPECT_FALSE(Same(zero, negative_zero));
}

TEST(ParseCudaGraphsTest, OneOnZeroOrUnsetOff_OtherTextRefusedByName) {
  bool on = true;
  EXPECT_EQ(ParseCudaGraphs(nullptr, &on), "");
  EXPECT_FALSE(on);
  on = true;
  EXPECT_EQ(ParseCudaGraphs("", &on), "");
  EXPECT_FALSE(on);
  EXPECT_EQ(ParseCudaGraphs("1", &on), "");
  EXPECT_TRUE(on);
  EXPECT_EQ(ParseCudaGraphs("0", &on), "");
  EXPECT_FALSE(on);
  on = true;
  const std::string error = ParseCudaGraphs("yes", &on);
  EXPECT_THAT(error, HasSubstr("MUON_NS_CUDA_GRAPHS must be 0 or 1"));
  EXPECT_THAT(error, HasSubstr("'yes'"));
  EXPECT_TRUE(on);  // left as it was
}

TEST(NsGraphCacheTest, FindMovesToMostRecent_InsertBeyondCapacityDropsLeast) {
  float u[4], out[4];
  std::vector<Call> calls;
  for (int i = 0; i < 4; ++i) calls.push_back(Call{u + i, out});
  const NsCall a = calls[0].View(), b = calls[1].View(), c = calls[2].View(),
               d = calls[3].View();
  int graphs[4];
  NsGraphCache cache(/*capacity=*/2);
  EXPECT_EQ(cache.Find(a), nullptr);
  EXPECT_EQ(cache.Insert(a, &graphs[0]), nullptr);
  EXPECT_EQ(cache.Insert(b, &graphs[1]), nullptr);
  EXPECT_EQ(cache.Find(a), &graphs[0]);  // now b is the least recent
  EXPECT_EQ(cache.Insert(c, &graphs[2]), &graphs[1]);
  EXPECT_EQ(cache.Find(b), nullptr);
  EXPECT_EQ(cache.Find(a), &graphs[0]);
  EXPECT_EQ(cache.Find(c), &graphs[2]);
  EXPECT_EQ(cache.size(), 2);
  EXPECT_EQ(cache.Insert(d, &graphs[3]), &graphs[0]);  // a, then c used
  EXPECT_THAT(cache.Clear(), UnorderedElementsAre(&graphs[2], &graphs[3]));
  EXPECT_EQ(cache.size(), 0);
  EXPECT_EQ(cache.Find(c), nullptr);
  EXPECT_TRUE(cache.Clear().empty());
}

TEST(NsGraphCacheTest, KeepsItsOwnCopyOfTheOptions_CallersMayChangeTheirs) {
  float u[4], out[4];
  Call call{u, out};
  call.options.coefficients = {{3.0, -4.0, 2.0}, {3.5, -4.5, 2.5}};
  int graph = 0;
  NsGraphCache cache(/*capacity=*/4);
  EXPECT_EQ(cache.Insert(call.View(), &graph), nullptr);
  const Call captured = call;
  // The caller's options change (and their vector moves) after the insert.
  call.options.coefficients.assign(64, {1.0, 1.0, 1.0});
  call.options.a = 2.0;
  EXPECT_EQ(cache.Find(call.View()), nullptr);
  EXPECT_EQ(cache.Find(captured.View()), &graph);
  // Entries keep their options through the moves of later inserts.
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(cache.Insert(Call{u + i, out}.View(), nullptr), nullptr);
  }
  EXPECT_EQ(cache.Find(captured.View()), &graph);
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muon
