// Small job specs and manifests shared by the coordinator tests.
#ifndef MUON_TESTS_SERVER_TEST_SPECS_H_
#define MUON_TESTS_SERVER_TEST_SPECS_H_

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
    ps->add_shape(p.rows);
    ps->add_shape(p.cols);
    for (const std::string& pl : p.placements) ps->add_placements(pl);
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

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_SERVER_TEST_SPECS_H_
