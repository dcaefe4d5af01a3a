// The harness of the checkpoint tests (checkpoint_test.cc: writing,
// reading under other layouts, the files' format; checkpoint_corruption_
// test.cc: damaged and mismatched files): global tensors with known values,
// their shards per layout, writing every rank's file, and editing a rank
// file's header or metadata.json in place.
#ifndef MUON_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
#define MUON_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/safetensors_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace checkpoint_testing {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory path (not created) unique to the running test.
inline std::string TestDir(const std::string& suffix = "ckpt") {
  const char* env = std::getenv("TEST_TMPDIR");
  const std::string base = env != nullptr ? env : ::testing::TempDir();
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(base, "/", info->test_suite_name(), ".", info->name(),
                      "/", suffix);
}

inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Distinct values per element, so any misplaced element shows.
inline std::vector<float> MakeGlobal(const std::vector<int64_t>& shape) {
  std::vector<float> v(Numel(shape));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(i) * 0.5f - 7.25f;
  }
  return v;
}

// The row-major region `box` of a row-major tensor of `shape`.
inline std::vector<float> Slice(const std::vector<float>& global,
                                const std::vector<int64_t>& shape,
                                const std::vector<Range>& box) {
  const int n = static_cast<int>(shape.size());
  int64_t numel = 1;
  for (const Range& r : box) numel *= r.size();
  std::vector<float> out;
  out.reserve(numel);
  if (numel == 0) return out;
  std::vector<int64_t> idx(n);
  for (int d = 0; d < n; ++d) idx[d] = box[d].begin;
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < n; ++d) flat = flat * shape[d] + idx[d];
    out.push_back(global[flat]);
    int d = n - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < box[d].end) break;
      idx[d] = box[d].begin;
    }
    if (d < 0) break;
  }
  return out;
}

inline std::vector<Range> FullBox(const std::vector<int64_t>& shape) {
  std::vector<Range> box;
  for (int64_t d : shape) box.push_back({0, d});
  return box;
}

// Boxes of every rank (index = rank) for `shape` under `placements`.
inline std::vector<std::vector<Range>> RankBoxes(
    const std::vector<int64_t>& shape,
    const std::vector<std::string>& placements, const Mesh& mesh) {
  std::vector<Placement> parsed;
  for (const std::string& p : placements) {
    absl::StatusOr<Placement> pl = Placement::Parse(p);
    EXPECT_TRUE(pl.ok()) << pl.status();
    parsed.push_back(*pl);
  }
  std::vector<std::vector<Range>> boxes;
  for (int r = 0; r < mesh.world_size(); ++r) {
    absl::StatusOr<std::vector<Range>> box =
        LocalRanges(shape, parsed, mesh, mesh.Coord(r));
    EXPECT_TRUE(box.ok()) << box.status();
    boxes.push_back(*box);
  }
  return boxes;
}

// A global tensor to save, laid out by placements over the metadata's mesh.
struct GlobalTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> placements;
  std::vector<float> data;
};

inline CheckpointMetadata Meta(const Mesh& mesh, int64_t step = 7) {
  CheckpointMetadata meta;
  meta.world_size = mesh.world_size();
  meta.mesh = mesh;
  meta.plan_hash = "plan-abc123";
  meta.step = step;
  return meta;
}

// Every rank writes its shard (as a job would); rank 0 writes metadata.json.
inline void SaveAll(const std::string& dir, const CheckpointMetadata& meta,
                    const std::vector<GlobalTensor>& tensors) {
  std::vector<std::vector<float>> keep;  // local copies outlive the views
  for (int r = 0; r < meta.world_size; ++r) {
    std::vector<ShardTensorView> views;
    keep.clear();
    keep.reserve(tensors.size());
    for (const GlobalTensor& t : tensors) {
      const std::vector<Range> box =
          RankBoxes(t.shape, t.placements, meta.mesh)[r];
      keep.push_back(Slice(t.data, t.shape, box));
      views.push_back({t.name, t.shape, t.placements, box, keep.back().data()});
    }
    ASSERT_THAT(WriteCheckpointShard(dir, r, meta, views), IsOk());
    if (r == 0) {
      ASSERT_THAT(WriteCheckpointMetadata(dir, meta, views), IsOk());
    }
  }
}

inline std::unique_ptr<CheckpointReader> OpenOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir);
  EXPECT_THAT(reader, IsOk());
  return reader.ok() ? std::move(*reader) : nullptr;
}

// Reads, under `placements` over `mesh`, every rank's box of `t` and
// compares it with the global tensor's slice.
inline void ExpectReshardedReadsMatch(
    const CheckpointReader& reader, const GlobalTensor& t,
    const std::vector<std::string>& placements, const Mesh& mesh) {
  const auto boxes = RankBoxes(t.shape, placements, mesh);
  for (size_t r = 0; r < boxes.size(); ++r) {
    const std::vector<float> want = Slice(t.data, t.shape, boxes[r]);
    std::vector<float> got(want.size(), std::nanf(""));
    ASSERT_THAT(reader.ReadRegion(t.name, t.shape, boxes[r], got.data()),
                IsOk())
        << "rank " << r;
    EXPECT_EQ(got, want) << "rank " << r;
  }
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A rank file's bytes as its parsed JSON header, the header's length and
// the data section.
struct ParsedFile {
  json header;
  uint64_t header_len = 0;
  std::string data;
};

inline ParsedFile ParseFile(const std::string& bytes) {
  ::muon::testing::SafetensorsParts parts =
      ::muon::testing::SplitSafetensors(bytes);
  return {json::parse(parts.header, nullptr, false), parts.header.size(),
          std::move(parts.data)};
}

// Rewrites the JSON header of safetensors file `path` with `edit`.
inline void EditHeader(const std::string& path,
                       const std::function<void(json&)>& edit) {
  const ::muon::testing::SafetensorsParts st =
      ::muon::testing::SplitSafetensors(ReadFile(path));
  json header = json::parse(st.header, nullptr, false);
  ASSERT_FALSE(header.is_discarded());
  edit(header);
  WriteFile(path, ::muon::testing::JoinSafetensors(header.dump(), st.data));
}

inline void EditMetadataJson(const std::string& dir,
                             const std::function<void(json&)>& edit) {
  const std::string path = dir + "/metadata.json";
  json root = json::parse(ReadFile(path), nullptr, false);
  ASSERT_FALSE(root.is_discarded());
  edit(root);
  WriteFile(path, root.dump());
}

// A small valid checkpoint: tensor "w" [10, 6] Shard(0) over 4 ranks
// (rows 3,3,3,1), step 7.
struct SmallCheckpoint {
  std::string dir;
  GlobalTensor w;
};

inline SmallCheckpoint MakeSmallCheckpoint() {
  SmallCheckpoint c;
  c.dir = TestDir();
  c.w = {"w", {10, 6}, {"Shard(0)"}, MakeGlobal({10, 6})};
  SaveAll(c.dir, Meta(Mesh::OneDim(4)), {c.w});
  return c;
}

}  // namespace checkpoint_testing
}  // namespace muon

#endif  // MUON_TESTS_CHECKPOINT_CHECKPOINT_TEST_UTIL_H_
