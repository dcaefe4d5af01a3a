// checkpoint/checkpoint.h's reader on damaged or mismatched files: every
// corruption (missing, truncated or trailing bytes, bad header lengths,
// garbage JSON, fields of the wrong type, another format or version,
// inconsistent shapes, any single corrupted header byte) and every bad
// region request is reported with its code and the file / tensor it
// concerns, and nothing throws.
#include <string>
#include <vector>

#include "tests/checkpoint/checkpoint_test_util.h"

namespace muon {
namespace checkpoint_testing {
namespace {

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

// A directory where a checkpoint file should be is a damaged checkpoint.
TEST(CheckpointTest, Open_FileReplacedByDirectory_ReturnsDataLoss) {
  for (const std::string file : {"metadata.json", "rank_2.safetensors"}) {
    SCOPED_TRACE(file);
    SmallCheckpoint d = MakeSmallCheckpoint();
    const std::string path = d.dir + "/" + file;
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ASSERT_EQ(::mkdir(path.c_str(), 0755), 0);
    EXPECT_THAT(
        CheckpointReader::Open(d.dir),
        StatusIs(absl::StatusCode::kDataLoss,
                 AllOf(HasSubstr(path), HasSubstr("not a regular file"))));
    ASSERT_EQ(::rmdir(path.c_str()), 0);  // the next file's checkpoint
  }
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

// 2^20 '[' in metadata.json (or in a rank file's __metadata__ string,
// which the safetensors header's own depth check does not see) would build
// a DOM of a GiB: refused by its depth before it is parsed.
TEST(CheckpointTest, Open_DeeplyNestedJson_ReturnsDataLossBeforeParsing) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/metadata.json";
  const std::string original = ReadFile(path);
  WriteFile(path, std::string(1 << 20, '['));
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(path), HasSubstr("nested more than"))));
  WriteFile(path, original);
  const std::string rank_file = c.dir + "/rank_1.safetensors";
  EditHeader(rank_file, [](json& h) {
    h["__metadata__"]["w.offsets"] = std::string(1 << 20, '[');
  });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(rank_file), HasSubstr("offsets"))));
}

// A step past 2^62 would overflow the step counter a later step
// increments: refused on read, and never written.
TEST(CheckpointTest, Open_StepPastLimit_ReturnsDataLoss) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  EditMetadataJson(
      c.dir, [](json& j) { j["step"] = std::numeric_limits<int64_t>::max(); });
  EXPECT_THAT(CheckpointReader::Open(c.dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("metadata.json"), HasSubstr("step"),
                             HasSubstr("4611686018427387904"))));
  const CheckpointMetadata meta = Meta(Mesh::OneDim(1), kMaxCheckpointStep + 1);
  EXPECT_THAT(WriteCheckpointMetadata(TestDir("step_limit"), meta, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("checkpoint step 4611686018427387905")));
}

// A 0-dim tensor only a rank file lists (so metadata.json's shape checks
// never saw it) used to open, and reading it indexed its strides at -1.
TEST(CheckpointTest, Open_UnlistedZeroDimTensor_ReturnsDataLossNotACrash) {
  SmallCheckpoint c = MakeSmallCheckpoint();
  const std::string path = c.dir + "/rank_1.safetensors";
  const ::muon::testing::SafetensorsParts st =
      ::muon::testing::SplitSafetensors(ReadFile(path));
  json header = json::parse(st.header, nullptr, false);
  ASSERT_FALSE(header.is_discarded());
  const int64_t w_bytes = header["w"]["data_offsets"][1].get<int64_t>();
  header["s"] = {{"dtype", "F32"},
                 {"shape", json::array()},
                 {"data_offsets", {w_bytes, w_bytes + 4}}};
  header["__metadata__"]["s.global_shape"] = "[]";
  header["__metadata__"]["s.offsets"] = "[]";
  header["__metadata__"]["s.placements"] = "[]";
  WriteFile(path, ::muon::testing::JoinSafetensors(
                      header.dump(), st.data + std::string(4, '\0')));
  EXPECT_THAT(
      CheckpointReader::Open(c.dir),
      StatusIs(absl::StatusCode::kDataLoss,
               AllOf(HasSubstr(path), HasSubstr("tensor s: global_shape []"))));
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
  EXPECT_THAT(reader->ReadRegion("w", {10, 6}, {}, out.data()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tensor w"), HasSubstr("0 dims"))));
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
}  // namespace checkpoint_testing
}  // namespace muon
