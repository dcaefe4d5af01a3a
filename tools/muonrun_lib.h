// muonrun: torchrun's launcher for any program (C++ trainers, muonctl, a
// Python script), without Python. On each node it starts
// --nproc-per-node rank processes with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT, ...), which ProcessGroupOptionsFromEnv (client/
// process_group.h) and torch.distributed's env:// read; rank 0 embeds the
// coordinator on MASTER_ADDR, at a port the kernel picks on one node
// (its address handed over in muonrun's private directory:
// MUON_COORDINATOR_FILE) and at MASTER_PORT + 1 on several nodes. Static
// membership only: every
// node runs `muonrun --nnodes M --node-rank K --master-addr A
// --master-port P ...` with the same A and P (no elastic rendezvous, no
// restarts).
//
// Supervision (RunRanks), per node:
//
//   start ranks ──> running ──(all exited 0)──────────────> exit 0
//                     │
//                     ├──(a rank exits non-zero or dies by a signal)──┐
//                     ├──(--timeout_s passes)─────────────────────────┤
//                     └──(muonrun gets SIGINT/SIGTERM/SIGHUP)─────────┤
//                                                                     v
//            stopping: SIGTERM (or the signal muonrun got) to every
//            running rank's process group, SIGKILL after --grace_s
//                                                                     v
//            exit: the first failed rank's exit code (128+signal when a
//            signal killed it), 124 after the timeout, 128+signal when
//            muonrun itself was signalled
//
// As host agent (MuonrunOptions::host_agent), muonrun reports each exit
// to the coordinator as it reaps it, and waits the agent's settle time
// (three heartbeat intervals) after the first failure before stopping the
// other ranks, so that each ends on its own naming the failed rank.
//
// Each rank runs in its own process group (so a rank's children are
// stopped with it, those of a rank that exited earlier included) and gets
// SIGKILL if muonrun dies (PR_SET_PDEATHSIG). muonrun sees each exit as it
// happens but reaps the rank only when the job ends, after its last signal
// to the rank's group: until then the rank's pid, which numbers its
// process group, cannot be given to another process. The first failure, in
// the order muonrun saw the exits, is reported on stderr as
//   muonrun: rank 2 (local rank 2, pid 4242) failed first: exited with code 1
//   muonrun: rank 1 (local rank 1, pid 4241) failed first: killed by signal
//   9 (SIGKILL)
#ifndef MUON_TOOLS_MUONRUN_LIB_H_
#define MUON_TOOLS_MUONRUN_LIB_H_

#include <sys/types.h>

#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace muon {

// Exit code of muonrun for usage errors.
inline constexpr int kMuonrunUsageExitCode = 2;
// Exit code of muonrun when --timeout_s passed (as coreutils timeout).
inline constexpr int kMuonrunTimeoutExitCode = 124;
// muonrun's exit code for a rank whose exit status was lost (RankExit::
// status_unknown): a failure, as nothing says the rank succeeded.
inline constexpr int kMuonrunUnknownStatusExitCode = 1;

struct MuonrunOptions {
  // Rank processes on this node (--nproc-per-node; "cpu"/"auto" = the
  // number of CPUs, as torchrun without GPUs).
  int nproc_per_node = 1;
  // Nodes in the job (--nnodes); a fixed number, not torchrun's MIN:MAX.
  int nnodes = 1;
  // This node's index in [0, nnodes) (--node-rank).
  int node_rank = 0;
  // Host of rank 0 (its embedded coordinator listens there), seen from
  // every node (--master-addr).
  std::string master_addr = "127.0.0.1";
  // Port of rank 0's coordinator, 1..65535 (--master-port).
  int master_port = 29500;
  // --standalone: one node, 127.0.0.1 and a free port picked by muonrun.
  bool standalone = false;
  // --max-restarts: only 0 (a failure ends the job).
  int max_restarts = 0;
  // Bound on the whole run (--timeout_s); InfiniteDuration = none.
  absl::Duration timeout = absl::InfiniteDuration();
  // How long stopped ranks get between SIGTERM and SIGKILL (--grace_s).
  absl::Duration grace = absl::Seconds(10);
  // Each line a rank writes to stdout or stderr goes out as "[rank N] line"
  // on muonrun's stdout or stderr, whole lines at a time so that ranks do
  // not interleave mid-line (torchrun's --tee / log prefixes);
  // --no-rank-prefix passes the ranks' output through untouched. A line
  // longer than 1 MiB goes out in pieces of 1 MiB, each as a line of its
  // own, so that output that never ends a line (a progress bar rewriting
  // one line with '\r') is still forwarded and muonrun holds at most
  // 1 MiB of it per stream; shorter lines (a JSON metrics record) stay
  // whole.
  bool rank_prefix = true;
  // When the environment names a muon-coordinator daemon (MUON_COORDINATOR
  // host:port), muonrun is this node's host agent (control/host_agent.h):
  // its ranks reach the coordinator through it, on a Unix socket in its
  // private directory, so the coordinator holds one connection, join and
  // heartbeat per node instead of per rank, and a rank whose process ends
  // is named at once. --no-host-agent connects every rank directly.
  bool host_agent = true;
  // --help / -h: print the usage and exit 0.
  bool help = false;
  // The program (resolved on PATH as execvp does) and its arguments.
  std::vector<std::string> program;
};

// The usage text (several lines, ends with a newline).
std::string MuonrunUsage();

// Parses muonrun's arguments (argv without argv[0]). Flags come before the
// program; the first argument that is not a flag (or everything after
// "--") is the program. Flags take "--flag value" or "--flag=value", with
// dashes or underscores (--nproc-per-node, --nproc_per_node), as torchrun.
// --standalone picks master_addr 127.0.0.1 and a free port.
// Errors: InvalidArgument naming the flag and value (unknown flag, missing
// or malformed value, out of range, nnodes * nproc_per_node above
// kMaxWorldSize (naming both flags), node_rank >= nnodes, --standalone with
// --nnodes > 1 or with --master-addr/--master-port, --max-restarts > 0, no
// program); Unavailable when --standalone finds no free port.
absl::StatusOr<MuonrunOptions> ParseMuonrunArgs(
    const std::vector<std::string>& args);

// The variables muonrun sets for local rank `local_rank`, in this order:
// RANK (node_rank * nproc_per_node + local_rank), WORLD_SIZE (nnodes *
// nproc_per_node), LOCAL_RANK, LOCAL_WORLD_SIZE (nproc_per_node),
// GROUP_RANK (node_rank), GROUP_WORLD_SIZE (nnodes), ROLE_RANK,
// ROLE_WORLD_SIZE (= RANK, WORLD_SIZE), MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT (0), TORCHELASTIC_MAX_RESTARTS (0),
// TORCHELASTIC_RUN_ID ("none", torchrun's default), and OMP_NUM_THREADS=1
// when nproc_per_node > 1 and `base_env` does not set it (as torchrun).
std::vector<std::pair<std::string, std::string>> RankEnvironment(
    const MuonrunOptions& options, int local_rank,
    const std::vector<std::string>& base_env);

// `base` ("NAME=value" entries) with `vars` added, replacing entries of the
// same name (so a value inherited from an outer launcher never shadows the
// rank's own).
std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& vars);

// The current process's environment as "NAME=value" entries.
std::vector<std::string> CurrentEnvironment();

// How one rank process ended.
struct RankExit {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = 0;
  // Exit code when it exited; 0 when killed.
  int exit_code = 0;
  // Signal that killed it; 0 when it exited.
  int signal = 0;
  // Its exit status was lost: another waiter (or the kernel, when SIGCHLD
  // is ignored in muonrun's process) reaped it. Counts as a failure.
  bool status_unknown = false;
  bool failed() const {
    return exit_code != 0 || signal != 0 || status_unknown;
  }
  // muonrun's exit code for it: exit_code, 128 + signal, or
  // kMuonrunUnknownStatusExitCode when the status was lost.
  int status_code() const {
    if (status_unknown) return kMuonrunUnknownStatusExitCode;
    return signal != 0 ? 128 + signal : exit_code;
  }
  // "exited with code 1", "killed by signal 9 (SIGKILL)" or "exit status
  // unknown (...)".
  std::string Describe() const;
};

// What RunRanks saw.
struct RunRanksResult {
  // muonrun's exit code (see the diagram above).
  int exit_code = 0;
  // The first rank muonrun saw fail, if any (before muonrun
  // started stopping ranks itself).
  std::optional<RankExit> first_failure;
  bool timed_out = false;
  // The signal muonrun received (stopping the ranks), or 0.
  int received_signal = 0;
  // Ranks still running when muonrun began stopping them, and how many of
  // those needed SIGKILL after the grace period.
  int stopped = 0;
  int killed = 0;
  // Every rank's end, in local rank order.
  std::vector<RankExit> exits;
};

// `base` with the job secret the ranks share: kept when MUON_JOB_SECRET or
// MUON_JOB_SECRET_FILE is set, else a new random MUON_JOB_SECRET on one node.
// Errors: InvalidArgument when either is set but empty or only whitespace
// (CheckJobSecret, naming it: a blank secret turns authentication off), or
// when nnodes > 1 and none is set (every node needs the same secret);
// Internal when no random secret can be made.
absl::StatusOr<std::vector<std::string>> WithJobSecret(
    const MuonrunOptions& o, std::vector<std::string> base);

// Whether `env` ("NAME=value" entries) names the coordinator already:
// MUON_COORDINATOR, MUON_COORDINATOR_PORT or MUON_COORDINATOR_FILE set and
// not empty.
bool NamesCoordinator(const std::vector<std::string>& env);

// Whether rank 0's coordinator has a port: on several nodes, unless `env`
// names the coordinator (NamesCoordinator), it listens on master_port + 1.
// Errors: InvalidArgument naming --master-port and --nnodes when that is
// 65536.
absl::Status CheckCoordinatorPort(const MuonrunOptions& o,
                                  const std::vector<std::string>& env);

// On one node (nnodes == 1) and unless `base` names the coordinator
// (NamesCoordinator): `base` plus MUON_COORDINATOR_FILE=<dir>/coordinator,
// so that rank 0 embeds the coordinator on a port the kernel picks and
// hands its address to the other ranks through muonrun's private directory
// `dir` (ProcessGroupOptionsFromEnv, control/process_group.h) instead of
// the fixed MASTER_PORT + 1, which another job may hold. Else `base`.
std::vector<std::string> WithCoordinatorFile(const MuonrunOptions& o,
                                             std::vector<std::string> base,
                                             const std::string& dir);

// The coordinator address the host agent serves for (MUON_COORDINATOR in
// `env`, when options.host_agent is set and it is not already a Unix
// socket), or "" for no host agent.
std::string HostAgentTarget(const MuonrunOptions& o,
                            const std::vector<std::string>& env);

// `base` with MUON_COORDINATOR set to the host agent's `address` and the
// TLS client settings (MUON_TLS_CA_FILE, MUON_TLS_SERVER_NAME) removed:
// the ranks reach the agent over its plaintext Unix socket; the agent
// uses them towards the coordinator.
std::vector<std::string> WithHostAgent(std::vector<std::string> base,
                                       const std::string& address);

// Starts options.nproc_per_node rank processes of `options.program` with
// the current environment plus RankEnvironment, and supervises them as the
// diagram above, writing muonrun's report lines to `err`. Returns when
// every rank process has been reaped (none is left running).
// Errors: Internal when a rank cannot be started (fork fails; the ranks
// already started are stopped first); WithJobSecret's and
// CheckCoordinatorPort's. A program that cannot be executed is a rank
// exiting with code 127 (its message names the program). After the ranks
// end, their output is forwarded for at most the grace period (at least
// 200 ms): a process a rank left behind that keeps writing to it is named
// on `err` and no longer forwarded. A rank reaped by someone else (SIGCHLD
// ignored in this process; InstallMuonrunSignalHandlers resets it) is a
// failure with RankExit::status_unknown.
absl::StatusOr<RunRanksResult> RunRanks(const MuonrunOptions& options,
                                        std::ostream& err);

// Makes SIGINT, SIGTERM and SIGHUP stop a running RunRanks (forwarded to
// the ranks, then SIGKILL after the grace period) instead of killing
// muonrun, and resets SIGCHLD to its default: an ignored SIGCHLD (kept
// across execve from whoever started muonrun) makes the kernel reap the
// ranks itself, and their exit statuses would be lost. Called by the
// muonrun binary's main.
void InstallMuonrunSignalHandlers();

// The whole command: parses `args` (argv without argv[0]), prints usage to
// `out` for --help, usage errors to `err` (returns 2), runs the ranks and
// returns muonrun's exit code.
int MuonrunMain(const std::vector<std::string>& args, std::ostream& out,
                std::ostream& err);

}  // namespace muon

#endif  // MUON_TOOLS_MUONRUN_LIB_H_
