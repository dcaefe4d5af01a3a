// client/checkpoint.h: write per-rank safetensors shards + metadata.json,
// read any box back under another layout (FSDP 4 -> 2, rows -> columns,
// DDP -> sharded, 3-D expert stacks, uneven and empty boxes), the files are
// plain safetensors, and every corruption is reported with its code and the
// file / tensor it concerns.
#include "client/checkpoint.h"

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
#include "common/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/safetensors_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory path (not created) unique to the running test.
std::string TestDir(const std::string& suffix = "ckpt") {
  const char* env = std::getenv("TEST_TMPDIR");
  const std::string base = env != nullptr ? env : ::testing::TempDir();
  const ::testing::TestInfo* info =
      ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(base, "/", info->test_suite_name(), ".", info->name(),
                      "/", suffix);
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Distinct values per element, so any misplaced element shows.
std::vector<float> MakeGlobal(const std::vector<int64_t>& shape) {
  std::vector<float> v(Numel(shape));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(i) * 0.5f - 7.25f;
  }
  return v;
}

// The row-major region `box` of a row-major tensor of `shape`.
std::vector<float> Slice(const std::vector<float>& global,
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

std::vector<Range> FullBox(const std::vector<int64_t>& shape) {
  std::vector<Range> box;
  for (int64_t d : shape) box.push_back({0, d});
  return box;
}

// Boxes of every rank (index = rank) for `shape` under `placements`.
std::vector<std::vector<Range>> RankBoxes(
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

CheckpointMetadata Meta(const Mesh& mesh, int64_t step = 7) {
  CheckpointMetadata meta;
  meta.world_size = mesh.world_size();
  meta.mesh = mesh;
  meta.plan_hash = "plan-abc123";
  meta.step = step;
  return meta;
}

// Every rank writes its shard (as a job would); rank 0 writes metadata.json.
void SaveAll(const std::string& dir, const CheckpointMetadata& meta,
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

std::unique_ptr<CheckpointReader> OpenOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
      CheckpointReader::Open(dir);
  EXPECT_THAT(reader, IsOk());
  return reader.ok() ? std::move(*reader) : nullptr;
}

// Reads, under `placements` over `mesh`, every rank's box of `t` and
// compares it with the global tensor's slice.
void ExpectReshardedReadsMatch(const CheckpointReader& reader,
                               const GlobalTensor& t,
                               const std::vector<std::string>& placements,
                               const Mesh& mesh) {
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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
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

ParsedFile ParseFile(const std::string& bytes) {
  ::muon::testing::SafetensorsParts parts =
      ::muon::testing::SplitSafetensors(bytes);
  return {json::parse(parts.header, nullptr, false), parts.header.size(),
          std::move(parts.data)};
}

// Rewrites the JSON header of safetensors file `path` with `edit`.
void EditHeader(const std::string& path,
                const std::function<void(json&)>& edit) {
  const ::muon::testing::SafetensorsParts st =
      ::muon::testing::SplitSafetensors(ReadFile(path));
  json header = json::parse(st.header, nullptr, false);
  ASSERT_FALSE(header.is_discarded());
  edit(header);
  WriteFile(path, ::muon::testing::JoinSafetensors(header.dump(), st.data));
}

void EditMetadataJson(const std::string& dir,
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

SmallCheckpoint MakeSmallCheckpoint() {
  SmallCheckpoint c;
  c.dir = TestDir();
  c.w = {"w", {10, 6}, {"Shard(0)"}, MakeGlobal({10, 6})};
  SaveAll(c.dir, Meta(Mesh::OneDim(4)), {c.w});
  return c;
}

// ---------------------------------------------------------------------------
// Round trips and resharding.

TEST(CheckpointTest, WriteThenRead_WholeTensor_Bitwise) {
  const std::string dir = TestDir();
  std::vector<float> data = MakeGlobal({4, 5});
  // Values a lossy path would change.
  data[0] = -0.0f;
  data[1] = std::numeric_limits<float>::denorm_min();
  data[2] = std::numeric_limits<float>::infinity();
  data[3] = std::numeric_limits<float>::max();
  uint32_t nan_bits = 0x7fc01234;  // NaN with a payload
  std::memcpy(&data[4], &nan_bits, 4);
  GlobalTensor t{"layers.0.mlp/w:1-a_b", {4, 5}, {"Replicate()"}, data};
  SaveAll(dir, Meta(Mesh::OneDim(1), 42), {t});

  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->metadata().step, 42);
  EXPECT_EQ(reader->metadata().world_size, 1);
  EXPECT_EQ(reader->metadata().plan_hash, "plan-abc123");
  EXPECT_EQ(reader->metadata().mesh, Mesh::OneDim(1));
  EXPECT_EQ(reader->metadata().format_version, kCheckpointFormatVersion);
  EXPECT_THAT(reader->tensor_names(), ElementsAre(t.name));
  EXPECT_THAT(*reader->GlobalShape(t.name), ElementsAre(4, 5));
  EXPECT_THAT(*reader->Placements(t.name), ElementsAre("Replicate()"));

  std::vector<float> got(20, 1.0f);
  ASSERT_THAT(reader->ReadRegion(t.name, {4, 5}, FullBox({4, 5}), got.data()),
              IsOk());
  EXPECT_EQ(std::memcmp(got.data(), data.data(), 20 * sizeof(float)), 0);
}

TEST(CheckpointTest, ReadRegion_FsdpOver4IntoFsdpOver2_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  GlobalTensor w{
      "fc1.weight", {512, 784}, {"Shard(0)"}, MakeGlobal({512, 784})};
  GlobalTensor b{"fc2.weight", {10, 512}, {"Shard(0)"}, MakeGlobal({10, 512})};
  SaveAll(dir, Meta(Mesh::OneDim(4)), {w, b});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  EXPECT_THAT(reader->tensor_names(), ElementsAre("fc1.weight", "fc2.weight"));
  ASSERT_EQ(reader->FindTensor("fc1.weight")->shards.size(), 4u);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(0)"}, Mesh::OneDim(2));
  ExpectReshardedReadsMatch(*reader, b, {"Shard(0)"}, Mesh::OneDim(2));
  // And back to one device.
  ExpectReshardedReadsMatch(*reader, w, {"Replicate()"}, Mesh::OneDim(1));
}

TEST(CheckpointTest, ReadRegion_RowShardsIntoColumnBoxes_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  GlobalTensor w{"w", {37, 23}, {"Shard(0)"}, MakeGlobal({37, 23})};
  SaveAll(dir, Meta(Mesh::OneDim(4)), {w});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(1)"}, Mesh::OneDim(3));
  ExpectReshardedReadsMatch(*reader, w, {"Shard(1)"}, Mesh::OneDim(8));
  // 2-D mesh: rows over tp, columns over dp.
  Mesh mesh{{"tp", "dp"}, {2, 3}};
  ExpectReshardedReadsMatch(*reader, w, {"Shard(0)", "Shard(1)"}, mesh);
}

TEST(CheckpointTest, ReadRegion_ColumnShardsIntoRowShards_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  GlobalTensor w{"w", {16, 30}, {"Shard(1)"}, MakeGlobal({16, 30})};
  SaveAll(dir, Meta(Mesh::OneDim(4)), {w});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(0)"}, Mesh::OneDim(4));
  ExpectReshardedReadsMatch(*reader, w, {"Replicate()"}, Mesh::OneDim(1));
}

TEST(CheckpointTest, ReadRegion_DdpReplicatedIntoSharded_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  GlobalTensor w{"w", {12, 9}, {"Replicate()"}, MakeGlobal({12, 9})};
  SaveAll(dir, Meta(Mesh::OneDim(3)), {w});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  ASSERT_EQ(reader->FindTensor("w")->shards.size(), 3u);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(0)"}, Mesh::OneDim(4));
  ExpectReshardedReadsMatch(*reader, w, {"Shard(1)"}, Mesh::OneDim(2));
}

TEST(CheckpointTest, ReadRegion_HsdpReplicateShard_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  Mesh mesh{{"dp_replicate", "dp_shard"}, {2, 2}};
  GlobalTensor w{"w", {9, 4}, {"Replicate()", "Shard(0)"}, MakeGlobal({9, 4})};
  SaveAll(dir, Meta(mesh), {w});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->metadata().mesh, mesh);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(1)"}, Mesh::OneDim(4));
}

TEST(CheckpointTest, ReadRegion_Replicated_ReadsFromLowestRankOnly) {
  // Each rank claims the same box but saves different values: the reader
  // must take rank 0's and never read the others.
  const std::string dir = TestDir();
  const CheckpointMetadata meta = Meta(Mesh::OneDim(3));
  const std::vector<int64_t> shape = {4, 4};
  std::vector<ShardTensorView> views;
  std::vector<std::vector<float>> data(3, std::vector<float>(16));
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 16; ++i) data[r][i] = 100.0f * r + i;
    views = {{"w", shape, {"Replicate()"}, FullBox(shape), data[r].data()}};
    ASSERT_THAT(WriteCheckpointShard(dir, r, meta, views), IsOk());
  }
  ASSERT_THAT(WriteCheckpointMetadata(dir, meta, views), IsOk());
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> got(4);
  ASSERT_THAT(reader->ReadRegion("w", shape, {{1, 2}, {0, 4}}, got.data()),
              IsOk());
  EXPECT_THAT(got, ElementsAre(4, 5, 6, 7));
}

TEST(CheckpointTest, ReadRegion_PartlyOverlappingShards_EachElementOnce) {
  // Rank 0 holds rows [0,6), rank 1 rows [4,10) (overlap [4,6) with other
  // values): rows 4-5 come from rank 0, rows 6-9 from rank 1.
  const std::string dir = TestDir();
  const CheckpointMetadata meta = Meta(Mesh::OneDim(2));
  const std::vector<int64_t> shape = {10, 2};
  std::vector<float> r0(12), r1(12);
  for (int i = 0; i < 12; ++i) {
    r0[i] = static_cast<float>(i);
    r1[i] = 1000.0f + static_cast<float>(8 + i);
  }
  std::vector<ShardTensorView> v0 = {
      {"w", shape, {"Shard(0)"}, {{0, 6}, {0, 2}}, r0.data()}};
  std::vector<ShardTensorView> v1 = {
      {"w", shape, {"Shard(0)"}, {{4, 10}, {0, 2}}, r1.data()}};
  ASSERT_THAT(WriteCheckpointShard(dir, 0, meta, v0), IsOk());
  ASSERT_THAT(WriteCheckpointShard(dir, 1, meta, v1), IsOk());
  ASSERT_THAT(WriteCheckpointMetadata(dir, meta, v0), IsOk());
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> got(8);
  ASSERT_THAT(reader->ReadRegion("w", shape, {{3, 7}, {0, 2}}, got.data()),
              IsOk());
  EXPECT_THAT(got, ElementsAre(6, 7, 8, 9, 10, 11, 1012, 1013));
}

TEST(CheckpointTest,
     ReadRegion_ExpertStack3dEpIntoTpBoxes_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  // [experts, rows, cols]: saved with experts over ep=4 (Shard(0)), read
  // with rows over 2 and cols over 3, and one expert slice at a time.
  GlobalTensor experts{
      "moe.experts.w1", {8, 6, 10}, {"Shard(0)"}, MakeGlobal({8, 6, 10})};
  GlobalTensor dense{"dense", {6, 5}, {"Shard(1)"}, MakeGlobal({6, 5})};
  SaveAll(dir, Meta(Mesh{{"ep"}, {4}}), {experts, dense});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  ExpectReshardedReadsMatch(*reader, experts, {"Shard(1)", "Shard(2)"},
                            Mesh{{"tp", "dp"}, {2, 3}});
  ExpectReshardedReadsMatch(*reader, experts, {"Shard(0)"}, Mesh::OneDim(3));
  const std::vector<Range> slice = {{5, 6}, {0, 6}, {0, 10}};
  std::vector<float> got(60);
  ASSERT_THAT(
      reader->ReadRegion(experts.name, experts.shape, slice, got.data()),
      IsOk());
  EXPECT_EQ(got, Slice(experts.data, experts.shape, slice));
  ExpectReshardedReadsMatch(*reader, dense, {"Shard(0)"}, Mesh::OneDim(4));
}

TEST(CheckpointTest, ReadRegion_UnevenAndEmptyBoxes_MatchesGlobalTensor) {
  const std::string dir = TestDir();
  // 5 rows over 4 ranks as torch.chunk: 2, 2, 1, 0 (rank 3 saves nothing).
  GlobalTensor w{"w", {5, 3}, {"Shard(0)"}, MakeGlobal({5, 3})};
  // A tensor with a zero-size dim.
  GlobalTensor z{"z", {0, 4}, {"Shard(0)"}, {}};
  SaveAll(dir, Meta(Mesh::OneDim(4)), {w, z});
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  const auto& shards = reader->FindTensor("w")->shards;
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(shards[3].bytes, 0);
  EXPECT_EQ(shards[3].box[0].size(), 0);
  ExpectReshardedReadsMatch(*reader, w, {"Shard(0)"}, Mesh::OneDim(3));
  ExpectReshardedReadsMatch(*reader, w, {"Shard(1)"}, Mesh::OneDim(7));
  // Empty regions read nothing; out may be null.
  EXPECT_THAT(reader->ReadRegion("w", {5, 3}, {{2, 2}, {0, 3}}, nullptr),
              IsOk());
  EXPECT_THAT(reader->ReadRegion("z", {0, 4}, {{0, 0}, {0, 4}}, nullptr),
              IsOk());
}

// ---------------------------------------------------------------------------
// The files themselves.

TEST(CheckpointTest, WriteCheckpointShard_Header_IsValidSafetensors) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string bytes = ReadFile(c.dir + "/rank_1.safetensors");
  ParsedFile st = ParseFile(bytes);
  ASSERT_FALSE(st.header.is_discarded());
  ASSERT_TRUE(st.header.is_object());
  EXPECT_EQ((8 + st.header_len) % 8, 0u) << "data section 8-byte aligned";
  EXPECT_EQ(bytes[8], '{');

  // __metadata__: a string -> string map.
  const json& md = st.header["__metadata__"];
  ASSERT_TRUE(md.is_object());
  for (auto it = md.begin(); it != md.end(); ++it) {
    EXPECT_TRUE(it.value().is_string()) << it.key();
  }
  EXPECT_EQ(md["format"], "muon-checkpoint");
  EXPECT_EQ(md["format_version"], "1");
  EXPECT_EQ(md["rank"], "1");
  EXPECT_EQ(md["step"], "7");
  EXPECT_EQ(md["w.global_shape"], "[10,6]");
  EXPECT_EQ(md["w.offsets"], "[3,0]");
  EXPECT_EQ(md["w.placements"], "[\"Shard(0)\"]");

  // Rank 1 holds rows [3, 6) of the [10, 6] tensor.
  const json& w = st.header["w"];
  EXPECT_EQ(w["dtype"], "F32");
  EXPECT_EQ(w["shape"], json::array({3, 6}));
  EXPECT_EQ(w["data_offsets"], json::array({0, 72}));
  ASSERT_EQ(st.data.size(), 72u);
  std::vector<float> data(18);
  std::memcpy(data.data(), st.data.data(), 72);
  EXPECT_EQ(data, Slice(c.w.data, c.w.shape, {{3, 6}, {0, 6}}));

  // metadata.json.
  json meta = json::parse(ReadFile(c.dir + "/metadata.json"), nullptr, false);
  ASSERT_FALSE(meta.is_discarded());
  EXPECT_EQ(meta["format"], "muon-checkpoint");
  EXPECT_EQ(meta["format_version"], 1);
  EXPECT_EQ(meta["world_size"], 4);
  EXPECT_EQ(meta["mesh"]["names"], json::array({"dp_shard"}));
  EXPECT_EQ(meta["mesh"]["sizes"], json::array({4}));
  EXPECT_EQ(meta["plan_hash"], "plan-abc123");
  EXPECT_EQ(meta["step"], 7);
  EXPECT_EQ(meta["tensors"]["w"]["global_shape"], json::array({10, 6}));
  EXPECT_EQ(meta["tensors"]["w"]["placements"], json::array({"Shard(0)"}));
}

TEST(CheckpointTest, WriteCheckpointShard_TensorsPackedInGivenOrder) {
  const std::string dir = TestDir();
  std::vector<float> a(6, 1.0f), b(4, 2.0f);
  std::vector<ShardTensorView> views = {
      {"zeta", {2, 3}, {"Replicate()"}, {{0, 2}, {0, 3}}, a.data()},
      {"alpha", {4}, {"Replicate()"}, {{0, 4}}, b.data()}};
  ASSERT_THAT(WriteCheckpointShard(dir, 0, Meta(Mesh::OneDim(1)), views),
              IsOk());
  ParsedFile st = ParseFile(ReadFile(dir + "/rank_0.safetensors"));
  EXPECT_EQ(st.header["zeta"]["data_offsets"], json::array({0, 24}));
  EXPECT_EQ(st.header["alpha"]["data_offsets"], json::array({24, 40}));
  EXPECT_EQ(st.data.size(), 40u);
}

TEST(CheckpointTest, WriteCheckpointShard_NameLikeAPath_StaysData) {
  const std::string dir = TestDir();
  std::vector<float> a(2, 1.0f);
  std::vector<ShardTensorView> views = {
      {"../../escape", {2}, {"Replicate()"}, {{0, 2}}, a.data()}};
  const CheckpointMetadata meta = Meta(Mesh::OneDim(1));
  ASSERT_THAT(WriteCheckpointShard(dir, 0, meta, views), IsOk());
  ASSERT_THAT(WriteCheckpointMetadata(dir, meta, views), IsOk());
  struct stat st;
  EXPECT_NE(::stat((dir + "/../../escape").c_str(), &st), 0);
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> got(2);
  EXPECT_THAT(reader->ReadRegion("../../escape", {2}, {{0, 2}}, got.data()),
              IsOk());
  EXPECT_THAT(got, ElementsAre(1.0f, 1.0f));
}

TEST(CheckpointTest, WriteCheckpointShard_Rewrite_ReplacesFileAndLeavesNoTemp) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  SaveAll(c.dir, Meta(Mesh::OneDim(4), 8), {c.w});
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->metadata().step, 8);
  int files = 0;
  for (const char* f :
       {"metadata.json", "rank_0.safetensors", "rank_1.safetensors",
        "rank_2.safetensors", "rank_3.safetensors"}) {
    struct stat st;
    files += ::stat((c.dir + "/" + f).c_str(), &st) == 0;
  }
  EXPECT_EQ(files, 5);
  // No temporary files left behind: the directory has exactly those 5.
  DIR* d = ::opendir(c.dir.c_str());
  ASSERT_NE(d, nullptr);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  EXPECT_EQ(names.size(), 5u) << ::testing::PrintToString(names);
}

TEST(CheckpointTest, Describe_ListsMetadataTensorsAndShards) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  std::ostringstream out;
  reader->Describe(out);
  EXPECT_THAT(out.str(),
              AllOf(HasSubstr("version 1"), HasSubstr("step 7"),
                    HasSubstr("world size 4"), HasSubstr("dp_shard=4"),
                    HasSubstr("plan-abc123"), HasSubstr("w: F32 [10, 6]"),
                    HasSubstr("Shard(0)"),
                    HasSubstr("rank 1: box [3:6, 0:6], 72 bytes"),
                    HasSubstr("rank 3: box [9:10, 0:6], 24 bytes")));
}

// ---------------------------------------------------------------------------
// Write errors.

TEST(CheckpointTest, WriteCheckpointShard_BadInput_ReturnsInvalidArgument) {
  const std::string dir = TestDir();
  const CheckpointMetadata meta = Meta(Mesh::OneDim(2));
  std::vector<float> a(8, 0.0f);
  auto view = [&](std::string name, std::vector<Range> box) {
    return ShardTensorView{
        std::move(name), {4, 2}, {"Shard(0)"}, std::move(box), a.data()};
  };
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, meta, {view("bad name", {{0, 2}, {0, 2}})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad name")));
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, meta, {view("q\"x", {{0, 2}, {0, 2}})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("invalid")));
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, meta,
                           {view("__metadata__", {{0, 2}, {0, 2}})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("__metadata__")));
  EXPECT_THAT(WriteCheckpointShard(
                  dir, 0, meta,
                  {view("w", {{0, 2}, {0, 2}}), view("w", {{0, 2}, {0, 2}})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("w appears twice")));
  EXPECT_THAT(WriteCheckpointShard(dir, 0, meta, {view("w", {{0, 5}, {0, 2}})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor w"), HasSubstr("[0:5, 0:2]"),
                             HasSubstr("outside global_shape [4, 2]"))));
  EXPECT_THAT(WriteCheckpointShard(dir, 0, meta, {view("w", {{0, 2}})}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor w"), HasSubstr("1 dims"))));
  EXPECT_THAT(
      WriteCheckpointShard(dir, 2, meta, {view("w", {{0, 2}, {0, 2}})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2")));
  ShardTensorView partial = view("w", {{0, 2}, {0, 2}});
  partial.placements = {"Partial()"};
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, meta, {partial}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("Partial")));
  ShardTensorView two = view("w", {{0, 2}, {0, 2}});
  two.placements = {"Shard(0)", "Shard(1)"};
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, meta, {two}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 placements")));
  ShardTensorView null_data = view("w", {{0, 2}, {0, 2}});
  null_data.data = nullptr;
  EXPECT_THAT(WriteCheckpointShard(dir, 0, meta, {null_data}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  CheckpointMetadata bad_mesh = meta;
  bad_mesh.world_size = 3;
  EXPECT_THAT(
      WriteCheckpointShard(dir, 0, bad_mesh, {view("w", {{0, 2}, {0, 2}})}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("world_size")));
  // Nothing was written.
  struct stat st;
  EXPECT_NE(::stat((dir + "/rank_0.safetensors").c_str(), &st), 0);
}

TEST(CheckpointTest, WriteCheckpointShard_DirIsAFile_ReturnsError) {
  const std::string dir = TestDir();
  ASSERT_THAT(WriteCheckpointMetadata(dir, Meta(Mesh::OneDim(1)), {}), IsOk());
  const std::string file = dir + "/metadata.json";
  EXPECT_THAT(WriteCheckpointShard(file, 0, Meta(Mesh::OneDim(1)), {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(file), HasSubstr("not a directory"))));
}

// ---------------------------------------------------------------------------
// Open errors.

TEST(CheckpointTest, Open_MissingMetadata_ReturnsNotFound) {
  const std::string dir = TestDir();
  EXPECT_THAT(
      CheckpointReader::Open(dir),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/metadata.json")));
}

TEST(CheckpointTest, Open_MissingRankFile_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  ASSERT_EQ(::unlink((c.dir + "/rank_2.safetensors").c_str()), 0);
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(c.dir + "/rank_2.safetensors")));
}

TEST(CheckpointTest, Open_TruncatedDataSection_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_1.safetensors";
  const std::string bytes = ReadFile(path);
  WriteFile(path, bytes.substr(0, bytes.size() - 4));
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("tensor \"w\""),
                             HasSubstr("truncated"))));
}

TEST(CheckpointTest, Open_TrailingBytes_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_0.safetensors";
  WriteFile(path, ReadFile(path) + "xxxx");
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(CheckpointTest, Open_HeaderLengthBeyondFile_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_0.safetensors";
  std::string bytes = ReadFile(path);
  bytes[5] = 1;  // header length += 2^40
  WriteFile(path, bytes);
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("header length"))));
  WriteFile(path, "abc");  // shorter than the length field itself
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(CheckpointTest, Open_HeaderLengthAboveCap_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_0.safetensors";
  // A (sparse) file larger than the cap, so only the cap can reject it.
  ASSERT_EQ(::truncate(path.c_str(), kCheckpointMaxHeaderBytes + 100), 0);
  std::string bytes(8, '\0');
  const uint64_t n = kCheckpointMaxHeaderBytes + 1;
  for (int i = 0; i < 8; ++i)
    bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, 8, f), 8u);
  std::fclose(f);
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("cap"))));
}

TEST(CheckpointTest, Open_GarbageHeaderJson_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_3.safetensors";
  WriteFile(path, ::muon::testing::JoinSafetensors("{\"w\": [1, 2", ""));
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("JSON"))));
  WriteFile(path, ::muon::testing::JoinSafetensors("[1, 2]", ""));
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path)));
}

TEST(CheckpointTest, Open_GarbageMetadataJson_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/metadata.json";
  WriteFile(path, "{\"format\": \"muon-checkpoint\", \"format_version\": 1,");
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("JSON"))));
}

TEST(CheckpointTest, Open_MetadataFieldOfWrongType_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  EditMetadataJson(c.dir, [](json& j) { j["world_size"] = "four"; });
  EXPECT_THAT(
      CheckpointReader::Open(c.dir),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("metadata.json"), HasSubstr("world_size"))));
  EditMetadataJson(c.dir, [](json& j) {
    j["world_size"] = 4;
    j["tensors"]["w"]["global_shape"] = json::array({1.5, 2});
  });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("metadata.json"), HasSubstr("tensor w"),
                             HasSubstr("global_shape"))));
}

TEST(CheckpointTest, Open_UnknownFormatVersion_ReturnsFailedPrecondition) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  EditMetadataJson(c.dir, [](json& j) { j["format_version"] = 2; });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("metadata.json"),
                             HasSubstr("format_version 2"))));
  EditMetadataJson(c.dir, [](json& j) { j["format_version"] = 1; });
  const std::string path = c.dir + "/rank_2.safetensors";
  EditHeader(path, [](json& h) { h["__metadata__"]["format_version"] = "9"; });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path), HasSubstr("format_version 9"))));
}

TEST(CheckpointTest, Open_NotAMuonCheckpoint_ReturnsInvalidArgument) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  EditMetadataJson(c.dir, [](json& j) { j["format"] = "torch-dcp"; });
  EXPECT_THAT(
      CheckpointReader::Open(c.dir),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("metadata.json"), HasSubstr("torch-dcp"))));
}

TEST(CheckpointTest, Open_NonF32Dtype_ReturnsUnimplemented) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_0.safetensors";
  // A well-formed BF16 file (its data_offsets fit 2-byte elements): the
  // format is fine, the dtype is what the reader does not support.
  EditHeader(path, [](json& h) {
    h["w"]["dtype"] = "BF16";
    h["w"]["data_offsets"] = json::array({0, 36});
  });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kUnimplemented,
                       AllOf(HasSubstr(path), HasSubstr("tensor w"),
                             HasSubstr("BF16"))));
}

TEST(CheckpointTest, Open_InconsistentShapes_ReturnsDataLoss) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"shape vs bytes",
       [](json& h) {
         h["w"]["shape"] = json::array({2, 6});
       },
       "needs 48"},
      {"overflowing shape",
       [](json& h) {
         h["w"]["shape"] = json::array({int64_t{1} << 62, 4});
       },
       "too many elements"},
      {"negative dim",
       [](json& h) {
         h["w"]["shape"] = json::array({-3, -6});
       },
       "shape"},
      {"box past global shape",
       [](json& h) { h["__metadata__"]["w.offsets"] = "[8,0]"; },
       "outside global_shape [10, 6]"},
      {"offset overflow",
       [](json& h) {
         h["__metadata__"]["w.offsets"] = "[9223372036854775807,0]";
       },
       "outside global_shape"},
      {"global shape vs metadata.json",
       [](json& h) { h["__metadata__"]["w.global_shape"] = "[10,7]"; },
       "differs from metadata.json's [10, 6]"},
      {"placements vs metadata.json",
       [](json& h) { h["__metadata__"]["w.placements"] = "[\"Shard(1)\"]"; },
       "differ from metadata.json"},
      {"non-string metadata",
       [](json& h) {
         h["__metadata__"]["w.offsets"] = json::array({3, 0});
       },
       "must be a string"},
      {"missing offsets", [](json& h) { h["__metadata__"].erase("w.offsets"); },
       ".offsets"},
      {"data_offsets reversed",
       [](json& h) {
         h["w"]["data_offsets"] = json::array({72, 0});
       },
       "data_offsets"},
      {"other step", [](json& h) { h["__metadata__"]["step"] = "6"; },
       "step is 6"},
      {"other rank", [](json& h) { h["__metadata__"]["rank"] = "0"; },
       "rank is 0"},
      // A tensor metadata.json does not list is taken from the rank files
      // (another pipeline stage's); without its __metadata__ it is refused.
      {"unknown tensor without its metadata",
       [](json& h) {
         h["v"] = h["w"];
         h.erase("w");
       },
       "tensor v: __metadata__ lacks its .global_shape"},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(tc.what);
    SmallCheckpoint c = MakeSmallCheckpoint();
    const std::string path = c.dir + "/rank_1.safetensors";
    EditHeader(path, tc.edit);
    EXPECT_THAT(CheckpointReader::Open(c.dir),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(path), HasSubstr(tc.message))));
  }
}

TEST(CheckpointTest, Open_CorruptedHeaderBytes_ReturnsStatusNeverThrows) {
  // Every single-byte corruption of a rank file's header (deterministic
  // positions and values) is either rejected with a status or, where the
  // JSON still means the same thing, accepted; nothing throws or crashes,
  // and an accepted checkpoint still reads back correctly.
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_1.safetensors";
  const std::string original = ReadFile(path);
  const ParsedFile st = ParseFile(original);
  const char values[] = {'\0', '"', '{', ']', '9', '-', 'x', ' ', '\xff'};
  int rejected = 0;
  for (size_t pos = 0; pos < 8 + st.header_len; pos += 3) {
    std::string bytes = original;
    bytes[pos] = values[pos % sizeof(values)];
    if (bytes == original) continue;
    WriteFile(path, bytes);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(c.dir);
    if (!reader.ok()) {
      ++rejected;
      continue;
    }
    std::vector<float> got(60);
    absl::Status s =
        (*reader)->ReadRegion("w", {10, 6}, FullBox({10, 6}), got.data());
    if (s.ok()) {
      EXPECT_EQ(got, c.w.data) << "byte " << pos;
    }
  }
  EXPECT_GT(rejected, 0);
}

// ---------------------------------------------------------------------------
// ReadRegion errors.

TEST(CheckpointTest, ReadRegion_MissingTensor_ReturnsNotFound) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  float out[1];
  EXPECT_THAT(reader->ReadRegion("nope", {1}, {{0, 1}}, out),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(c.dir), HasSubstr("\"nope\""))));
  EXPECT_THAT(reader->GlobalShape("nope"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  EXPECT_EQ(reader->FindTensor("nope"), nullptr);
}

TEST(CheckpointTest, ReadRegion_WrongGlobalShape_ReturnsInvalidArgument) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> out(60);
  EXPECT_THAT(reader->ReadRegion("w", {6, 10}, FullBox({6, 10}), out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor w"), HasSubstr("[6, 10]"),
                             HasSubstr("[10, 6]"))));
}

TEST(CheckpointTest, ReadRegion_BoxOutsideShape_ReturnsInvalidArgument) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> out(100);
  EXPECT_THAT(reader->ReadRegion("w", {10, 6}, {{8, 11}, {0, 6}}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor w"), HasSubstr("[8:11, 0:6]"))));
  EXPECT_THAT(
      reader->ReadRegion("w", {10, 6}, {{0, 1}}, out.data()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tensor w")));
  EXPECT_THAT(reader->ReadRegion("w", {10, 6}, {{0, 1}, {0, 1}}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
}

TEST(CheckpointTest, ReadRegion_RegionNotCovered_ReturnsDataLoss) {
  // Rank 1 of 2 saved nothing of "w": rows [5, 10) are in no file.
  const std::string dir = TestDir();
  const CheckpointMetadata meta = Meta(Mesh::OneDim(2));
  std::vector<float> a(10, 3.0f);
  std::vector<ShardTensorView> v0 = {
      {"w", {10, 2}, {"Shard(0)"}, {{0, 5}, {0, 2}}, a.data()}};
  ASSERT_THAT(WriteCheckpointShard(dir, 0, meta, v0), IsOk());
  ASSERT_THAT(WriteCheckpointShard(dir, 1, meta, {}), IsOk());
  ASSERT_THAT(WriteCheckpointMetadata(dir, meta, v0), IsOk());
  auto reader = OpenOrDie(dir);
  ASSERT_NE(reader, nullptr);
  std::vector<float> out(20);
  EXPECT_THAT(
      reader->ReadRegion("w", {10, 2}, {{3, 7}, {0, 2}}, out.data()),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr("tensor w"), HasSubstr(dir),
                     HasSubstr("[5:7, 0:2]"), HasSubstr("rank 0 [0:5, 0:2]"))));
  // The covered part alone is fine.
  EXPECT_THAT(reader->ReadRegion("w", {10, 2}, {{0, 5}, {0, 2}}, out.data()),
              IsOk());
}

TEST(CheckpointTest, ReadRegion_FileShrunkAfterOpen_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  auto reader = OpenOrDie(c.dir);
  ASSERT_NE(reader, nullptr);
  const std::string path = c.dir + "/rank_2.safetensors";
  const std::string bytes = ReadFile(path);
  WriteFile(path, bytes.substr(0, bytes.size() - 8));
  std::vector<float> out(60);
  EXPECT_THAT(reader->ReadRegion("w", {10, 6}, FullBox({10, 6}), out.data()),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("tensor w"))));
}

}  // namespace
}  // namespace muon
