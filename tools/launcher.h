// Starting and reaping local rank processes (a tiny torchrun): used by the
// Fashion-MNIST job, `muonctl validate` and the multi-process tests. Every
// process started is waited for with a bound and killed past it.
#ifndef MUON_TOOLS_LAUNCHER_H_
#define MUON_TOOLS_LAUNCHER_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muon {

// Path of the running executable (/proc/self/exe).
std::string SelfExecutable();

// Starts argv[0] with argv and the current environment plus `extra_env`
// ("NAME=value"). Errors: Internal when fork/exec fails.
absl::StatusOr<pid_t> SpawnProcess(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env = {});

// WaitAll's code for a process whose exit status was lost: reaped by
// another waiter, or by the kernel while SIGCHLD is ignored (SIG_IGN, which
// survives execve) in this process.
inline constexpr int kExitStatusUnknown = -2;

// Waits for every pid up to `timeout` in total, then SIGKILLs and reaps the
// survivors. Returns per pid its exit code, 128+signal when killed by a
// signal, -1 when it had to be killed for the timeout, or
// kExitStatusUnknown (a failure) when waitpid says ECHILD. If one process
// fails (non-zero), the others get `grace` to finish before being killed,
// so a failed rank never leaves its peers hanging. `exit_order`, when not
// null, receives the indices of the processes in the order they ended
// (those killed for the timeout last).
std::vector<int> WaitAll(const std::vector<pid_t>& pids, absl::Duration timeout,
                         absl::Duration grace = absl::Seconds(20),
                         std::vector<int>* exit_order = nullptr);

// Waits until `path` holds a port number written by a starting process
// (`pid`, which must stay alive), up to `timeout`.
// Errors: DeadlineExceeded; Aborted when `pid` exited first or is not (any
// longer) a child of this process.
absl::StatusOr<int> WaitForPortFile(const std::string& path, pid_t pid,
                                    absl::Duration timeout);

// How to start the rank processes of one job (LaunchRanks).
struct RankLaunchOptions {
  int world_size = 1;
  // The command line of rank r (argv[0] is the program); LaunchRanks adds
  // "--port_file=PATH" (rank 0 embedding the coordinator) or
  // "--coordinator=HOST:PORT".
  std::function<std::vector<std::string>(int rank)> argv;
  // host:port of a running coordinator; empty = rank 0 embeds one and
  // writes its port to `port_file`.
  std::string coordinator;
  std::string port_file;
  // Bound on the whole run, seconds of wall time (start included).
  absl::Duration timeout = absl::Minutes(10);
  // After the first failure, how long the other ranks may still run.
  absl::Duration grace = absl::Seconds(20);
};

// Starts `world_size` rank processes (a tiny torchrun: rank 0 first, the
// others once rank 0's embedded coordinator listens) and waits for all of
// them, killing any still running at the bound.
// Errors: Internal when a process cannot be started; Aborted naming rank 0
// when its coordinator never came up, or the rank that failed FIRST (in
// time, not the lowest: the others usually fail because of it) with its exit
// code or signal ("rank 2 killed by signal 9 (Killed)"; "killed after the
// timeout" when it had to be killed; "exit status is unknown" when it was
// reaped elsewhere, e.g. with SIGCHLD ignored).
absl::Status LaunchRanks(const RankLaunchOptions& options);

// A fresh directory under $TMPDIR (or /tmp). Errors: Internal.
absl::StatusOr<std::string> MakeTempDir(const std::string& prefix);

}  // namespace muon

#endif  // MUON_TOOLS_LAUNCHER_H_
