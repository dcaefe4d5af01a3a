// Running shell commands from tests, bounded in time (coreutils timeout),
// with their exit code and combined output.
#ifndef MUON_TESTS_COMMAND_UTIL_H_
#define MUON_TESTS_COMMAND_UTIL_H_

#include <stdio.h>
#include <sys/wait.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace muon {
namespace testing {

struct CommandResult {
  int exit_code = -1;  // 128 when it died of a signal; -1: did not start
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` under /bin/sh, killed after `timeout_s` seconds (SIGTERM,
// then SIGKILL `kill_after_s` seconds later).
inline CommandResult RunCommand(const std::string& command, int timeout_s,
                                int kill_after_s = 5) {
  CommandResult r;
  const std::string bounded = absl::StrCat("timeout -k ", kill_after_s, " ",
                                           timeout_s, " ", command, " 2>&1");
  FILE* p = popen(bounded.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_COMMAND_UTIL_H_
