// Tests of common/safetensors.h: headers written here (zero-filled data)
// read back in data order, with their metadata; hostile headers refused
// with messages that name the path and the tensor; the packed-data rule;
// EncodeSafetensorsHeader's output read back.
#include "common/safetensors.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/safetensors_test_util.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Tensor = ::muon::testing::TestTensor;
using ::muon::testing::WriteSafetensorsRaw;
using ::muon::testing::WriteTempSafetensors;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

// GPT-2's first tensors (Conv1D weights are stored [in, out]).
std::vector<Tensor> Gpt2Tensors() {
  return {{"transformer.wte.weight", "F32", {50257, 768}},
          {"transformer.wpe.weight", "F32", {1024, 768}},
          {"transformer.h.0.ln_1.weight", "F32", {768}},
          {"transformer.h.0.ln_1.bias", "F32", {768}},
          {"transformer.h.0.attn.c_attn.weight", "F32", {768, 2304}},
          {"transformer.h.0.attn.c_proj.weight", "BF16", {768, 768}}};
}

TEST(ReadSafetensorsHeader, Gpt2_ReturnsTensorsInDataOrder) {
  const std::vector<Tensor> written = Gpt2Tensors();
  const std::string path = WriteTempSafetensors("gpt2.safetensors", written);
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(path);
  ASSERT_THAT(header, IsOk());
  const std::vector<SafetensorsTensor>* tensors = &header->tensors;
  ASSERT_EQ(tensors->size(), written.size());
  int64_t offset = 0;
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ((*tensors)[i].name, written[i].name);
    EXPECT_EQ((*tensors)[i].dtype, written[i].dtype);
    EXPECT_EQ((*tensors)[i].shape, written[i].shape);
    EXPECT_EQ((*tensors)[i].data_begin, offset);
    offset = (*tensors)[i].data_end;
  }
  EXPECT_EQ((*tensors)[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_THAT((*tensors)[4].shape, ElementsAre(768, 2304));
  // The test writer's metadata, and the data section's place and size.
  EXPECT_EQ(header->metadata,
            (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(header->data_offset % 8, 0);
  EXPECT_EQ(header->data_size, offset);
  EXPECT_THAT(CheckSafetensorsPacked(path, *header), IsOk());
}

TEST(EncodeSafetensorsHeader, ReadsBackWithMetadataAndAlignedData) {
  const std::vector<SafetensorsTensor> tensors = {{"b", "F32", {2, 3}, 0, 24},
                                                  {"a", "BF16", {4}, 24, 32}};
  const std::map<std::string, std::string> metadata = {{"step", "7"},
                                                       {"x.offsets", "[0,1]"}};
  const std::string head = EncodeSafetensorsHeader(tensors, metadata);
  EXPECT_EQ(head.size() % 8, 0u);
  const std::string path = TempPath("encoded.safetensors");
  ASSERT_TRUE(WriteSafetensorsRaw(path, head.substr(8), 32,
                                  static_cast<int64_t>(head.size() - 8)));
  absl::StatusOr<SafetensorsHeader> read = ReadSafetensorsHeader(path);
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(read->metadata, metadata);
  EXPECT_EQ(read->data_offset, static_cast<int64_t>(head.size()));
  ASSERT_EQ(read->tensors.size(), 2u);
  EXPECT_EQ(read->tensors[0].name, "b");  // data order, not key order
  EXPECT_THAT(read->tensors[1].shape, ElementsAre(4));
  EXPECT_EQ(read->tensors[1].dtype, "BF16");
  EXPECT_THAT(CheckSafetensorsPacked(path, *read), IsOk());
}

TEST(CheckSafetensorsPacked, GapOrTrailingBytes_ReturnInvalidArgument) {
  SafetensorsHeader header;
  header.tensors = {{"a", "F32", {2}, 0, 8}, {"b", "F32", {2}, 16, 24}};
  header.data_size = 24;
  EXPECT_THAT(CheckSafetensorsPacked("f.safetensors", header),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("f.safetensors: data_offsets leave a gap or "
                                 "overlap at byte 8")));
  header.tensors[1] = {"b", "F32", {2}, 8, 16};
  EXPECT_THAT(CheckSafetensorsPacked("f.safetensors", header),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensors cover 16 bytes but the data "
                                 "section has 24")));
  header.data_size = 16;
  EXPECT_THAT(CheckSafetensorsPacked("f.safetensors", header), IsOk());
}

// --- Hostile headers --------------------------------------------------------

absl::Status ReadRaw(const std::string& file, const std::string& header,
                     uint64_t data_bytes, int64_t declared_len = -1) {
  const std::string path = TempPath(file);
  EXPECT_TRUE(WriteSafetensorsRaw(path, header, data_bytes, declared_len))
      << path;
  return ReadSafetensorsHeader(path).status();
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(ReadSafetensorsHeader, LengthBeyondFile_ReturnsInvalidArgument) {
  EXPECT_THAT(ReadRaw("long.safetensors", "{}", 0, 1000),
              StatusIs(kInvalid, HasSubstr("runs past the end")));
  EXPECT_THAT(ReadRaw("huge.safetensors", "{}", 0, int64_t{1} << 40),
              StatusIs(kInvalid, HasSubstr("exceeds")));
  const std::string path = TempPath("short.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  EXPECT_THAT(ReadSafetensorsHeader(path),
              StatusIs(kInvalid, HasSubstr("too short")));
  EXPECT_THAT(
      ReadSafetensorsHeader(TempPath("missing.safetensors")),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.safetensors")));
}

TEST(ReadSafetensorsHeader, NotAnObject_ReturnsInvalidArgument) {
  EXPECT_THAT(ReadRaw("array.safetensors", "[1, 2]", 0),
              StatusIs(kInvalid, HasSubstr("must be an object")));
  EXPECT_THAT(ReadRaw("garbage.safetensors", "{\"w\": ", 0),
              StatusIs(kInvalid, HasSubstr("not valid JSON")));
  EXPECT_THAT(ReadRaw("deep.safetensors",
                      std::string(1000, '[') + std::string(1000, ']'), 0),
              StatusIs(kInvalid, HasSubstr("nests more than")));
  EXPECT_THAT(
      ReadRaw("entry.safetensors", R"({"w": [1]})", 0),
      StatusIs(kInvalid, HasSubstr("tensor \"w\": expected an object")));
  EXPECT_THAT(ReadRaw("meta.safetensors", R"({"__metadata__": {"a": 1}})", 0),
              StatusIs(kInvalid, HasSubstr("__metadata__[\"a\"]")));
}

TEST(ReadSafetensorsHeader, WrongTypes_ReturnInvalidArgumentNamingTensor) {
  const std::string path_part = "types.safetensors";
  EXPECT_THAT(
      ReadRaw(path_part,
              R"({"w": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})",
              8),
      StatusIs(kInvalid, HasSubstr("tensor \"w\": dtype must be a string")));
  EXPECT_THAT(
      ReadRaw(
          path_part,
          R"({"w": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}})",
          8),
      StatusIs(kInvalid, HasSubstr("unknown dtype \"F99\"")));
  EXPECT_THAT(
      ReadRaw(
          path_part,
          R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})",
          8),
      StatusIs(kInvalid, HasSubstr("shape must be an array")));
  EXPECT_THAT(
      ReadRaw(
          path_part,
          R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",
          8),
      StatusIs(kInvalid, HasSubstr("shape[0] must be an integer")));
  EXPECT_THAT(
      ReadRaw(
          path_part,
          R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",
          8),
      StatusIs(kInvalid, HasSubstr("dims are >= 0")));
  EXPECT_THAT(
      ReadRaw(path_part,
              R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})",
              8),
      StatusIs(kInvalid, HasSubstr("data_offsets must be [begin, end]")));
  EXPECT_THAT(ReadRaw(path_part, R"({"w": {"dtype": "F32", "shape": [2]}})", 8),
              StatusIs(kInvalid, HasSubstr("missing \"data_offsets\"")));
  EXPECT_THAT(
      ReadRaw(path_part,
              R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8],
                  "extra": 1}})",
              8),
      StatusIs(kInvalid, HasSubstr("unknown key \"extra\"")));
  EXPECT_THAT(
      ReadRaw(path_part,
              R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4],
                  "data_offsets": [0, 8]}})",
              8),
      StatusIs(kInvalid, HasSubstr("too many")));
  EXPECT_THAT(
      ReadRaw(path_part,
              R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})",
              8),
      StatusIs(kInvalid, HasSubstr("\"w\" more than once")));
}

TEST(ReadSafetensorsHeader, OffsetsOutsideFile_ReturnInvalidArgument) {
  const std::string file = "offsets.safetensors";
  EXPECT_THAT(
      ReadRaw(
          file,
          R"({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}})",
          32),
      StatusIs(kInvalid,
               HasSubstr("tensor \"w\": data_offsets [0, 64] end beyond the "
                         "data section of 32 bytes (file truncated?)")));
  EXPECT_THAT(
      ReadRaw(
          file,
          R"({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 96]}})",
          96),
      StatusIs(kInvalid, HasSubstr("hold 96 bytes but F32 [4, 4] needs 64")));
  EXPECT_THAT(
      ReadRaw(
          file,
          R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})",
          8),
      StatusIs(kInvalid, HasSubstr("not 0 <= begin <= end")));
  EXPECT_THAT(
      ReadRaw(file,
              R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                  "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
              24),
      StatusIs(kInvalid, HasSubstr("tensor \"b\": data_offsets [8, 24] "
                                   "overlap tensor \"a\"")));
  // The error names the file.
  EXPECT_THAT(
      ReadRaw(
          file,
          R"({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}})",
          0),
      StatusIs(kInvalid, HasSubstr(file)));
}

TEST(ReadSafetensorsHeader, EmptyHeaderAndEmptyTensor_Accepted) {
  absl::Status s = ReadRaw(
      "empty_tensor.safetensors",
      R"({"e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}})", 0);
  EXPECT_THAT(s, IsOk());
  EXPECT_THAT(ReadRaw("empty.safetensors", "{}", 0), IsOk());
}

}  // namespace
}  // namespace muon
