#include "tools/muonrun_lib.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "control/host_agent.h"
#include "coordination/credentials.h"

extern char** environ;

namespace muon {
namespace {

// The signal muonrun received (0 = none); set by the handler.
volatile sig_atomic_t g_received_signal = 0;

extern "C" void OnStopSignal(int sig) { g_received_signal = sig; }

constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev)
                           : absl::StrCat("signal ", sig);
}

absl::Status Usage(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<int> ParseInt(const std::string& flag, const std::string& value,
                             int min, int max) {
  int x = 0;
  if (!absl::SimpleAtoi(value, &x)) {
    return Usage(
        absl::StrCat("--", flag, ": \"", value, "\" is not an integer"));
  }
  if (x < min || x > max) {
    return Usage(absl::StrCat("--", flag, " ", x, " is out of range (", min,
                              "..", max, ")"));
  }
  return x;
}

absl::StatusOr<absl::Duration> ParseSeconds(const std::string& flag,
                                            const std::string& value,
                                            bool allow_zero) {
  double s = 0;
  if (!absl::SimpleAtod(value, &s) || !(s >= 0) || (!allow_zero && s == 0) ||
      s > 1e9) {
    return Usage(absl::StrCat("--", flag, ": \"", value,
                              "\" is not a number of seconds ",
                              allow_zero ? ">= 0" : "> 0"));
  }
  return absl::Seconds(s);
}

// A TCP port on 127.0.0.1 that was free a moment ago.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("--standalone: socket: ", std::strerror(errno)));
  }
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  const int saved = errno;
  close(fd);
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "--standalone: no free port on 127.0.0.1: ", std::strerror(saved)));
  }
  return port;
}

// Sends `sig` to the process group of rank process `pid` (its own, see
// RunRanks), or to the process alone if the group is gone.
void SignalRank(pid_t pid, int sig) {
  if (kill(-pid, sig) != 0) kill(pid, sig);
}

// Copies one rank's stdout or stderr pipe to `dest` (1 or 2) line by line
// as "[rank N] line" (a line over kMaxLineBytes in pieces of that size,
// each as a line), each line in one write under a lock shared by every
// forwarder, until EOF or, once stopped (StopBy), until the pipe has been
// quiet for 200 ms (a grandchild may hold it open) or the stop's deadline
// passes (a grandchild may keep writing to it).
class LineForwarder {
 public:
  LineForwarder(int fd, int dest, int rank)
      : fd_(fd), dest_(dest), prefix_(absl::StrCat("[rank ", rank, "] ")) {
    thread_ = std::thread([this] { Run(); });
  }
  // Stops with a bound of one second unless StopBy was called.
  ~LineForwarder() {
    if (!stop_.load()) StopBy(absl::Now() + absl::Seconds(1));
    Join();
    close(fd_);
  }

  // Asks the forwarder to stop (see the class comment) by `deadline`;
  // returns at once. Called once.
  void StopBy(absl::Time deadline) {
    {
      std::lock_guard<std::mutex> lock(deadline_mu_);
      deadline_ = deadline;
    }
    stop_.store(true);
  }
  // Waits for the forwarder to end; true when it stopped at the deadline
  // with output still coming (the rest of it is not forwarded).
  bool Join() {
    if (thread_.joinable()) thread_.join();
    return cut_;
  }

 private:
  static constexpr int kQuietMs = 200;
  // The longest unfinished line held (bytes); a longer one is forwarded in
  // pieces of this size, so memory stays bounded for output without '\n'.
  static constexpr size_t kMaxLineBytes = size_t{1} << 20;

  static std::mutex& OutputMutex() {
    static std::mutex* mu = new std::mutex();
    return *mu;
  }
  void Emit(absl::string_view line) {
    const std::string out = absl::StrCat(prefix_, line, "\n");
    std::lock_guard<std::mutex> lock(OutputMutex());
    for (size_t done = 0; done < out.size();) {
      const ssize_t n = write(dest_, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += static_cast<size_t>(n);
    }
  }
  // How long the next poll may wait: kQuietMs, less near the deadline once
  // stopped; -1 once the deadline has passed.
  int PollWaitMs() {
    if (!stop_.load()) return kQuietMs;
    absl::Time deadline;
    {
      std::lock_guard<std::mutex> lock(deadline_mu_);
      deadline = deadline_;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return -1;
    return static_cast<int>(std::min<int64_t>(
        kQuietMs,
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
  }
  void Run() {
    std::string pending;
    char buf[4096];
    absl::Time last_data = absl::InfinitePast();
    while (true) {
      const int wait_ms = PollWaitMs();
      if (wait_ms < 0) {
        // Cut only when still written to within kQuietMs of the deadline
        // (a pipe quiet since must not be reported as cut).
        cut_ = absl::Now() - last_data < absl::Milliseconds(kQuietMs);
        break;
      }
      struct pollfd p = {fd_, POLLIN, 0};
      const int ready = poll(&p, 1, wait_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        // Quiet for a whole kQuietMs after the stop: done.
        if (stop_.load() && wait_ms == kQuietMs) break;
        continue;
      }
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // EOF: every writer closed the pipe
      last_data = absl::Now();
      const size_t searched = pending.size();  // holds no newline
      pending.append(buf, static_cast<size_t>(n));
      // Only the bytes just read are searched: linear in the output, not
      // quadratic in the length of a line.
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', std::max(start, searched))) !=
                      std::string::npos;
           start = nl + 1) {
        Emit(absl::string_view(pending).substr(start, nl - start));
      }
      pending.erase(0, start);
      EmitLongLine(pending);
    }
    if (!pending.empty()) Emit(pending);
  }
  // While the unfinished line `pending` is over kMaxLineBytes, forwards its
  // first kMaxLineBytes (less the bytes of a UTF-8 character cut there) as
  // a line of its own and drops them.
  void EmitLongLine(std::string& pending) {
    while (pending.size() > kMaxLineBytes) {
      size_t cut = kMaxLineBytes;
      while (cut > kMaxLineBytes - 3 &&
             (static_cast<unsigned char>(pending[cut]) & 0xC0) == 0x80) {
        --cut;  // a UTF-8 continuation byte: the character goes next
      }
      Emit(absl::string_view(pending).substr(0, cut));
      pending.erase(0, cut);
    }
  }

  const int fd_;  // Owned: the read end of the rank's pipe.
  const int dest_;
  const std::string prefix_;
  std::atomic<bool> stop_{false};
  std::mutex deadline_mu_;
  absl::Time deadline_;  // guarded by deadline_mu_; set by StopBy
  bool cut_ = false;     // written by the thread, read after Join
  std::thread thread_;
};

// One rank process. Its pid is also the number of its process group
// (StartRank). Why its exit is seen (done) long before it is reaped
// (Release): Linux, as POSIX requires, gives a pid to no new process while
// that number still names a process or a process group, a zombie
// included. Reaping a rank whose group is empty (no child of its own left)
// frees the number, and a later kill(-pid) could reach an unrelated
// process group that reuses it. A rank kept as a zombie keeps its group's
// number ours, so that muonrun can stop the group of every rank it started
// (as torchrun stops each worker's whole group), the groups of ranks that
// ended long ago included: their children may still run.
struct Child {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  // Its exit has been seen (exit is set): it no longer runs.
  bool done = false;
  // Not yet reaped: its zombie (or it, running) holds the pid, so signals
  // to -pid reach its own process group only.
  bool held = true;
  RankExit exit;
  // With rank_prefix: the forwarders of its stdout and stderr.
  std::vector<std::shared_ptr<LineForwarder>> forwarders;
};

// Sees whether `c` has exited (waits for it when `block`) without reaping
// it: its zombie stays until Release. Returns whether it is done. A child
// already reaped by another waiter (ECHILD: the kernel reaps children
// itself while SIGCHLD is ignored) is done, not held, with an unknown exit
// status.
bool Observe(Child& c, bool block) {
  if (c.done) return true;
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  int r;
  do {
    r = waitid(P_PID, static_cast<id_t>(c.pid), &info,
               WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  c.exit.rank = c.rank;
  c.exit.local_rank = c.local_rank;
  c.exit.pid = c.pid;
  if (r < 0) {
    if (errno != ECHILD) return false;
    c.done = true;
    c.held = false;
    c.exit.status_unknown = true;
    return true;
  }
  if (info.si_pid != c.pid) return false;  // WNOHANG: still running
  c.done = true;
  if (info.si_code == CLD_EXITED) {
    c.exit.exit_code = info.si_status;
  } else {  // CLD_KILLED or CLD_DUMPED
    c.exit.signal = info.si_status;
  }
  return true;
}

// Reaps every child that is done and still held, after the last signal to
// its process group. Call only once every child is done.
void Release(std::vector<Child>& children) {
  for (Child& c : children) {
    if (!c.done || !c.held) continue;
    int status = 0;
    while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.held = false;
  }
}

int Running(const std::vector<Child>& children) {
  return static_cast<int>(
      std::count_if(children.begin(), children.end(),
                    [](const Child& c) { return !c.done; }));
}

std::string Ranks(int n) {
  return absl::StrCat(n, " local rank", n == 1 ? "" : "s");
}

// Stops every running child: `sig` to its process group, SIGKILL after
// `grace`; waits until every one is done (Observe, not yet reaped).
// Returns how many needed SIGKILL.
int StopChildren(std::vector<Child>& children, int sig, absl::Duration grace) {
  for (Child& c : children) {
    if (!c.done) SignalRank(c.pid, sig);
  }
  const absl::Time deadline = absl::Now() + grace;
  while (Running(children) > 0 && absl::Now() < deadline) {
    bool progressed = false;
    for (Child& c : children) {
      if (!c.done && Observe(c, /*block=*/false)) progressed = true;
    }
    if (!progressed) absl::SleepFor(kPollInterval);
  }
  int killed = 0;
  for (Child& c : children) {
    if (c.done) continue;
    SignalRank(c.pid, SIGKILL);
    Observe(c, /*block=*/true);
    ++killed;
  }
  return killed;
}

// Closes the pipe ends in `fds` that are open (>= 0).
void ClosePipes(std::initializer_list<int> fds) {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
}

// The forked child's side of StartRank: output to the pipes' write ends
// (when given), its own process group, death with `parent`, no blocked
// signals, then execvpe; on failure writes `exec_error` and the reason to
// stderr and exits 127. Only async-signal-safe calls after fork.
[[noreturn]] void ExecRank(char* const* argv, char* const* envp, int out_fd,
                           int err_fd, pid_t parent,
                           const std::string& exec_error) {
  if (out_fd >= 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
  }
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // muonrun already gone
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvpe(argv[0], argv, envp);
  const char* reason = strerror(errno);
  ssize_t ignored = write(2, exec_error.data(), exec_error.size());
  ignored = write(2, reason, std::strlen(reason));
  ignored = write(2, "\n", 1);
  (void)ignored;
  _exit(127);
}

// Starts one rank process. The child gets its own process group and dies
// with muonrun (PR_SET_PDEATHSIG); exec failures exit 127 with a message.
absl::StatusOr<pid_t> StartRank(
    const std::vector<std::string>& argv, const std::vector<std::string>& env,
    int rank, std::vector<std::shared_ptr<LineForwarder>>* forwarders) {
  // With forwarders: the rank's stdout and stderr are pipes read here.
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (forwarders != nullptr &&
      (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) {
    const int e = errno;
    ClosePipes({out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]});
    return absl::InternalError(absl::StrCat("muonrun: pipe for rank ", rank,
                                            "'s output: ", std::strerror(e)));
  }
  std::vector<char*> cargv;
  for (const std::string& a : argv)
    cargv.push_back(const_cast<char*>(a.data()));
  cargv.push_back(nullptr);
  std::vector<char*> cenv;
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.data()));
  cenv.push_back(nullptr);
  const std::string exec_error = absl::StrCat(
      "muonrun: rank ", rank, ": cannot execute \"", argv[0], "\": ");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    ClosePipes({out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]});
    return absl::InternalError(
        absl::StrCat("muonrun: fork for rank ", rank, ": ", std::strerror(e)));
  }
  if (pid == 0) {
    ExecRank(cargv.data(), cenv.data(), out_pipe[1], err_pipe[1], parent,
             exec_error);
  }
  setpgid(pid, pid);  // also here: no race with an early SignalRank
  if (forwarders != nullptr) {
    close(out_pipe[1]);
    close(err_pipe[1]);
    forwarders->push_back(
        std::make_shared<LineForwarder>(out_pipe[0], 1, rank));
    forwarders->push_back(
        std::make_shared<LineForwarder>(err_pipe[0], 2, rank));
  }
  return pid;
}

}  // namespace

std::string MuonrunUsage() {
  return "usage: muonrun [--nproc-per-node N] [--nnodes M] [--node-rank K]\n"
         "               [--master-addr ADDR] [--master-port PORT] "
         "[--standalone]\n"
         "               [--max-restarts 0] [--timeout_s S] [--grace_s S]\n"
         "               program [args...]\n"
         "Starts N rank processes of `program` on this node (torchrun's flags "
         "and\n"
         "environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, "
         "GROUP_RANK,\n"
         "MASTER_ADDR, MASTER_PORT). Flags also take --flag=value and "
         "underscores\n"
         "(--nproc_per_node). On a rank failure the other ranks are stopped\n"
         "(SIGTERM, SIGKILL after --grace_s) and muonrun exits with the first\n"
         "failed rank's code (128+signal when killed).\n"
         "  --nproc-per-node N  rank processes on this node (default 1; "
         "cpu|auto:\n"
         "                      one per CPU)\n"
         "  --nnodes M          nodes in the job (default 1)\n"
         "  --node-rank K       this node, 0..M-1 (default 0)\n"
         "  --master-addr ADDR  host of rank 0 (default 127.0.0.1)\n"
         "  --master-port PORT  torch.distributed's store port on ADDR "
         "(default\n"
         "                      29500); rank 0's embedded coordinator listens\n"
         "                      on a free port on one node (its address in\n"
         "                      muonrun's private directory), on PORT + 1 on\n"
         "                      several\n"
         "  --standalone        one node: 127.0.0.1 and a free port\n"
         "  --no-host-agent     with MUON_COORDINATOR set, connect every rank "
         "to it\n"
         "                      (default: muonrun is the node's host agent: "
         "one\n"
         "                      join and heartbeat for all its ranks)\n"
         "  --no-rank-prefix    pass the ranks' output through as is "
         "(default:\n"
         "                      each line prefixed with [rank N])\n"
         "  --max-restarts 0    restarts are not supported (only 0)\n"
         "  --timeout_s S       stop the ranks after S seconds, exit 124 "
         "(default:\n"
         "                      no limit)\n"
         "  --grace_s S         seconds between SIGTERM and SIGKILL when "
         "stopping\n"
         "                      ranks (default 10)\n";
}

namespace {

// Sets the valued flag `name` (underscore spelling) to `v` in `o`, and
// records it in `given`.
absl::Status SetValuedFlag(const std::string& name, const std::string& v,
                           MuonrunOptions* o, std::set<std::string>* given) {
  given->insert(name);
  if (name == "nproc_per_node") {
    if (v == "cpu" || v == "auto") {
      const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      o->nproc_per_node = cpus > 0 ? static_cast<int>(cpus) : 1;
    } else if (v == "gpu") {
      return Usage(
          "--nproc-per-node gpu: muonrun does not count GPUs; give a number");
    } else {
      absl::StatusOr<int> n = ParseInt("nproc-per-node", v, 1, 1 << 16);
      if (!n.ok()) return n.status();
      o->nproc_per_node = *n;
    }
  } else if (name == "nnodes") {
    if (absl::StrContains(v, ":")) {
      return Usage(absl::StrCat("--nnodes ", v,
                                ": elastic ranges (MIN:MAX) are not "
                                "supported; give the number of nodes"));
    }
    absl::StatusOr<int> n = ParseInt("nnodes", v, 1, 1 << 16);
    if (!n.ok()) return n.status();
    o->nnodes = *n;
  } else if (name == "node_rank") {
    absl::StatusOr<int> n = ParseInt("node-rank", v, 0, 1 << 16);
    if (!n.ok()) return n.status();
    o->node_rank = *n;
  } else if (name == "master_addr") {
    if (v.empty()) return Usage("--master-addr is empty");
    o->master_addr = v;
  } else if (name == "master_port") {
    absl::StatusOr<int> n = ParseInt("master-port", v, 1, 65535);
    if (!n.ok()) return n.status();
    o->master_port = *n;
  } else if (name == "max_restarts") {
    absl::StatusOr<int> n = ParseInt("max-restarts", v, 0, 1 << 20);
    if (!n.ok()) return n.status();
    if (*n != 0) {
      return Usage(absl::StrCat(
          "--max-restarts ", *n,
          ": restarts are not supported (they need elastic rendezvous "
          "across nodes); use 0"));
    }
    o->max_restarts = *n;
  } else if (name == "timeout_s") {
    absl::StatusOr<absl::Duration> d =
        ParseSeconds("timeout_s", v, /*allow_zero=*/false);
    if (!d.ok()) return d.status();
    o->timeout = *d;
  } else if (name == "grace_s") {
    absl::StatusOr<absl::Duration> d =
        ParseSeconds("grace_s", v, /*allow_zero=*/true);
    if (!d.ok()) return d.status();
    o->grace = *d;
  }
  return absl::OkStatus();
}

// Checks the options against each other and, with --standalone, picks
// 127.0.0.1 and a free port.
absl::Status FinishOptions(const std::set<std::string>& given,
                           MuonrunOptions* o) {
  // In int64: both flags go up to 65536, and their product overflows int.
  const int64_t world = int64_t{o->nnodes} * o->nproc_per_node;
  if (world > kMaxWorldSize) {
    return Usage(absl::StrCat("--nnodes ", o->nnodes, " x --nproc-per-node ",
                              o->nproc_per_node, " = ", world,
                              " ranks; a job has at most ", kMaxWorldSize));
  }
  if (o->node_rank >= o->nnodes) {
    return Usage(absl::StrCat("--node-rank ", o->node_rank,
                              " is out of range for --nnodes ", o->nnodes,
                              " (0..", o->nnodes - 1, ")"));
  }
  if (o->standalone) {
    if (o->nnodes != 1) {
      return Usage(absl::StrCat("--standalone is one node, but --nnodes is ",
                                o->nnodes));
    }
    if (given.count("master_addr") || given.count("master_port")) {
      return Usage(
          "--standalone picks the address and port itself; drop "
          "--master-addr / --master-port");
    }
    o->master_addr = "127.0.0.1";
    absl::StatusOr<int> port = FreePort();
    if (!port.ok()) return port.status();
    o->master_port = *port;
  }
  return absl::OkStatus();
}

// The flags without a value (`name` with underscores): sets the option
// and returns true, or false when `name` is not one of them.
// Errors: Usage when the flag came with a value.
absl::StatusOr<bool> SetSwitch(const std::string& name, bool has_value,
                               MuonrunOptions* o) {
  bool* option = nullptr;
  bool set_to = false;
  if (name == "no_rank_prefix") {
    option = &o->rank_prefix;
  } else if (name == "no_host_agent") {
    option = &o->host_agent;
  } else if (name == "standalone") {
    option = &o->standalone;
    set_to = true;
  } else {
    return false;
  }
  if (has_value) {
    return Usage(absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}),
                              " takes no value"));
  }
  *option = set_to;
  return true;
}

}  // namespace

absl::StatusOr<MuonrunOptions> ParseMuonrunArgs(
    const std::vector<std::string>& args) {
  MuonrunOptions o;
  std::set<std::string> given;  // valued flags given
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    if (!absl::StartsWith(arg, "--")) {
      return Usage(absl::StrCat("unknown flag ", arg));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const std::string spelled = absl::StrCat("--", name);
    name = absl::StrReplaceAll(name, {{"-", "_"}});
    MUON_ASSIGN_OR_RETURN(const bool was_switch,
                          SetSwitch(name, value.has_value(), &o));
    if (was_switch) continue;
    static const std::set<std::string>* const kValued =
        new std::set<std::string>{
            "nproc_per_node", "nnodes",       "node_rank", "master_addr",
            "master_port",    "max_restarts", "timeout_s", "grace_s"};
    if (!kValued->count(name)) {
      return Usage(absl::StrCat("unknown flag ", spelled));
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return Usage(absl::StrCat(spelled, " needs a value"));
      }
      value = args[++i];
    }
    MUON_RETURN_IF_ERROR(SetValuedFlag(name, *value, &o, &given));
  }
  o.program.assign(args.begin() + std::min(i, args.size()), args.end());
  if (o.program.empty()) {
    return Usage("no program given (muonrun [flags] program [args...])");
  }
  MUON_RETURN_IF_ERROR(FinishOptions(given, &o));
  return o;
}

std::vector<std::pair<std::string, std::string>> RankEnvironment(
    const MuonrunOptions& o, int local_rank,
    const std::vector<std::string>& base_env) {
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  const int world = o.nnodes * o.nproc_per_node;
  std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", absl::StrCat(rank)},
      {"WORLD_SIZE", absl::StrCat(world)},
      {"LOCAL_RANK", absl::StrCat(local_rank)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(o.nproc_per_node)},
      {"GROUP_RANK", absl::StrCat(o.node_rank)},
      {"GROUP_WORLD_SIZE", absl::StrCat(o.nnodes)},
      {"ROLE_RANK", absl::StrCat(rank)},
      {"ROLE_WORLD_SIZE", absl::StrCat(world)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", absl::StrCat(o.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", "0"},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(o.max_restarts)},
      {"TORCHELASTIC_RUN_ID", "none"},
  };
  if (o.nproc_per_node > 1) {
    const bool has_omp =
        std::any_of(base_env.begin(), base_env.end(), [](const std::string& e) {
          return absl::StartsWith(e, "OMP_NUM_THREADS=");
        });
    if (!has_omp) vars.emplace_back("OMP_NUM_THREADS", "1");
  }
  return vars;
}

std::vector<std::string> MergeEnvironment(
    const std::vector<std::string>& base,
    const std::vector<std::pair<std::string, std::string>>& vars) {
  std::set<std::string> names;
  for (const auto& [name, value] : vars) names.insert(name);
  std::vector<std::string> env;
  for (const std::string& e : base) {
    const size_t eq = e.find('=');
    const std::string name = e.substr(0, eq);
    if (!names.count(name)) env.push_back(e);
  }
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    env.push_back(*e);
  }
  return env;
}

std::string RankExit::Describe() const {
  if (status_unknown) {
    return "exit status unknown (it was reaped by another waiter: is SIGCHLD "
           "ignored?)";
  }
  if (signal != 0) {
    return absl::StrCat("killed by signal ", signal, " (", SignalName(signal),
                        ")");
  }
  return absl::StrCat("exited with code ", exit_code);
}

absl::StatusOr<std::vector<std::string>> WithJobSecret(
    const MuonrunOptions& o, std::vector<std::string> base) {
  // What the ranks will use (ChooseJobSecretSource): set but blank with
  // nothing else would turn authentication off on every rank (and pass for
  // "set" on several nodes), so it is refused before any rank starts.
  std::optional<std::string> value, file;
  for (const std::string& e : base) {
    absl::string_view v = e;
    if (absl::ConsumePrefix(&v, "MUON_JOB_SECRET=")) {
      value = std::string(v);
    } else if (absl::ConsumePrefix(&v, "MUON_JOB_SECRET_FILE=")) {
      file = std::string(v);
    }
  }
  MUON_ASSIGN_OR_RETURN(const JobSecretSource source,
                        ChooseJobSecretSource(value ? value->c_str() : nullptr,
                                              file ? file->c_str() : nullptr));
  if (source == JobSecretSource::kValue) {
    MUON_RETURN_IF_ERROR(
        CheckJobSecret(absl::StripAsciiWhitespace(*value), "MUON_JOB_SECRET"));
  }
  if (source != JobSecretSource::kNone) return base;
  if (o.nnodes > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes=", o.nnodes,
                     " needs one job secret shared by every node: "
                     "set MUON_JOB_SECRET (e.g. $(openssl rand -hex 32)) or "
                     "MUON_JOB_SECRET_FILE (mode 0600) on each node"));
  }
  MUON_ASSIGN_OR_RETURN(std::string secret, GenerateSecret());
  base.push_back(absl::StrCat("MUON_JOB_SECRET=", secret));
  return base;
}

bool NamesCoordinator(const std::vector<std::string>& env) {
  return std::any_of(env.begin(), env.end(), [](const std::string& e) {
    for (const char* name : {"MUON_COORDINATOR=", "MUON_COORDINATOR_PORT=",
                             "MUON_COORDINATOR_FILE="}) {
      if (absl::StartsWith(e, name) && e.size() > std::strlen(name)) {
        return true;
      }
    }
    return false;
  });
}

absl::Status CheckCoordinatorPort(const MuonrunOptions& o,
                                  const std::vector<std::string>& env) {
  if (o.nnodes == 1 || NamesCoordinator(env) || o.master_port < 65535) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--master-port ", o.master_port, " with --nnodes ", o.nnodes,
      ": rank 0's coordinator listens on --master-port + 1, which is not a "
      "TCP port; use a port below 65535 (or set MUON_COORDINATOR_PORT)"));
}

std::vector<std::string> WithCoordinatorFile(const MuonrunOptions& o,
                                             std::vector<std::string> base,
                                             const std::string& dir) {
  if (o.nnodes != 1 || NamesCoordinator(base)) return base;
  base.push_back(absl::StrCat("MUON_COORDINATOR_FILE=", dir, "/coordinator"));
  return base;
}

namespace {

// The value of `name` in `env` ("NAME=value" entries), or "".
std::string EnvValue(const std::vector<std::string>& env,
                     const std::string& name) {
  const std::string prefix = name + "=";
  std::string value;
  for (const std::string& e : env) {
    if (absl::StartsWith(e, prefix)) value = e.substr(prefix.size());
  }
  return value;
}

}  // namespace

std::string HostAgentTarget(const MuonrunOptions& o,
                            const std::vector<std::string>& env) {
  const std::string target = EnvValue(env, "MUON_COORDINATOR");
  if (!o.host_agent || absl::StartsWith(target, "unix:")) return "";
  return target;
}

std::vector<std::string> WithHostAgent(std::vector<std::string> base,
                                       const std::string& address) {
  base.erase(std::remove_if(base.begin(), base.end(),
                            [](const std::string& e) {
                              return absl::StartsWith(e, "MUON_TLS_CA_FILE=") ||
                                     absl::StartsWith(e,
                                                      "MUON_TLS_SERVER_NAME=");
                            }),
             base.end());
  return MergeEnvironment(base, {{"MUON_COORDINATOR", address}});
}

namespace {

// A directory of this muonrun alone (mode 0700, under TMPDIR or /tmp),
// removed with the files the ranks left in it on destruction.
class PrivateDir {
 public:
  // Under `parent`; empty: TMPDIR, else /tmp.
  static absl::StatusOr<std::unique_ptr<PrivateDir>> Create(
      std::string parent = "") {
    const char* tmp = std::getenv("TMPDIR");
    if (parent.empty()) {
      parent = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string path = absl::StrCat(parent, "/muonrun.XXXXXX");
    if (mkdtemp(path.data()) == nullptr) {
      return absl::InternalError(
          absl::StrCat("muonrun: mkdtemp ", path, ": ", std::strerror(errno)));
    }
    return std::unique_ptr<PrivateDir>(new PrivateDir(std::move(path)));
  }
  ~PrivateDir() {
    if (DIR* d = opendir(path_.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") unlink((path_ + "/" + name).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  explicit PrivateDir(std::string path) : path_(std::move(path)) {}
  const std::string path_;
};

// This node's host agent for the coordinator at `target`, listening on
// <dir>/host-agent.sock; TLS towards the coordinator as the ranks would
// have used it (MUON_TLS_CA_FILE, MUON_TLS_SERVER_NAME in `env`).
absl::StatusOr<std::unique_ptr<HostAgent>> StartHostAgent(
    const MuonrunOptions& o, const std::vector<std::string>& env,
    const std::string& target, const std::string& dir) {
  HostAgent::Options a;
  a.coordinator = target;
  a.security.tls_ca_file = EnvValue(env, "MUON_TLS_CA_FILE");
  a.security.tls_server_name = EnvValue(env, "MUON_TLS_SERVER_NAME");
  a.listen = absl::StrCat("unix:", dir, "/host-agent.sock");
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  a.host = absl::StrCat("node ", o.node_rank, " (", hostname, ")");
  for (int local = 0; local < o.nproc_per_node; ++local) {
    a.ranks.push_back(o.node_rank * o.nproc_per_node + local);
  }
  absl::StatusOr<std::unique_ptr<HostAgent>> agent = HostAgent::Start(a);
  if (!agent.ok()) {
    return absl::Status(
        agent.status().code(),
        absl::StrCat("muonrun: host agent: ", agent.status().message()));
  }
  return agent;
}

// Starts this node's nproc_per_node ranks into *children; on a failure
// kills those started and returns the error.
absl::Status StartRanks(const MuonrunOptions& o,
                        const std::vector<std::string>& base,
                        std::vector<Child>* children) {
  for (int local = 0; local < o.nproc_per_node; ++local) {
    Child c;
    c.local_rank = local;
    c.rank = o.node_rank * o.nproc_per_node + local;
    absl::StatusOr<pid_t> pid = StartRank(
        o.program, MergeEnvironment(base, RankEnvironment(o, local, base)),
        c.rank, o.rank_prefix ? &c.forwarders : nullptr);
    if (!pid.ok()) {
      StopChildren(*children, SIGKILL, absl::ZeroDuration());
      for (const Child& started : *children) {
        if (started.held) kill(-started.pid, SIGKILL);
      }
      Release(*children);
      return pid.status();
    }
    c.pid = *pid;
    children->push_back(c);
  }
  return absl::OkStatus();
}

// Watches the ranks until every one has exited, one failed (recorded in
// *result), a signal arrived or `deadline` passed; returns the signal to
// stop the others with (0: none left). Each exit goes to `agent` (when
// muonrun is the host agent) as it is seen.
int WaitForRanks(const MuonrunOptions& o, absl::Time deadline,
                 std::vector<Child>& children, HostAgent* agent,
                 RunRanksResult* result, std::ostream& err) {
  // After the first failure: when the other ranks are stopped. As host
  // agent, muonrun first gives them the agent's settle time to hear the
  // coordinator's error and end on their own, naming the failed rank.
  absl::Time stop_at = absl::InfiniteFuture();
  while (Running(children) > 0) {
    bool progressed = false;
    for (Child& c : children) {
      if (c.done || !Observe(c, /*block=*/false)) continue;
      progressed = true;
      // Before the others are stopped: the coordinator names this rank.
      if (agent != nullptr) {
        agent->RankExited(c.rank, c.pid, c.exit.failed(), c.exit.Describe());
      }
      if (c.exit.failed() && !result->first_failure.has_value()) {
        result->first_failure = c.exit;
        stop_at = absl::Now() + (agent != nullptr ? agent->settle_time()
                                                  : absl::ZeroDuration());
        err << "muonrun: rank " << c.rank << " (local rank " << c.local_rank
            << ", pid " << c.pid << ") failed first: " << c.exit.Describe()
            << "\n";
        err.flush();
      }
    }
    if (absl::Now() >= stop_at) return SIGTERM;
    if (g_received_signal != 0) {
      result->received_signal = g_received_signal;
      err << "muonrun: received " << SignalName(result->received_signal)
          << "\n";
      return result->received_signal;
    }
    if (absl::Now() >= deadline) {
      result->timed_out = true;
      err << "muonrun: timed out: ranks still running after "
          << absl::FormatDuration(o.timeout) << " (--timeout_s)\n";
      return SIGTERM;
    }
    if (!progressed) {
      absl::SleepFor(std::min(kPollInterval, deadline - absl::Now()));
    }
  }
  // Every rank ended within the settle time: their process groups (what
  // the ranks started) are still stopped after a failure.
  return result->first_failure.has_value() ? SIGTERM : 0;
}

// Stops the ranks still running with `stop_signal` (SIGKILL after the
// grace period) and, when `stop_signal` is not 0, whatever any rank
// started in its process group, then reaps the ranks (Child says why only
// then). A rank reaped by someone else (not held) is skipped: its group's
// number may name another process group by now.
void StopRanks(const MuonrunOptions& o, int stop_signal,
               std::vector<Child>& children, RunRanksResult* result,
               std::ostream& err) {
  const int running = Running(children);
  if (running > 0) {
    err << "muonrun: stopping " << Ranks(running) << " ("
        << SignalName(stop_signal) << ", SIGKILL after "
        << absl::FormatDuration(o.grace) << ")\n";
    err.flush();
    result->stopped = running;
    result->killed = StopChildren(children, stop_signal, o.grace);
    err << "muonrun: stopped " << Ranks(running);
    if (result->killed > 0) {
      err << " (" << result->killed << " needed SIGKILL)";
    }
    err << "\n";
  }
  if (stop_signal != 0) {
    for (const Child& c : children) {
      if (c.held) kill(-c.pid, SIGKILL);
    }
  }
  Release(children);
}

// The ranks' last lines: every forwarder drains its pipe and stops, by
// the grace period (at least 200 ms) from now, so that a process a rank
// left behind, holding its output open and writing, cannot keep muonrun
// from exiting. Names the ranks whose output was cut on `err`.
void DrainOutput(const MuonrunOptions& o, std::vector<Child>& children,
                 std::ostream& err) {
  const absl::Duration bound = std::max(o.grace, absl::Milliseconds(200));
  const absl::Time deadline = absl::Now() + bound;
  for (Child& c : children) {
    for (auto& f : c.forwarders) f->StopBy(deadline);
  }
  for (Child& c : children) {
    bool cut = false;
    for (auto& f : c.forwarders) cut |= f->Join();
    c.forwarders.clear();
    if (!cut) continue;
    err << "muonrun: rank " << c.rank << "'s output was still being written "
        << absl::FormatDuration(bound)
        << " after the ranks ended (a process it started holds its stdout or "
           "stderr); the rest is not forwarded\n";
  }
}

}  // namespace

absl::StatusOr<RunRanksResult> RunRanks(const MuonrunOptions& o,
                                        std::ostream& err) {
  MUON_ASSIGN_OR_RETURN(std::vector<std::string> base,
                        WithJobSecret(o, CurrentEnvironment()));
  MUON_RETURN_IF_ERROR(CheckCoordinatorPort(o, base));
  std::unique_ptr<PrivateDir> dir;
  if (o.nnodes == 1 && !NamesCoordinator(base)) {
    MUON_ASSIGN_OR_RETURN(dir, PrivateDir::Create());
    base = WithCoordinatorFile(o, std::move(base), dir->path());
  }
  std::unique_ptr<PrivateDir> socket_dir;  // outlives the agent
  std::unique_ptr<HostAgent> agent;
  if (const std::string target = HostAgentTarget(o, base); !target.empty()) {
    MUON_ASSIGN_OR_RETURN(socket_dir, PrivateDir::Create());
    // A Unix socket's path has at most 107 bytes (sockaddr_un.sun_path):
    // a long TMPDIR gives way to /tmp.
    if (socket_dir->path().size() + sizeof("/host-agent.sock") > 107) {
      MUON_ASSIGN_OR_RETURN(socket_dir, PrivateDir::Create("/tmp"));
    }
    MUON_ASSIGN_OR_RETURN(agent,
                          StartHostAgent(o, base, target, socket_dir->path()));
    base = WithHostAgent(std::move(base), agent->address());
  }
  std::vector<Child> children;
  const absl::Time start = absl::Now();
  MUON_RETURN_IF_ERROR(StartRanks(o, base, &children));
  const absl::Time deadline = o.timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : start + o.timeout;
  RunRanksResult result;
  const int stop_signal =
      WaitForRanks(o, deadline, children, agent.get(), &result, err);
  StopRanks(o, stop_signal, children, &result, err);
  if (agent != nullptr) agent->Shutdown();
  std::cerr.flush();
  DrainOutput(o, children, err);
  for (const Child& c : children) result.exits.push_back(c.exit);
  if (result.first_failure.has_value()) {
    result.exit_code = result.first_failure->status_code();
  } else if (result.received_signal != 0) {
    result.exit_code = 128 + result.received_signal;
  } else if (result.timed_out) {
    result.exit_code = kMuonrunTimeoutExitCode;
  }
  err.flush();
  return result;
}

void InstallMuonrunSignalHandlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  // An ignored SIGCHLD (or SA_NOCLDWAIT), inherited across execve, has the
  // kernel reap the ranks: their exit statuses would be lost (ECHILD).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, nullptr);
}

int MuonrunMain(const std::vector<std::string>& args, std::ostream& out,
                std::ostream& err) {
  absl::StatusOr<MuonrunOptions> options = ParseMuonrunArgs(args);
  if (!options.ok()) {
    err << "muonrun: " << options.status().message() << "\n" << MuonrunUsage();
    return options.status().code() == absl::StatusCode::kInvalidArgument
               ? kMuonrunUsageExitCode
               : 1;
  }
  if (options->help) {
    out << MuonrunUsage();
    return 0;
  }
  absl::StatusOr<RunRanksResult> result = RunRanks(*options, err);
  if (!result.ok()) {
    err << result.status().message() << "\n";
    return 1;
  }
  return result->exit_code;
}

}  // namespace muon
