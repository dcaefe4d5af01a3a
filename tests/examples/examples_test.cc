// Runs every layout example binary (examples/layouts, one per parallelism
// layout) the way a user would, each bounded by `timeout`, and checks
// that it exits 0 and prints its OK line: every rank's parameters after 3
// steps equal, bit for bit, a single-device run of the same model and
// gradients.
#include <dirent.h>
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/command_util.h"

namespace {

using ::testing::HasSubstr;

struct ExampleCase {
  const char* name;  // //examples/layouts:<name>
  int world;         // its default number of rank processes
};

// Every example of examples/layouts/examples.bzl, with its world size.
constexpr ExampleCase kExamples[] = {
    {"single_device", 1},
    {"ddp", 2},
    {"fsdp", 4},
    {"fsdp_shard1", 4},
    {"tp", 2},
    {"hsdp", 4},
    {"tp_fsdp", 4},
    {"tp_hsdp", 8},
    {"cp", 2},
    {"ep", 4},
    {"ep_tp", 4},
    {"pp", 2},
    {"pp_tp_hsdp", 8},
    {"custom", 4},
    {"debug", 2},
};

void PrintTo(const ExampleCase& e, std::ostream* os) { *os << e.name; }

using ::muon::testing::CommandResult;
using ::muon::testing::RunCommand;

class ExamplesTest : public ::testing::TestWithParam<ExampleCase> {};

// Seconds left of the budget of the whole test (each example takes about a
// second; a hang must not eat bazel's test timeout).
int SecondsLeft() {
  static const absl::Time deadline = absl::Now() + absl::Seconds(200);
  return static_cast<int>(absl::ToInt64Seconds(deadline - absl::Now()));
}

TEST_P(ExamplesTest, RunsAndMatchesSingleDeviceBitwise) {
  const ExampleCase& e = GetParam();
  const int budget_s = std::min(30, SecondsLeft());
  ASSERT_GE(budget_s, 5) << "the test's time budget is spent";
  // The example bounds its own ranks (--timeout_s); `timeout` bounds it.
  const CommandResult r = RunCommand(
      absl::StrCat("examples/layouts/", e.name, " --timeout_s=", budget_s - 5),
      budget_s);
  std::printf("%s", r.output.c_str());  // the example's lines, for test.log
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr(absl::StrCat("example ", e.name, ": OK (world ",
                                     e.world, ", max_abs_diff 0)\n")))
      << r.output;
}

// The binaries in this test's data (examples.bzl) are exactly kExamples,
// so a new example cannot be left out of the test.
TEST(ExamplesListTest, EveryBuiltExampleIsRun) {
  std::set<std::string> built, listed;
  DIR* dir = opendir("examples/layouts");
  ASSERT_NE(dir, nullptr) << "no examples/layouts in the runfiles";
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") built.insert(name);
  }
  closedir(dir);
  for (const ExampleCase& e : kExamples) listed.insert(e.name);
  EXPECT_EQ(built, listed);
}

std::string CaseName(const ::testing::TestParamInfo<ExampleCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExamplesTest, ::testing::ValuesIn(kExamples),
                         CaseName);

}  // namespace
