// Small job specs and manifests shared by the coordinator tests.
#ifndef MUON_TESTS_SERVER_TEST_SPECS_H_
#define MUON_TESTS_SERVER_TEST_SPECS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/spec.h"
#include "gtest/gtest.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {
namespace testing {

struct TestParam {
  std::string name;
  int64_t rows;
  int64_t cols;
  std::vector<std::string> placements;
  // ParamSpec.sub_mesh, e.g. {{"pp", 1}}.
  std::map<std::string, int> sub_mesh = {};
  // > 0: a 3-D expert stack [experts, rows, cols].
  int64_t experts = 0;
};

// A spec over a mesh of named dims with the given parameters.
inline v1::JobSpec MakeSpec(
    const std::vector<std::pair<std::string, int>>& mesh,
    const std::vector<TestParam>& params) {
  v1::JobSpec spec;
  spec.set_job_id("job");
  for (const auto& [name, size] : mesh) {
    v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
    dim->set_name(name);
    dim->set_size(size);
  }
  for (const TestParam& p : params) {
    v1::ParamSpec* ps = spec.add_params();
    ps->set_name(p.name);
    if (p.experts > 0) ps->add_shape(p.experts);
    ps->add_shape(p.rows);
    ps->add_shape(p.cols);
    for (const std::string& pl : p.placements) ps->add_placements(pl);
    for (const auto& [dim, coord] : p.sub_mesh) {
      (*ps->mutable_sub_mesh())[dim] = coord;
    }
  }
  return spec;
}

// The manifests of a spec (must be valid).
inline std::vector<v1::RankManifest> Manifests(const v1::JobSpec& spec) {
  absl::StatusOr<std::vector<v1::RankManifest>> m = ManifestsFromSpec(spec);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : std::vector<v1::RankManifest>();
}

// fc1 [10, 7] and fc2 [3, 5] sharded on dim 0, fc3 [6, 8] replicated, over
// dp_shard=4.
inline v1::JobSpec FourRankSpec() {
  return MakeSpec({{"dp_shard", 4}}, {{"fc1.weight", 10, 7, {"Shard(0)"}},
                                      {"fc2.weight", 3, 5, {"Shard(0)"}},
                                      {"fc3.weight", 6, 8, {"Replicate()"}}});
}

// Pipeline parallelism: mesh pp=2 x tp=4 (rank = 4*pp + tp); four layers,
// layer l on stage l / 2, each with wq [8, 8] (Shard(0) over tp) and wo
// [8, 6] (Shard(1) over tp): "layers.<l>.attn.wq", "layers.<l>.attn.wo".
inline v1::JobSpec PipelineSpec() {
  std::vector<TestParam> params;
  for (int l = 0; l < 4; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".attn.";
    params.push_back(
        {prefix + "wq", 8, 8, {"Replicate()", "Shard(0)"}, {{"pp", l / 2}}});
    params.push_back(
        {prefix + "wo", 8, 6, {"Replicate()", "Shard(1)"}, {{"pp", l / 2}}});
  }
  return MakeSpec({{"pp", 2}, {"tp", 4}}, params);
}

// Expert parallelism: mesh dp_shard=2 x ep=4 (rank = 4*dp_shard + ep);
// "attn" [8, 8] FSDP over dp_shard, replicated over ep; "experts.w1" a
// stack [8, 6, 4] with Shard(0) over ep (experts 2k, 2k+1 on ep rank k),
// replicated over dp_shard (whole slices local); "experts.w2" [8, 4, 6]
// with Shard(0) over ep and Shard(1) over dp_shard (gathered within
// dp_shard only).
inline v1::JobSpec ExpertSpec() {
  return MakeSpec({{"dp_shard", 2}, {"ep", 4}},
                  {{"attn", 8, 8, {"Shard(0)", "Replicate()"}},
                   {"experts.w1", 6, 4, {"Replicate()", "Shard(0)"}, {}, 8},
                   {"experts.w2", 4, 6, {"Shard(1)", "Shard(0)"}, {}, 8}});
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_SERVER_TEST_SPECS_H_
