// Tests of tools/npy.h: a strict reader (exact dtype and header dict,
// bounded header length, checked shape product, exact file size) and the
// escaped file names of parameters.
#include "tools/npy.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;

// A version 1.0 .npy file with `header` (padded to end in '\n' unless
// `raw`) and `data_bytes` bytes of data.
std::string Npy(const std::string& header, size_t data_bytes,
                bool raw = false) {
  std::string h = header;
  if (!raw) h += "\n";
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(h.size() & 0xff));
  out.push_back(static_cast<char>(h.size() >> 8));
  out += h;
  out.append(data_bytes, '\0');
  return out;
}

std::string Header(const std::string& descr, const std::string& shape) {
  return absl::StrCat("{'descr': '", descr,
                      "', 'fortran_order': False, 'shape': ", shape, ", }");
}

TEST(NpyTest, ParseNpy_Valid_ReturnsArray) {
  absl::StatusOr<NpyArray> a = ParseNpy(Npy(Header("<f4", "(2, 3)"), 24), "x");
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->data.size(), 6u);
  // Keys in another order, double quotes, no trailing comma, 1-D.
  a = ParseNpy(
      Npy("{\"shape\": (4,), \"fortran_order\": False, \"descr\": \"<f4\"}",
          16),
      "x");
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->shape, ElementsAre(4));
  // Scalar: shape ().
  a = ParseNpy(Npy(Header("<f4", "()"), 4), "x");
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->data.size(), 1u);
}

TEST(NpyTest, ParseNpy_DtypeNotExactlyF4_ReturnsInvalidArgument) {
  // The old check was a substring match: '<f4' inside another dtype passed.
  for (const std::string& descr :
       std::vector<std::string>{"<f8", ">f4", "<f4x", "x<f4", "|u1<f4"}) {
    EXPECT_THAT(ParseNpy(Npy(Header(descr, "(2,)"), 8), "g.npy"),
                StatusIs(kInvalid, AllOf(HasSubstr("g.npy"),
                                         HasSubstr(absl::StrCat("'", descr)))))
        << descr;
  }
}

TEST(NpyTest, ParseNpy_MalformedHeader_ReturnsInvalidArgument) {
  const std::vector<std::string> bad = {
      "{'descr': '<f4', 'fortran_order': False}",                // no shape
      "{'descr': '<f4', 'fortran_order': True, 'shape': (2,)}",  // Fortran
      "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': "
      "(2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk",
      "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
      "'descr': '<f4'",
      "",
  };
  for (const std::string& h : bad) {
    EXPECT_THAT(ParseNpy(Npy(h, 8), "g.npy"),
                StatusIs(kInvalid, HasSubstr("g.npy")))
        << h;
  }
}

TEST(NpyTest, ParseNpy_HugeHeaderLength_ReturnsInvalidArgumentWithoutAlloc) {
  // Version 2.0, header length 0xFFFFFFF0: rejected from the length alone.
  std::string f("\x93NUMPY\x02\x00\xf0\xff\xff\xff", 12);
  f += "{}";
  EXPECT_THAT(
      ParseNpy(f, "h.npy"),
      StatusIs(kInvalid, AllOf(HasSubstr("h.npy"), HasSubstr("4294967280"))));
  // Within the bound but longer than the file: truncated.
  std::string g("\x93NUMPY\x02\x00\x00\x00\x01\x00", 12);
  EXPECT_THAT(ParseNpy(g, "h.npy"),
              StatusIs(kDataLoss, HasSubstr("65536 bytes")));
}

TEST(NpyTest, ParseNpy_BadMagicOrVersion_ReturnsInvalidArgument) {
  EXPECT_THAT(ParseNpy("hello world!", "m.npy"),
              StatusIs(kInvalid, HasSubstr("not a .npy")));
  std::string v3 = Npy(Header("<f4", "(1,)"), 4);
  v3[6] = 3;
  EXPECT_THAT(ParseNpy(v3, "m.npy"), StatusIs(kInvalid, HasSubstr("3.0")));
  EXPECT_THAT(ParseNpy(std::string("\x93NUMPY\x01", 7), "m.npy"),
              StatusIs(kInvalid, HasSubstr("not a .npy")));
}

TEST(NpyTest, ParseNpy_HugeShape_ReturnsInvalidArgument) {
  // 1e8 x 1e8 aborted before; its product is checked against the limit.
  EXPECT_THAT(ParseNpy(Npy(Header("<f4", "(100000000, 100000000)"), 0), "s"),
              StatusIs(kInvalid, HasSubstr("(100000000, 100000000)")));
  // A product that overflows int64.
  EXPECT_THAT(
      ParseNpy(Npy(Header("<f4", "(4294967296, 4294967296, 4294967296)"), 0),
               "s"),
      StatusIs(kInvalid, HasSubstr("elements")));
  // A dimension beyond int64.
  EXPECT_THAT(ParseNpy(Npy(Header("<f4", "(99999999999999999999,)"), 0), "s"),
              StatusIs(kInvalid, HasSubstr("bad dimension")));
}

TEST(NpyTest, ParseNpy_TruncatedData_ReturnsDataLoss) {
  EXPECT_THAT(
      ParseNpy(Npy(Header("<f4", "(2, 3)"), 20), "t.npy"),
      StatusIs(kDataLoss, AllOf(HasSubstr("t.npy"), HasSubstr("needs 24 bytes"),
                                HasSubstr("holds 20"))));
}

TEST(NpyTest, ParseNpy_TrailingBytes_ReturnsInvalidArgument) {
  EXPECT_THAT(ParseNpy(Npy(Header("<f4", "(2, 3)"), 25), "t.npy"),
              StatusIs(kInvalid, AllOf(HasSubstr("t.npy"),
                                       HasSubstr("1 trailing bytes"))));
}

TEST(NpyTest, ReadNpy_RoundTripAndStrictFile) {
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/npy_test_a.npy");
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  ASSERT_THAT(WriteNpy(path, {2, 3}, v.data()), IsOk());
  absl::StatusOr<NpyArray> a = ReadNpy(path);
  ASSERT_THAT(a, IsOk());
  EXPECT_THAT(a->shape, ElementsAre(2, 3));
  EXPECT_EQ(a->data, v);
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "x";
  }
  EXPECT_THAT(ReadNpy(path), StatusIs(kInvalid, HasSubstr("trailing")));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::string f("\x93NUMPY\x02\x00\xf0\xff\xff\xff{}", 14);
    out << f;
  }
  EXPECT_THAT(ReadNpy(path), StatusIs(kInvalid, HasSubstr("4294967280")));
  EXPECT_THAT(ReadNpy(absl::StrCat(dir, "/missing.npy")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.npy")));
  std::remove(path.c_str());
}

// ReadNpyShape reads only the header but checks it against the file's
// size, as ReadNpy does: a file with missing or extra data is refused.
TEST(NpyTest, ReadNpyShape_HeaderOnly_SameSizeChecksAsReadNpy) {
  const std::string dir = ::testing::TempDir();
  const std::string path = absl::StrCat(dir, "/npy_test_shape.npy");
  const std::vector<float> v(12, 1.0f);
  ASSERT_THAT(WriteNpy(path, {3, 4}, v.data()), IsOk());
  absl::StatusOr<std::vector<int64_t>> shape = ReadNpyShape(path);
  ASSERT_THAT(shape, IsOk());
  EXPECT_THAT(*shape, ElementsAre(3, 4));
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "x";
  }
  EXPECT_THAT(ReadNpyShape(path), StatusIs(kInvalid, HasSubstr("trailing")));
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << Npy(Header("<f4", "(3, 4)"), 40);
  }
  EXPECT_THAT(ReadNpyShape(path),
              StatusIs(kDataLoss, AllOf(HasSubstr("needs 48 bytes"),
                                        HasSubstr("holds 40"))));
  EXPECT_THAT(ReadNpyShape(absl::StrCat(dir, "/missing.npy")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.npy")));
  std::remove(path.c_str());
}

TEST(NpyTest, NpyFileName_PathCharacters_AreEscaped) {
  EXPECT_EQ(NpyFileName("fc1.weight"), "fc1.weight");
  EXPECT_EQ(NpyFileName("layers.0.mlp-w_1"), "layers.0.mlp-w_1");
  EXPECT_EQ(NpyFileName("../../x"), "..%2F..%2Fx");
  EXPECT_EQ(NpyFileName("/etc/passwd"), "%2Fetc%2Fpasswd");
  EXPECT_EQ(NpyFileName("a%2Fb"), "a%252Fb");  // '%' escaped: injective
  EXPECT_EQ(NpyFileName(std::string("a\0b", 3)), "a%00b");
  EXPECT_EQ(NpyFileName("a b\\c"), "a%20b%5Cc");
  for (const std::string& name :
       std::vector<std::string>{"..", ".", "../..", "/", "a/../../b"}) {
    const std::string file = NpyFileName(name) + ".npy";
    EXPECT_EQ(file.find('/'), std::string::npos) << name;
    EXPECT_NE(file, "..");
    EXPECT_NE(file, ".");
  }
}

}  // namespace
}  // namespace muon
