#include "tools/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordination/credentials.h"

extern char** environ;

namespace muon {

std::string SelfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

absl::StatusOr<pid_t> SpawnProcess(const std::vector<std::string>& argv,
                                   const std::vector<std::string>& extra_env) {
  if (argv.empty())
    return absl::InvalidArgumentError("SpawnProcess: empty argv");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  for (const std::string& e : extra_env) env.push_back(e);
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv)
    cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  return pid;
}

std::vector<int> WaitAll(const std::vector<pid_t>& pids, absl::Duration timeout,
                         absl::Duration grace, std::vector<int>* exit_order) {
  if (exit_order != nullptr) exit_order->clear();
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  absl::Time deadline = absl::Now() + timeout;
  size_t remaining = pids.size();
  bool shortened = false;
  while (remaining > 0 && absl::Now() < deadline) {
    bool progressed = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      pid_t r = waitpid(pids[i], &status, WNOHANG);
      // ECHILD: reaped by another waiter (or by the kernel while SIGCHLD is
      // ignored); its status is lost, which counts as a failure.
      const bool lost = r < 0 && errno == ECHILD;
      if (r == pids[i] || lost) {
        done[i] = true;
        --remaining;
        progressed = true;
        codes[i] = lost                ? kExitStatusUnknown
                   : WIFEXITED(status) ? WEXITSTATUS(status)
                                       : 128 + WTERMSIG(status);
        if (exit_order != nullptr) exit_order->push_back(static_cast<int>(i));
        if (codes[i] != 0 && !shortened) {
          shortened = true;
          deadline = std::min(deadline, absl::Now() + grace);
        }
      }
    }
    if (!progressed) absl::SleepFor(absl::Milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    kill(pids[i], SIGKILL);
    int status = 0;
    waitpid(pids[i], &status, 0);
    codes[i] = -1;
    if (exit_order != nullptr) exit_order->push_back(static_cast<int>(i));
  }
  return codes;
}

absl::StatusOr<int> WaitForPortFile(const std::string& path, pid_t pid,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string text;
    if (in >> text) {
      int port = 0;
      if (absl::SimpleAtoi(text, &port) && port > 0) return port;
    }
    // WNOWAIT leaves the exit status for WaitAll to collect.
    siginfo_t info;
    std::memset(&info, 0, sizeof(info));
    const int r = waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT);
    if (r == 0 && info.si_pid == pid) {
      return absl::AbortedError(absl::StrCat(
          "process ", pid, " exited before writing its port to ", path));
    }
    if (r < 0 && errno == ECHILD) {
      return absl::AbortedError(absl::StrCat(
          "process ", pid,
          " is not a child of this process (reaped by "
          "another waiter: is SIGCHLD ignored?) and wrote no port to ",
          path));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no port in ", path, " after ", absl::FormatDuration(timeout)));
}

absl::StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* base = getenv("TEST_TMPDIR");
  if (base == nullptr) base = getenv("TMPDIR");
  std::string tmpl =
      absl::StrCat(base != nullptr ? base : "/tmp", "/", prefix, "XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  }
  return tmpl;
}

namespace {

// The environment the ranks get for the job secret: none when the caller
// (or the daemon) set MUON_JOB_SECRET or MUON_JOB_SECRET_FILE, otherwise a
// new secret for rank 0's embedded coordinator. Errors: JobSecretFromEnv's
// (a variable set but blank, which would turn authentication off).
absl::StatusOr<std::vector<std::string>> JobSecretEnv() {
  std::vector<std::string> secret_env;
  absl::StatusOr<std::string> secret = JobSecretFromEnv();
  if (!secret.ok()) return secret.status();
  if (secret->empty()) {
    absl::StatusOr<std::string> fresh = GenerateSecret();
    if (!fresh.ok()) return fresh.status();
    secret_env.push_back(absl::StrCat("MUON_JOB_SECRET=", *fresh));
  }
  return secret_env;
}

// The job's outcome from the ranks' exit codes (`codes`, -1 for killed
// after the timeout, kExitStatusUnknown when lost) and the order they
// exited in: OK when all exited 0, else Aborted naming the first rank to
// fail in time.
absl::Status RanksOutcome(const RankLaunchOptions& o,
                          const std::vector<int>& codes,
                          const std::vector<int>& order) {
  // The first rank to fail in time is the one to name: the others usually
  // fail because of it.
  for (int r : order) {
    if (codes[r] == kExitStatusUnknown) {
      return absl::AbortedError(
          absl::StrCat("rank ", r,
                       "'s exit status is unknown (it was reaped by another "
                       "waiter: is SIGCHLD ignored?)"));
    }
    if (codes[r] > 128) {
      const int sig = codes[r] - 128;
      return absl::AbortedError(absl::StrCat("rank ", r, " killed by signal ",
                                             sig, " (", strsignal(sig),
                                             ") first; see the errors above"));
    }
    if (codes[r] > 0) {
      return absl::AbortedError(absl::StrCat("rank ", r, " exited with ",
                                             codes[r],
                                             " first (see its error above)"));
    }
  }
  for (int r = 0; r < o.world_size; ++r) {
    if (codes[r] == -1) {
      return absl::AbortedError(
          absl::StrCat("rank ", r, " killed after the timeout (",
                       absl::FormatDuration(o.timeout), ")"));
    }
    if (codes[r] != 0) {
      return absl::AbortedError(absl::StrCat(
          "rank ", r, " exited with ", codes[r], " (see its error above)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchRanks(const RankLaunchOptions& o) {
  const absl::Time start = absl::Now();
  // The ranks share the job secret: the caller's (and the daemon's) from the
  // environment, or a new one for rank 0's embedded coordinator.
  absl::StatusOr<std::vector<std::string>> secret_env_or = JobSecretEnv();
  if (!secret_env_or.ok()) return secret_env_or.status();
  const std::vector<std::string>& secret_env = *secret_env_or;
  auto left = [&] {
    return std::max(o.timeout - (absl::Now() - start), absl::Seconds(1));
  };
  std::vector<pid_t> pids;
  std::string address = o.coordinator;
  {
    std::vector<std::string> a = o.argv(0);
    a.push_back(address.empty() ? "--port_file=" + o.port_file
                                : "--coordinator=" + address);
    absl::StatusOr<pid_t> pid = SpawnProcess(a, secret_env);
    if (!pid.ok()) return pid.status();
    pids.push_back(*pid);
  }
  if (address.empty()) {
    absl::StatusOr<int> port = WaitForPortFile(o.port_file, pids[0], left());
    if (!port.ok()) {
      WaitAll(pids, absl::Seconds(5), absl::Seconds(1));
      return absl::AbortedError(absl::StrCat(
          "rank 0 did not start its coordinator: ", port.status().message()));
    }
    address = absl::StrCat("127.0.0.1:", *port);
  }
  for (int r = 1; r < o.world_size; ++r) {
    std::vector<std::string> a = o.argv(r);
    a.push_back("--coordinator=" + address);
    absl::StatusOr<pid_t> pid = SpawnProcess(a, secret_env);
    if (!pid.ok()) {
      WaitAll(pids, absl::Seconds(5), absl::Seconds(1));
      return pid.status();
    }
    pids.push_back(*pid);
  }
  std::vector<int> order;
  const std::vector<int> codes = WaitAll(pids, left(), o.grace, &order);
  return RanksOutcome(o, codes, order);
}

}  // namespace muon
