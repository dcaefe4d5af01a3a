// checkpoint/checkpoint.h: write per-rank safetensors shards + metadata.json,
// read any box back under another layout (FSDP 4 -> 2, rows -> columns,
// DDP -> sharded, 3-D expert stacks, uneven and empty boxes), the files are
// plain safetensors, and bad input to the writer is refused. Damaged files:
// checkpoint_corruption_test.cc.
#include <string>
#include <vector>

#include "tests/checkpoint/checkpoint_test_util.h"

namespace muon {
namespace checkpoint_testing {
namespace {

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

}  // namespace
}  // namespace checkpoint_testing
}  // namespace muon
