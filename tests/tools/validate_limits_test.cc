// `muonctl validate` on hostile input: meshes too large for a local check
// (refused before any process is forked) and parameter names that would
// make --init/--grads/--dump paths leave their folders (escaped by
// NpyFileName); a failing run leaves no temporary directory behind.
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tools/npy.h"
#include "tools/validate.h"

namespace muon {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(ValidateLimitsTest,
     RunValidate_MillionRankMesh_ReturnsInvalidArgumentBeforeForking) {
  const std::string spec =
      WriteFile("million.json",
                R"json({"mesh": {"dims": [{"name": "dp", "size": 1000},
                            {"name": "tp", "size": 1000}]},
          "params": [{"name": "w", "shape": [8, 8],
                      "placements": ["Replicate()", "Replicate()"]}]})json");
  ValidateOptions o;
  o.spec_path = spec;
  std::ostringstream out;
  const absl::Time start = absl::Now();
  EXPECT_THAT(RunValidate(o, out),
              StatusIs(kInvalid, AllOf(HasSubstr("dp=1000 x tp=1000"),
                                       HasSubstr("1000000"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(out.str(), "");  // nothing started
}

TEST(ValidateLimitsTest,
     RunValidate_MoreRanksThanALocalCheck_ReturnsInvalidArgumentBeforeForking) {
  // 1,024 ranks: a valid job mesh, but too many local processes.
  const std::string spec =
      WriteFile("thousand.json",
                R"json({"mesh": {"dims": [{"name": "dp", "size": 1024}]},
          "params": [{"name": "w", "shape": [8, 8],
                      "placements": ["Replicate()"]}]})json");
  ValidateOptions o;
  o.spec_path = spec;
  std::ostringstream out;
  EXPECT_THAT(
      RunValidate(o, out),
      StatusIs(kInvalid, AllOf(HasSubstr("dp=1024"), HasSubstr("1024 ranks"),
                               HasSubstr("at most 256"))));
  EXPECT_EQ(out.str(), "");  // nothing started
}

TEST(ValidateLimitsTest,
     RunValidate_MeshProductOverflows_ReturnsInvalidArgumentNamingMesh) {
  const std::string spec =
      WriteFile("wrap.json",
                R"json({"mesh": {"dims": [{"name": "dp", "size": 3},
                            {"name": "tp", "size": 1431655766}]},
          "params": [{"name": "w", "shape": [8, 8],
                      "placements": ["Replicate()", "Replicate()"]}]})json");
  ValidateOptions o;
  o.spec_path = spec;
  std::ostringstream out;
  EXPECT_THAT(RunValidate(o, out),
              StatusIs(kInvalid, AllOf(HasSubstr("dp=3 x tp=1431655766"),
                                       HasSubstr("4294967298"))));
}

TEST(ValidateLimitsTest,
     RunValidate_HugeExpertCount_ReturnsInvalidArgumentNamingParam) {
  const std::string spec =
      WriteFile("experts.json",
                R"json({"mesh": {"dims": [{"name": "ep", "size": 2}]},
          "params": [{"name": "moe.w1", "shape": [1099511627776, 4, 4],
                      "placements": ["Shard(0)"]}]})json");
  ValidateOptions o;
  o.spec_path = spec;
  std::ostringstream out;
  EXPECT_THAT(RunValidate(o, out),
              StatusIs(kInvalid, AllOf(HasSubstr("\"moe.w1\""),
                                       HasSubstr("1099511627776 experts"))));
}

TEST(ValidateLimitsTest, RunValidate_TooManyElements_ReturnsInvalidArgument) {
  const std::string spec =
      WriteFile("big.json",
                R"json({"mesh": {"dims": [{"name": "dp", "size": 2}]},
          "params": [{"name": "w", "shape": [65536, 65536],
                      "placements": ["Shard(0)"]}]})json");
  ValidateOptions o;
  o.spec_path = spec;
  std::ostringstream out;
  EXPECT_THAT(RunValidate(o, out),
              StatusIs(kInvalid, AllOf(HasSubstr("\"w\""),
                                       HasSubstr("4294967296 elements"))));
}

// Runs the real muonctl (rank processes are muonctl itself), with the
// environment assignments `env` ("NAME=value ...", may be empty).
int RunMuonctl(const std::string& args, std::string* output,
               const std::string& env = "") {
  const std::string cmd = absl::StrCat(
      "env ", env, " timeout -k 5 120 tools/muonctl ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST(ValidateLimitsTest, Validate_TraversingNames_StayInsideTheirFolders) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/names");
  const std::string dump = root + "/a/b/out";
  ASSERT_EQ(
      system(absl::StrCat("rm -rf ", root, " && mkdir -p ", root, "/a/b/init")
                 .c_str()),
      0);
  const std::string spec =
      WriteFile("names.json",
                R"json({"mesh": {"dims": [{"name": "dp_shard", "size": 2}]},
          "params": [{"name": "../../x", "shape": [4, 3],
                      "placements": ["Shard(0)"]},
                     {"name": "/tmp/abs", "shape": [3, 2],
                      "placements": ["Shard(0)"]}]})json");
  // --init reads the escaped names.
  std::vector<float> w(12, 0.5f);
  ASSERT_THAT(WriteNpy(root + "/a/b/init/..%2F..%2Fx.npy", {4, 3}, w.data()),
              IsOk());
  ASSERT_THAT(WriteNpy(root + "/a/b/init/%2Ftmp%2Fabs.npy", {3, 2}, w.data()),
              IsOk());
  std::string output;
  ASSERT_EQ(
      RunMuonctl(absl::StrCat("validate --spec ", spec, " --steps 1 --init ",
                              root, "/a/b/init --dump ", dump),
                 &output),
      0)
      << output;
  EXPECT_TRUE(Exists(dump + "/single/..%2F..%2Fx.npy")) << output;
  EXPECT_TRUE(Exists(dump + "/distributed/..%2F..%2Fx.npy"));
  EXPECT_TRUE(Exists(dump + "/single/%2Ftmp%2Fabs.npy"));
  // The unescaped paths would have been a/b/x.npy (two levels up from
  // out/single) and /tmp/abs.npy under out/single/.
  EXPECT_FALSE(Exists(root + "/a/b/x.npy"));
  EXPECT_FALSE(Exists(root + "/a/x.npy"));
  EXPECT_FALSE(Exists(dump + "/single/tmp"));
  absl::StatusOr<NpyArray> a = ReadNpy(dump + "/single/..%2F..%2Fx.npy");
  ASSERT_THAT(a, IsOk());
  EXPECT_NE(a->data, w);  // the step ran from the --init values
}

// The entries of directory `dir` but "." and ".." (it reads at most 102).
std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  for (int i = 0; i < 102; ++i) {
    const dirent* e = readdir(d);
    if (e == nullptr) break;
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

// A validate run whose rank processes fail (a coordinator that is not
// there, a 1 s bound) still removes its muon-validate-* directory: the
// test points TEST_TMPDIR and TMPDIR at a folder of its own, which must be
// empty afterwards.
TEST(ValidateLimitsTest, Validate_RankProcessesFail_RemovesItsTempDir) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/failing");
  const std::string tmp = root + "/tmp";
  ASSERT_EQ(system(absl::StrCat("rm -rf ", root, " && mkdir -p ", tmp).c_str()),
            0);
  const std::string spec =
      WriteFile("failing.json",
                R"json({"mesh": {"dims": [{"name": "dp_shard", "size": 2}]},
          "params": [{"name": "w", "shape": [4, 4],
                      "placements": ["Shard(0)"]}]})json");
  std::string output;
  EXPECT_EQ(
      RunMuonctl(absl::StrCat("validate --spec ", spec,
                              " --steps 1 --coordinator 127.0.0.1:1 "
                              "--timeout_s 1"),
                 &output, absl::StrCat("TEST_TMPDIR=", tmp, " TMPDIR=", tmp)),
      1)
      << output;
  EXPECT_THAT(output, HasSubstr("2 rank processes")) << "it got to fork";
  EXPECT_THAT(DirEntries(tmp), ::testing::IsEmpty()) << output;
  EXPECT_EQ(system(absl::StrCat("rm -rf ", root).c_str()), 0);
}

}  // namespace
}  // namespace muon
