// Control-plane load on one coordinator: N simulated agents Join a real
// CoordinatorServer over real gRPC, then heartbeat at a fixed rate.
//
// For each N in --agents, the parent process (which never touches gRPC)
// forks two children:
//   server: CoordinatorServer::Start on 127.0.0.1:0 with a job secret and
//     world size N; reports its port through a pipe and serves until the
//     pipe's other end closes.
//   load generator: N agents, each with its own channel (its own TCP
//     connection, as N separate processes would have) and the job secret in
//     `authorization: Bearer ...`, driven by --client_threads completion
//     queue threads (no thread per agent). Phases:
//       connect: every channel connects (timed apart from Join);
//       join: every agent sends Join at once with the manifest of a 1-D
//         dp_shard mesh of N ranks holding --matrices Shard(0) matrices of
//         --matrix_size^2; join-to-plan is first Join sent to last
//         JoinResponse received; every response must be OK with the same
//         plan hash;
//       heartbeat: agent i heartbeats at t0 + (i/N + k) * interval for
//         --duration_s (evenly spread), at most one heartbeat in flight per
//         agent (a late response delays the next send; counted as "late");
//         a response must be OK and carry no job error.
//   Host mode (--ranks_per_host K > 1): the N agents are N/K hosts of K
//     ranks; each host sends one HostJoin for its K ranks on its one
//     channel, and one HostHeartbeat per period for all K (spread over
//     hosts), as a host agent does: N/K connections, N/K Join calls and
//     N/K heartbeat calls per period. With --heartbeat_stream each host
//     opens one HostHeartbeatStream after joining (before the phase
//     starts; stream_open_s) and sends its heartbeats as messages on it,
//     each thread writing its hosts' messages when due (latency: message
//     written to answer read).
//   Channels have a host agent's arguments (SetCoordinatorChannelArgs),
//   and the load generator runs without Abseil's deadlock detection.
//   The load generator reads the server child's CPU time (utime + stime of
//   /proc/<pid>/stat) at each phase boundary and its VmHWM (peak RSS) at
//   the end, so the server's figures exclude the load generator, whose own
//   CPU time (getrusage) is printed beside them.
//
// Prints one line per N (key=value), with the load average before and after.
//
// Usage: coordinator_load_bench [--agents 4096,16384] [--duration_s 20]
//   [--ranks_per_host 1] [--heartbeat_stream] [--heartbeat_interval_s 1]
//   [--client_threads 2]
//   [--matrices 8]
//   [--matrix_size 1024] [--server_heartbeat_timeout_s 10] [--skip_plan]
//   [--server_no_deadlock_detection] [--server_rss_limit_mb 12288]
//   [--min_mem_available_mb 1024]
// Results and analysis: docs/coordinator_load.md.
#include <fcntl.h>
#include <grpc/support/time.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checked_math.h"
#include "common/spec.h"
#include "control/grpc_coordination_client.h"
#include "coordination/credentials.h"
#include "muon/v1/coordinator.grpc.pb.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/compact_manifest.h"
#include "server/coordinator_server.h"
#include "tools/bench_util.h"

ABSL_FLAG(std::string, agents, "4096,16384",
          "Agent counts (world sizes), comma-separated; one run each.");
ABSL_FLAG(double, duration_s, 20.0, "Heartbeat phase length, seconds.");
ABSL_FLAG(double, heartbeat_interval_s, 1.0,
          "Each agent's heartbeat period, seconds.");
ABSL_FLAG(int, client_threads, 2,
          "Load generator threads (one completion queue each).");
ABSL_FLAG(int, matrices, 8, "Shard(0) matrices in each manifest.");
ABSL_FLAG(int, matrix_size, 1024, "Rows and columns of each matrix.");
ABSL_FLAG(bool, compact_manifests, true,
          "Ranks other than 0 join with a CompactManifest "
          "(plan/compact_manifest.h); false: every rank sends its manifest.");
ABSL_FLAG(double, server_heartbeat_timeout_s, 10.0,
          "The coordinator's heartbeat_timeout (a rank silent this long is "
          "lost and fails the job), seconds.");
ABSL_FLAG(bool, skip_plan, false,
          "Heartbeats without a plan: the server's world size is N + 1, so "
          "the N agents' Joins stay registered and waiting (no plan is made "
          "or sent) while they heartbeat. The job is then \"waiting\", "
          "where the coordinator skips its scan for lost ranks: this "
          "measures the heartbeat path without that scan. join_to_plan_s "
          "is then the time until the server counts N ranks joined.");
ABSL_FLAG(int64_t, server_rss_limit_mb, 12288,
          "Kill the server child (and report it) above this RSS, MiB: keeps "
          "a runaway run from exhausting a shared machine.");

ABSL_FLAG(bool, server_no_deadlock_detection, false,
          "In the server child, turn off Abseil's mutex deadlock detection "
          "(absl::SetMutexDeadlockDetectionMode(kIgnore)). Debian's Abseil "
          "is built with it on, and gRPC's mutexes are absl::Mutex; the "
          "coordinator as shipped leaves it on (the default, false).");
ABSL_FLAG(int, ranks_per_host, 1,
          "Host mode when > 1: the N ranks run K to a host; each host joins "
          "its K ranks in one HostJoin on its one channel (one TCP "
          "connection) and heartbeats once per period for all K "
          "(HostHeartbeat), as a host agent does. N must be a multiple of "
          "K.");
ABSL_FLAG(bool, heartbeat_stream, false,
          "Host mode: each host heartbeats on one long-lived "
          "HostHeartbeatStream (one message each way per period) instead of "
          "a HostHeartbeat call per period.");
ABSL_FLAG(int64_t, min_mem_available_mb, 1024,
          "Kill the server child (and report it) when the machine's "
          "MemAvailable falls below this, MiB.");

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: coordinator_load_bench [--agents N[,N...]] [--duration_s S]\n"
    "  [--ranks_per_host K]\n"
    "  [--heartbeat_interval_s S] [--client_threads T] [--matrices M]\n"
    "  [--matrix_size R] [--server_heartbeat_timeout_s S]\n"
    "  [--server_rss_limit_mb MB] [--min_mem_available_mb MB] [--skip_plan]\n"
    "  [--server_no_deadlock_detection]\n";

double SecondsSince(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, "/", five, "/", fifteen);
}

// CPU seconds (utime + stime) of `pid` from /proc/<pid>/stat; -1 on error.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return -1;
  // Fields after the parenthesized command name (which may hold spaces).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> fields;
  std::string f;
  while (rest >> f) fields.push_back(f);
  // Field 3 (state) is fields[0]; utime is field 14, stime field 15.
  if (fields.size() < 13) return -1;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::stod(fields[11]) + std::stod(fields[12])) / ticks;
}

// A "Key:   value kB" line of /proc/<pid>/status, as a number; -1 if absent.
int64_t ProcStatusValue(pid_t pid, absl::string_view key) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > key.size() && absl::StartsWith(line, key) &&
        line[key.size()] == ':') {
      int64_t value = -1;
      std::istringstream(line.substr(key.size() + 1)) >> value;
      return value;
    }
  }
  return -1;
}

// The machine's MemAvailable (/proc/meminfo), KiB; -1 if unreadable.
int64_t MemAvailableKb() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "MemAvailable:")) {
      int64_t value = -1;
      std::istringstream(line.substr(13)) >> value;
      return value;
    }
  }
  return -1;
}

double ProcessCpuSelf() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 +
         usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The server child: serves until `control_fd` reaches EOF. Never returns.
[[noreturn]] void ServeChild(int world, const std::string& secret, int port_fd,
                             int control_fd) {
  if (absl::GetFlag(FLAGS_server_no_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  muon::CoordinatorServerOptions options;
  options.service.job_id = "job";
  options.service.world_size = world + (absl::GetFlag(FLAGS_skip_plan) ? 1 : 0);
  options.service.heartbeat_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_server_heartbeat_timeout_s));
  options.auth.job_secret = secret;
  absl::StatusOr<std::unique_ptr<muon::CoordinatorServer>> server =
      muon::CoordinatorServer::Start(options);
  int port = -1;
  if (!server.ok()) {
    std::fprintf(stderr, "coordinator_load_bench: server: %s\n",
                 server.status().ToString().c_str());
  } else {
    port = (*server)->port();
  }
  WriteAll(port_fd, &port, sizeof(port));
  close(port_fd);
  char byte;
  while (read(control_fd, &byte, 1) > 0 || errno == EINTR) {
  }
  std::fflush(nullptr);
  _exit(server.ok() ? 0 : 1);  // skip destructors: the parent is done
}

// --heartbeat_stream: where a host's stream is in its life.
enum class StreamState {
  kOpening,   // StartCall not yet completed
  kOpen,      // writes may start
  kClosing,   // WritesDone or Finish started: no more beats
  kFinished,  // its status is in (kFinished)
};

// One simulated agent: its channel, stub and the call in flight.
struct Agent {
  int rank = 0;
  double offset_s = 0;  // heartbeat phase offset: rank / N * interval
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<muon::v1::Coordinator::Stub> stub;
  grpc::CompletionQueue* cq = nullptr;  // Not owned.

  std::unique_ptr<grpc::ClientContext> join_context;
  grpc::Status join_status;
  std::unique_ptr<muon::v1::JoinRequest> join_request;
  std::unique_ptr<muon::v1::JoinResponse> join_response;
  std::unique_ptr<grpc::ClientAsyncResponseReader<muon::v1::JoinResponse>>
      join_reader;
  bool joined = false;

  std::unique_ptr<grpc::ClientContext> context;
  grpc::Status status;
  muon::v1::HeartbeatRequest heartbeat_request;
  // Host mode: the first rank of each host joins (HostJoin) and heartbeats
  // (HostHeartbeat) for all of them.
  bool leader = true;
  muon::v1::HostHeartbeatRequest host_request;
  std::unique_ptr<muon::v1::HostJoinRequest> host_join_request;
  std::vector<Agent*> members;  // the host's agents, this one first
  muon::v1::HeartbeatResponse heartbeat_response;
  std::unique_ptr<grpc::ClientAsyncResponseReader<muon::v1::HeartbeatResponse>>
      heartbeat_reader;
  std::unique_ptr<grpc::Alarm> alarm;
  Clock::time_point sent;
  int next_beat = 0;  // index k of the next heartbeat
  // --heartbeat_stream: the host's stream (its context is `context`).
  std::unique_ptr<grpc::ClientAsyncReaderWriter<muon::v1::HostHeartbeatRequest,
                                                muon::v1::HeartbeatResponse>>
      stream;
  StreamState stream_state = StreamState::kOpening;
  bool writing = false;    // a Write whose kWriteDone has not come
  bool in_flight = false;  // a heartbeat written, its answer not yet read
};

// Completion-queue tags: an Agent pointer (8-byte aligned) with the event
// in its low 3 bits.
enum Event : uintptr_t {
  kJoinDone = 0,
  kAlarm = 1,
  kHeartbeatDone = 2,
  kStreamStarted = 3,  // --heartbeat_stream: the stream is open
  kWriteDone = 4,      // a heartbeat written to the stream
  kReadDone = 5,       // its answer read
  kWritesDone = 6,     // the host closed its side
  kFinished = 7,       // the stream's status is in
};
static_assert(alignof(Agent) >= 8, "three tag bits");
void* Tag(Agent* agent, Event event) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(agent) | event);
}
Agent* TagAgent(void* tag) {
  return reinterpret_cast<Agent*>(reinterpret_cast<uintptr_t>(tag) &
                                  ~uintptr_t{7});
}
Event TagEvent(void* tag) {
  return static_cast<Event>(reinterpret_cast<uintptr_t>(tag) & 7);
}

// What one load generator thread saw.
struct ThreadStats {
  // Join phase.
  int joins_ok = 0;
  int join_errors = 0;
  std::string first_join_error;
  std::string plan_hash;  // the first plan hash seen
  int plan_hash_mismatches = 0;
  int64_t plan_bytes = 0;
  Clock::time_point last_join_response{};
  // Heartbeat phase.
  std::vector<float> latencies_ms;
  std::vector<float> send_lag_ms;  // send time - scheduled time
  int64_t heartbeats_ok = 0;
  int64_t heartbeat_errors = 0;
  int64_t job_errors = 0;  // OK responses carrying a job error
  int64_t late = 0;        // sends after their scheduled time (> 1 interval)
  std::string first_heartbeat_error;
  Clock::time_point last_heartbeat_response{};
};

gpr_timespec MonotonicDeadline(Clock::time_point due) {
  const int64_t ns = std::max<int64_t>(
      0,
      std::chrono::duration_cast<std::chrono::nanoseconds>(due - Clock::now())
          .count());
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_nanos(ns, GPR_TIMESPAN));
}

class LoadGenerator {
 public:
  LoadGenerator(int world, int port, pid_t server_pid, std::string secret)
      : world_(world),
        server_pid_(server_pid),
        address_(absl::StrCat("127.0.0.1:", port)),
        bearer_(muon::BearerValue(secret)),
        threads_(std::max(1, absl::GetFlag(FLAGS_client_threads))),
        ranks_per_host_(std::max(1, absl::GetFlag(FLAGS_ranks_per_host))),
        interval_s_(absl::GetFlag(FLAGS_heartbeat_interval_s)),
        duration_s_(absl::GetFlag(FLAGS_duration_s)) {}

  // Runs the three phases and prints the result line. Returns the exit code.
  int Run();

 private:
  void StartJoin(Agent* agent);
  void StartHeartbeat(Agent* agent, ThreadStats* stats);
  // --heartbeat_stream: opens the host's stream (kStreamStarted).
  void OpenStream(Agent* agent);
  // Handles one stream event of `agent`; returns false once its stream is
  // finished (no more events).
  bool OnStreamEvent(Agent* agent, Event event, bool ok, ThreadStats* stats);
  // A heartbeat's answer: counts it (latency from agent->sent) or its
  // error.
  void CountAnswer(Agent* agent, ThreadStats* stats);
  void ScheduleNextBeat(Agent* agent);
  // The time heartbeat k of `agent` falls due.
  Clock::time_point Due(const Agent* agent, int k) const;
  // Whether `agent`'s next heartbeat falls in the phase.
  bool BeatsLeft(const Agent* agent) const;
  // When the heartbeat phase ends: heartbeat_start_ + --duration_s.
  Clock::time_point PhaseEnd() const {
    return heartbeat_start_ + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(duration_s_));
  }
  // --heartbeat_stream: writes `agent`'s next heartbeat if it is due by
  // `now` and none is in flight (a late answer delays it, as the alarm
  // does for calls).
  void SendIfDue(Agent* agent, Clock::time_point now, ThreadStats* stats);
  // --heartbeat_stream: once the phase has ended and the host's last
  // heartbeat is answered (or its stream ended), closes its side; false
  // until then.
  bool CloseWhenDone(Agent* agent);
  // Thread t's host leaders (those whose calls use cqs_[t]), in rank order;
  // in rank mode every agent leads its own host of one.
  std::vector<Agent*> ThreadLeaders(int t) const;
  void JoinThread(int t);
  void HeartbeatThread(int t);
  // --heartbeat_stream: the thread's hosts write their heartbeats at their
  // due times, paced by the thread itself (AsyncNext's deadline) instead
  // of a grpc::Alarm per host and period.
  void StreamHeartbeatThread(int t);
  // --heartbeat_stream: opens the thread's hosts' streams before the phase
  // starts (at most 120 s), as a host agent opens its stream once.
  void OpenStreamsThread(int t);
  void Watchdog();

  // The figures of one run, filled phase by phase (CPU in seconds, RSS in
  // KiB, times in seconds, latencies in ms).
  struct RunFigures {
    int64_t manifest_bytes = 0;                     // the largest Join request
    int64_t last_join_bytes = 0;                    // rank N-1's Join request
    double cpu0 = 0, cpu1 = 0, cpu2 = 0, cpu3 = 0;  // server CPU by phase
    int connect_failures = 0;
    double connect_s = 0;
    int64_t rss_connected = 0, rss_joined = 0;
    int joins_ok = 0, join_errors = 0, hash_mismatches = 0;
    int64_t plan_bytes = 0;
    std::string join_error, plan_hash;
    double join_s = 0, client_cpu_join = 0, client_cpu_hb = 0;
    int64_t server_hwm_kb = 0, server_threads = 0, client_hwm_kb = 0;
    std::vector<float> latencies, send_lags;  // sorted
    int64_t heartbeats_ok = 0, heartbeat_errors = 0, job_errors = 0, late = 0;
    std::string heartbeat_error;
    double heartbeat_s = 0;
    double stream_open_s = 0;  // --heartbeat_stream: opening every stream
    int64_t errors() const {
      return connect_failures + join_errors + hash_mismatches +
             heartbeat_errors + job_errors;
    }
  };
  // One agent per rank with its channel, Join and heartbeat requests
  // (compact manifests for ranks > 0 when `compact`).
  void MakeAgents(std::vector<muon::v1::RankManifest> manifests, bool compact,
                  RunFigures* f);
  void ConnectPhase(RunFigures* f);
  void JoinPhase(RunFigures* f);
  // --skip_plan: no JoinResponse comes; polls GetJob until every agent is
  // registered (at most 300 s).
  void WaitForEveryRankJoined(Clock::time_point join_start);
  void HeartbeatPhase(RunFigures* f);
  void PrintFigures(const RunFigures& f, bool compact,
                    const std::string& load_before) const;

  const int world_;
  const pid_t server_pid_;
  const std::string address_;
  const std::string bearer_;
  const int threads_;
  const int ranks_per_host_;
  const double interval_s_;
  const double duration_s_;

  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::unique_ptr<Agent>> agents_;
  std::vector<ThreadStats> stats_;
  Clock::time_point heartbeat_start_;
  std::atomic<bool> done_{false};
  std::atomic<bool> server_killed_{false};
  std::atomic<int64_t> server_rss_max_kb_{0};
};

void LoadGenerator::StartJoin(Agent* agent) {
  agent->join_context = std::make_unique<grpc::ClientContext>();
  agent->join_context->AddMetadata(muon::kAuthorizationMetadataKey, bearer_);
  agent->join_context->set_deadline(std::chrono::system_clock::now() +
                                    std::chrono::minutes(11));
  agent->join_response = std::make_unique<muon::v1::JoinResponse>();
  agent->join_reader =
      agent->host_join_request != nullptr
          ? agent->stub->PrepareAsyncHostJoin(
                agent->join_context.get(), *agent->host_join_request, agent->cq)
          : agent->stub->PrepareAsyncJoin(agent->join_context.get(),
                                          *agent->join_request, agent->cq);
  agent->join_reader->StartCall();
  agent->join_reader->Finish(agent->join_response.get(), &agent->join_status,
                             Tag(agent, kJoinDone));
}

void LoadGenerator::StartHeartbeat(Agent* agent, ThreadStats* stats) {
  const Clock::time_point due = Due(agent, agent->next_beat);
  agent->sent = Clock::now();
  stats->send_lag_ms.push_back(static_cast<float>(
      std::chrono::duration<double, std::milli>(agent->sent - due).count()));
  if (agent->sent - due > std::chrono::duration<double>(interval_s_)) {
    ++stats->late;
  }
  ++agent->next_beat;
  agent->heartbeat_response.Clear();
  if (agent->stream != nullptr) {  // one message each way
    agent->in_flight = true;
    agent->writing = true;
    agent->stream->Write(agent->host_request, Tag(agent, kWriteDone));
    agent->stream->Read(&agent->heartbeat_response, Tag(agent, kReadDone));
    return;
  }
  agent->context = std::make_unique<grpc::ClientContext>();
  agent->context->AddMetadata(muon::kAuthorizationMetadataKey, bearer_);
  agent->context->set_deadline(std::chrono::system_clock::now() +
                               std::chrono::seconds(10));
  agent->heartbeat_reader =
      ranks_per_host_ > 1
          ? agent->stub->PrepareAsyncHostHeartbeat(
                agent->context.get(), agent->host_request, agent->cq)
          : agent->stub->PrepareAsyncHeartbeat(
                agent->context.get(), agent->heartbeat_request, agent->cq);
  agent->heartbeat_reader->StartCall();
  agent->heartbeat_reader->Finish(&agent->heartbeat_response, &agent->status,
                                  Tag(agent, kHeartbeatDone));
}

void LoadGenerator::OpenStream(Agent* agent) {
  agent->context = std::make_unique<grpc::ClientContext>();
  agent->context->AddMetadata(muon::kAuthorizationMetadataKey, bearer_);
  agent->stream = agent->stub->PrepareAsyncHostHeartbeatStream(
      agent->context.get(), agent->cq);
  agent->stream->StartCall(Tag(agent, kStreamStarted));
}

void LoadGenerator::CountAnswer(Agent* agent, ThreadStats* stats) {
  const Clock::time_point now = Clock::now();
  stats->last_heartbeat_response = now;
  if (!agent->status.ok()) {
    ++stats->heartbeat_errors;
    if (stats->first_heartbeat_error.empty()) {
      stats->first_heartbeat_error =
          absl::StrCat("rank ", agent->rank, ": ", agent->status.error_code(),
                       " ", agent->status.error_message());
    }
  } else if (!agent->heartbeat_response.job_error().empty()) {
    ++stats->job_errors;
    if (stats->first_heartbeat_error.empty()) {
      stats->first_heartbeat_error =
          absl::StrCat("rank ", agent->rank,
                       ": job error: ", agent->heartbeat_response.job_error());
    }
  } else {
    ++stats->heartbeats_ok;
    stats->latencies_ms.push_back(static_cast<float>(
        std::chrono::duration<double, std::milli>(now - agent->sent).count()));
  }
}

bool LoadGenerator::OnStreamEvent(Agent* agent, Event event, bool ok,
                                  ThreadStats* stats) {
  switch (event) {
    case kStreamStarted:
      if (!ok) {
        agent->stream_state = StreamState::kClosing;
        agent->stream->Finish(&agent->status, Tag(agent, kFinished));
        return true;
      }
      agent->stream_state = StreamState::kOpen;
      SendIfDue(agent, Clock::now(), stats);  // due while it opened
      CloseWhenDone(agent);
      return true;
    case kWriteDone:  // the answer (or the failure) comes as kReadDone
      agent->writing = false;
      if (!ok) {  // broken: no more writes; kReadDone fails and finishes it
        agent->stream_state = StreamState::kClosing;
        return true;
      }
      SendIfDue(agent, Clock::now(), stats);  // answered before this came
      CloseWhenDone(agent);
      return true;
    case kReadDone:
      agent->in_flight = false;
      if (!ok) {  // the stream ended: its status says why
        agent->stream_state = StreamState::kClosing;
        agent->stream->Finish(&agent->status, Tag(agent, kFinished));
        return true;
      }
      agent->status = grpc::Status::OK;
      CountAnswer(agent, stats);
      SendIfDue(agent, Clock::now(), stats);  // due while in flight
      CloseWhenDone(agent);
      return true;
    case kWritesDone:
      agent->stream->Finish(&agent->status, Tag(agent, kFinished));
      return true;
    case kFinished:
      agent->stream_state = StreamState::kFinished;
      if (!agent->status.ok()) CountAnswer(agent, stats);
      return false;
    default:
      return true;
  }
}

Clock::time_point LoadGenerator::Due(const Agent* agent, int k) const {
  return heartbeat_start_ +
         std::chrono::duration_cast<Clock::duration>(
             std::chrono::duration<double>(agent->offset_s + k * interval_s_));
}

bool LoadGenerator::BeatsLeft(const Agent* agent) const {
  return agent->offset_s + agent->next_beat * interval_s_ < duration_s_;
}

void LoadGenerator::SendIfDue(Agent* agent, Clock::time_point now,
                              ThreadStats* stats) {
  if (agent->stream_state != StreamState::kOpen || agent->in_flight ||
      agent->writing || !BeatsLeft(agent) ||
      Due(agent, agent->next_beat) > now) {
    return;
  }
  StartHeartbeat(agent, stats);
}

bool LoadGenerator::CloseWhenDone(Agent* agent) {
  // Not before the phase ends: hosts that closed their streams during the
  // last period would load the coordinator with thousands of stream ends
  // while the others still heartbeat (a job's hosts heartbeat until it
  // ends, and close together after).
  if (agent->stream_state != StreamState::kOpen || agent->in_flight ||
      agent->writing || BeatsLeft(agent) || Clock::now() < PhaseEnd()) {
    return false;
  }
  agent->stream_state = StreamState::kClosing;
  agent->stream->WritesDone(Tag(agent, kWritesDone));
  return true;
}

// Sets the agent's alarm for its next heartbeat; clears the alarm (null)
// once the agent has sent its last one.
void LoadGenerator::ScheduleNextBeat(Agent* agent) {
  const double at_s = agent->offset_s + agent->next_beat * interval_s_;
  if (at_s >= duration_s_) {
    agent->alarm.reset();
    return;
  }
  agent->alarm = std::make_unique<grpc::Alarm>();
  agent->alarm->Set(
      agent->cq,
      MonotonicDeadline(heartbeat_start_ +
                        std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(at_s))),
      Tag(agent, kAlarm));
}

std::vector<Agent*> LoadGenerator::ThreadLeaders(int t) const {
  std::vector<Agent*> leaders;
  for (const std::unique_ptr<Agent>& agent : agents_) {
    if (agent->cq == cqs_[t].get() && agent->leader) {
      leaders.push_back(agent.get());
    }
  }
  return leaders;
}

void LoadGenerator::JoinThread(int t) {
  ThreadStats& stats = stats_[t];
  int pending = 0;
  for (Agent* agent : ThreadLeaders(t)) {  // a HostJoin joins the others
    StartJoin(agent);
    ++pending;
  }
  // --skip_plan: the Joins never complete; Run polls the server instead.
  if (absl::GetFlag(FLAGS_skip_plan)) return;
  while (pending > 0) {
    void* tag;
    bool ok;
    if (!cqs_[t]->Next(&tag, &ok)) break;
    Agent* agent = TagAgent(tag);
    --pending;
    stats.last_join_response = Clock::now();
    if (!agent->join_status.ok()) {
      ++stats.join_errors;
      if (stats.first_join_error.empty()) {
        stats.first_join_error = absl::StrCat(
            "rank ", agent->rank, ": ", agent->join_status.error_code(), " ",
            agent->join_status.error_message());
      }
    } else {
      for (Agent* member : agent->members) {
        ++stats.joins_ok;
        member->joined = true;
      }
      const std::string& hash = agent->join_response->plan().hash();
      if (stats.plan_hash.empty()) {
        stats.plan_hash = hash;
        stats.plan_bytes =
            static_cast<int64_t>(agent->join_response->ByteSizeLong());
      } else if (hash != stats.plan_hash) {
        ++stats.plan_hash_mismatches;
      }
    }
    // Free the plan copy and the call at once: N copies would not fit.
    agent->join_response.reset();
    agent->join_request.reset();
    agent->host_join_request.reset();
    agent->join_reader.reset();
    agent->join_context.reset();
  }
}

void LoadGenerator::HeartbeatThread(int t) {
  if (ranks_per_host_ > 1 && absl::GetFlag(FLAGS_heartbeat_stream)) {
    StreamHeartbeatThread(t);
    return;
  }
  ThreadStats& stats = stats_[t];
  int active = 0;
  for (Agent* agent : ThreadLeaders(t)) {
    if (!agent->joined) continue;
    ScheduleNextBeat(agent);
    if (agent->alarm != nullptr) ++active;
  }
  const size_t expected = static_cast<size_t>((agents_.size() / threads_ + 1) *
                                              (duration_s_ / interval_s_ + 1));
  stats.latencies_ms.reserve(expected);
  stats.send_lag_ms.reserve(expected);
  while (active > 0) {
    void* tag;
    bool ok;
    if (!cqs_[t]->Next(&tag, &ok)) break;
    Agent* agent = TagAgent(tag);
    if (TagEvent(tag) == kJoinDone) {
      // --skip_plan: a waiting Join ended (its deadline or the server).
      ++stats.join_errors;
      continue;
    }
    if (TagEvent(tag) == kAlarm) {
      StartHeartbeat(agent, &stats);
      continue;
    }
    CountAnswer(agent, &stats);
    agent->heartbeat_reader.reset();
    ScheduleNextBeat(agent);
    if (agent->alarm == nullptr) --active;
  }
}

void LoadGenerator::OpenStreamsThread(int t) {
  int pending = 0;
  for (Agent* agent : ThreadLeaders(t)) {
    if (!agent->joined) continue;
    OpenStream(agent);
    ++pending;
  }
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(120);
  while (pending > 0) {
    void* tag;
    bool ok;
    const grpc::CompletionQueue::NextStatus got =
        cqs_[t]->AsyncNext(&tag, &ok, MonotonicDeadline(give_up));
    if (got != grpc::CompletionQueue::GOT_EVENT) break;
    Agent* agent = TagAgent(tag);
    --pending;
    if (TagEvent(tag) == kFinished) {  // a stream that failed to open
      agent->stream_state = StreamState::kFinished;
      CountAnswer(agent, &stats_[t]);
    } else if (ok) {
      agent->stream_state = StreamState::kOpen;
    } else {
      agent->stream_state = StreamState::kClosing;
      agent->stream->Finish(&agent->status, Tag(agent, kFinished));
      ++pending;  // its status
    }
  }
}

void LoadGenerator::StreamHeartbeatThread(int t) {
  ThreadStats& stats = stats_[t];
  std::vector<Agent*> hosts;  // in order of their phase offsets
  for (Agent* agent : ThreadLeaders(t)) {
    if (agent->stream == nullptr) continue;                       // not joined
    if (agent->stream_state == StreamState::kFinished) continue;  // failed
    hosts.push_back(agent);
  }
  const size_t expected =
      static_cast<size_t>((hosts.size() + 1) * (duration_s_ / interval_s_ + 1));
  stats.latencies_ms.reserve(expected);
  stats.send_lag_ms.reserve(expected);
  // The next beat to start: heartbeat `round` of hosts[next]. Offsets grow
  // with the host, so the thread's beats fall due in this order.
  size_t next = 0;
  int round = 0;
  const auto beats_left = [&] {
    return !hosts.empty() &&
           hosts[next]->offset_s + round * interval_s_ < duration_s_;
  };
  int active = static_cast<int>(hosts.size());
  while (active > 0) {
    // Start every beat that is due.
    const Clock::time_point now = Clock::now();
    while (beats_left() && Due(hosts[next], round) <= now) {
      // A host still in flight sends when its answer is in (kReadDone).
      if (hosts[next]->next_beat <= round) SendIfDue(hosts[next], now, &stats);
      if (++next == hosts.size()) {
        next = 0;
        ++round;
      }
    }
    const Clock::time_point wake = beats_left()
                                       ? Due(hosts[next], round)
                                       : now + std::chrono::milliseconds(100);
    void* tag;
    bool ok;
    const grpc::CompletionQueue::NextStatus got =
        cqs_[t]->AsyncNext(&tag, &ok, MonotonicDeadline(wake));
    if (got == grpc::CompletionQueue::SHUTDOWN) break;
    if (got == grpc::CompletionQueue::TIMEOUT) {
      if (!beats_left()) {
        for (Agent* agent : hosts) CloseWhenDone(agent);
      }
      continue;
    }
    if (!OnStreamEvent(TagAgent(tag), TagEvent(tag), ok, &stats)) --active;
  }
}

void LoadGenerator::Watchdog() {
  const int64_t limit_kb = absl::GetFlag(FLAGS_server_rss_limit_mb) * 1024;
  const int64_t min_available_kb =
      absl::GetFlag(FLAGS_min_mem_available_mb) * 1024;
  while (!done_.load()) {
    const int64_t rss = ProcStatusValue(server_pid_, "VmRSS");
    if (rss > server_rss_max_kb_.load()) server_rss_max_kb_.store(rss);
    const int64_t available = MemAvailableKb();
    if ((rss > limit_kb || (available >= 0 && available < min_available_kb)) &&
        !server_killed_.exchange(true)) {
      std::fprintf(stderr,
                   "coordinator_load_bench: server RSS %lld MiB, machine "
                   "MemAvailable %lld MiB (limits: --server_rss_limit_mb, "
                   "--min_mem_available_mb); killing the server\n",
                   static_cast<long long>(rss / 1024),
                   static_cast<long long>(available / 1024));
      kill(server_pid_, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

float Percentile(const std::vector<float>& sorted, double p) {
  if (sorted.empty()) return NAN;
  size_t index = static_cast<size_t>(std::ceil(p * sorted.size()));
  index = std::min(sorted.size() - 1, index == 0 ? 0 : index - 1);
  return sorted[index];
}

// The job's manifests: a 1-D dp_shard mesh of N ranks (one more with
// --skip_plan, so that the job never plans), --matrices Shard(0) matrices.
absl::StatusOr<std::vector<muon::v1::RankManifest>> LoadManifests(int world) {
  muon::v1::JobSpec spec;
  spec.set_job_id("job");
  muon::v1::MeshDim* dim = spec.mutable_mesh()->add_dims();
  dim->set_name("dp_shard");
  dim->set_size(world + (absl::GetFlag(FLAGS_skip_plan) ? 1 : 0));
  const int size = absl::GetFlag(FLAGS_matrix_size);
  for (int m = 0; m < absl::GetFlag(FLAGS_matrices); ++m) {
    muon::v1::ParamSpec* p = spec.add_params();
    p->set_name(absl::StrCat("layers.", m, ".weight"));
    p->add_shape(size);
    p->add_shape(size);
    p->add_placements("Shard(0)");
  }
  return muon::ManifestsFromSpec(spec);
}

void LoadGenerator::MakeAgents(std::vector<muon::v1::RankManifest> manifests,
                               bool compact, RunFigures* f) {
  for (int t = 0; t < threads_; ++t) {
    cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
  }
  stats_.resize(threads_);
  // A host agent's channel arguments (control/grpc_coordination_client.h),
  // and one TCP connection per agent, as N processes would have (channels
  // with equal arguments would otherwise share one subchannel).
  grpc::ChannelArguments args;
  muon::SetCoordinatorChannelArgs(&args);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  const int hosts = world_ / ranks_per_host_;
  for (int r = 0; r < world_; ++r) {
    auto agent = std::make_unique<Agent>();
    agent->rank = r;
    const int host = r / ranks_per_host_;
    agent->leader = r % ranks_per_host_ == 0;
    agent->offset_s = interval_s_ * host / hosts;
    // A host's ranks share its channel (host mode), as they would share a
    // host agent's connection.
    agent->channel =
        agent->leader ? grpc::CreateCustomChannel(
                            address_, grpc::InsecureChannelCredentials(), args)
                      : agents_[r - r % ranks_per_host_]->channel;
    agent->stub = muon::v1::Coordinator::NewStub(agent->channel);
    agent->cq = cqs_[host % threads_].get();
    agent->join_request = std::make_unique<muon::v1::JoinRequest>();
    agent->join_request->set_job_id("job");
    agent->join_request->set_incarnation(1000 + r);
    agent->join_request->set_timeout_ms(600000);
    // Rank 0 defines the layout; the others send a compact manifest as
    // control/agent.cc does (unless --nocompact_manifests).
    if (compact && r != 0) {
      *agent->join_request->mutable_compact() =
          muon::MakeCompactManifest(manifests[r]);
    } else {
      *agent->join_request->mutable_manifest() = std::move(manifests[r]);
    }
    const int64_t bytes =
        static_cast<int64_t>(agent->join_request->ByteSizeLong());
    f->manifest_bytes = std::max(f->manifest_bytes, bytes);
    if (r == world_ - 1) f->last_join_bytes = bytes;
    agent->heartbeat_request.set_job_id("job");
    agent->heartbeat_request.set_rank(r);
    agent->heartbeat_request.set_incarnation(1000 + r);
    Agent* leader =
        agent->leader ? agent.get() : agents_[r - r % ranks_per_host_].get();
    leader->members.push_back(agent.get());
    if (ranks_per_host_ > 1) {
      if (agent->leader) {
        leader->host_request.set_job_id("job");
        leader->host_request.set_host(absl::StrCat("host-", host));
        leader->host_join_request =
            std::make_unique<muon::v1::HostJoinRequest>();
        leader->host_join_request->set_job_id("job");
        leader->host_join_request->set_host(absl::StrCat("host-", host));
      }
      muon::v1::HeartbeatRequest* beat = leader->host_request.add_ranks();
      beat->set_rank(r);
      beat->set_incarnation(1000 + r);
      *leader->host_join_request->add_ranks() = *agent->join_request;
      // Kept once, in the host's request.
      if (!agent->leader) agent->join_request.reset();
    }
    agents_.push_back(std::move(agent));
  }
}

void LoadGenerator::ConnectPhase(RunFigures* f) {
  f->cpu0 = ProcessCpuSeconds(server_pid_);
  const Clock::time_point connect_start = Clock::now();
  for (auto& agent : agents_) {
    if (agent->leader) agent->channel->GetState(true);
  }
  const auto connect_deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(120);
  for (auto& agent : agents_) {
    if (!agent->leader) continue;
    if (!agent->channel->WaitForConnected(connect_deadline)) {
      ++f->connect_failures;
    }
  }
  f->connect_s = SecondsSince(connect_start, Clock::now());
  f->cpu1 = ProcessCpuSeconds(server_pid_);
  f->rss_connected = ProcStatusValue(server_pid_, "VmRSS");
}

void LoadGenerator::WaitForEveryRankJoined(Clock::time_point join_start) {
  std::unique_ptr<muon::v1::Coordinator::Stub> stub =
      muon::v1::Coordinator::NewStub(
          grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  for (;;) {
    grpc::ClientContext context;
    context.AddMetadata(muon::kAuthorizationMetadataKey, bearer_);
    muon::v1::GetJobRequest request;
    request.set_job_id("job");
    muon::v1::JobInfo info;
    const grpc::Status status = stub->GetJob(&context, request, &info);
    if (status.ok() && info.ranks_joined() >= world_) break;
    if (SecondsSince(join_start, Clock::now()) > 300) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stats_[0].last_join_response = Clock::now();
  for (auto& agent : agents_) agent->joined = true;
  for (ThreadStats& s : stats_) s.joins_ok = world_ / threads_;
}

void LoadGenerator::JoinPhase(RunFigures* f) {
  const double client_cpu0 = ProcessCpuSelf();
  const Clock::time_point join_start = Clock::now();
  {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) {
      workers.emplace_back([this, t] { JoinThread(t); });
    }
    for (std::thread& w : workers) w.join();
  }
  if (absl::GetFlag(FLAGS_skip_plan)) WaitForEveryRankJoined(join_start);
  Clock::time_point last_join = join_start;
  for (const ThreadStats& s : stats_) {
    last_join = std::max(last_join, s.last_join_response);
    f->joins_ok += s.joins_ok;
    f->join_errors += s.join_errors;
    f->hash_mismatches += s.plan_hash_mismatches;
    if (f->join_error.empty()) f->join_error = s.first_join_error;
    if (f->plan_hash.empty()) {
      f->plan_hash = s.plan_hash;
      f->plan_bytes = s.plan_bytes;
    } else if (!s.plan_hash.empty() && s.plan_hash != f->plan_hash) {
      ++f->hash_mismatches;
    }
  }
  f->join_s = SecondsSince(join_start, last_join);
  f->client_cpu_join = ProcessCpuSelf() - client_cpu0;
  f->cpu2 = ProcessCpuSeconds(server_pid_);
  f->rss_joined = ProcStatusValue(server_pid_, "VmRSS");
}

void LoadGenerator::HeartbeatPhase(RunFigures* f) {
  if (ranks_per_host_ > 1 && absl::GetFlag(FLAGS_heartbeat_stream)) {
    const Clock::time_point open_start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) {
      workers.emplace_back([this, t] { OpenStreamsThread(t); });
    }
    for (std::thread& w : workers) w.join();
    f->stream_open_s = SecondsSince(open_start, Clock::now());
    // The server's CPU for opening the streams counts with the join's.
    f->cpu2 = ProcessCpuSeconds(server_pid_);
  }
  // Starts shortly after the last JoinResponse (and stream open).
  const double client_cpu0 = ProcessCpuSelf();
  heartbeat_start_ = Clock::now() + std::chrono::milliseconds(200);
  std::fprintf(stderr,
               "coordinator_load_bench: N=%d heartbeat phase starts; server "
               "pid %d\n",
               world_, static_cast<int>(server_pid_));
  {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) {
      workers.emplace_back([this, t] { HeartbeatThread(t); });
    }
    for (std::thread& w : workers) w.join();
  }
  f->client_cpu_hb = ProcessCpuSelf() - client_cpu0;
  f->cpu3 = ProcessCpuSeconds(server_pid_);
  f->server_hwm_kb = ProcStatusValue(server_pid_, "VmHWM");
  f->server_threads = ProcStatusValue(server_pid_, "Threads");
  f->client_hwm_kb = ProcStatusValue(getpid(), "VmHWM");
  Clock::time_point last_heartbeat = heartbeat_start_;
  for (ThreadStats& s : stats_) {
    f->latencies.insert(f->latencies.end(), s.latencies_ms.begin(),
                        s.latencies_ms.end());
    f->send_lags.insert(f->send_lags.end(), s.send_lag_ms.begin(),
                        s.send_lag_ms.end());
    f->heartbeats_ok += s.heartbeats_ok;
    f->heartbeat_errors += s.heartbeat_errors;
    f->job_errors += s.job_errors;
    f->late += s.late;
    last_heartbeat = std::max(last_heartbeat, s.last_heartbeat_response);
    if (f->heartbeat_error.empty())
      f->heartbeat_error = s.first_heartbeat_error;
  }
  std::sort(f->latencies.begin(), f->latencies.end());
  std::sort(f->send_lags.begin(), f->send_lags.end());
  f->heartbeat_s = SecondsSince(heartbeat_start_, last_heartbeat);
}

void LoadGenerator::PrintFigures(const RunFigures& f, bool compact,
                                 const std::string& load_before) const {
  const int64_t errors = f.errors();
  std::printf(
      "agents=%d ranks_per_host=%d hosts=%d%s%s%s client_threads=%d "
      "connect_s=%.2f join_to_plan_s=%.3f stream_open_s=%.2f "
      "joins_ok=%d plan_bytes=%lld manifests=%s join_bytes(max/last)=%lld/%lld "
      "hb_p50_ms=%.2f hb_p99_ms=%.2f hb_max_ms=%.2f hb_per_s=%.0f "
      "hb_ok=%lld send_lag_p99_ms=%.2f hb_late=%lld errors=%lld "
      "server_cpu_s(connect/join/hb)=%.2f/%.2f/%.2f "
      "server_hb_cores=%.3f server_threads=%lld "
      "server_rss_mb(connected/joined/peak)=%.0f/%.0f/%.0f "
      "client_cpu_s(join/hb)=%.2f/%.2f client_peak_rss_mb=%.0f "
      "loadavg_before=%s loadavg_after=%s%s\n",
      world_, ranks_per_host_, world_ / ranks_per_host_,
      ranks_per_host_ > 1 && absl::GetFlag(FLAGS_heartbeat_stream)
          ? " (heartbeat_stream)"
          : "",
      absl::GetFlag(FLAGS_skip_plan) ? " (skip_plan)" : "",
      absl::GetFlag(FLAGS_server_no_deadlock_detection)
          ? " (server_no_deadlock_detection)"
          : "",
      threads_, f.connect_s, f.join_s, f.stream_open_s, f.joins_ok,
      static_cast<long long>(f.plan_bytes), compact ? "compact" : "full",
      static_cast<long long>(f.manifest_bytes),
      static_cast<long long>(f.last_join_bytes), Percentile(f.latencies, 0.50),
      Percentile(f.latencies, 0.99),
      f.latencies.empty() ? NAN : f.latencies.back(),
      f.heartbeat_s > 0 ? f.heartbeats_ok / f.heartbeat_s : 0.0,
      static_cast<long long>(f.heartbeats_ok), Percentile(f.send_lags, 0.99),
      static_cast<long long>(f.late), static_cast<long long>(errors),
      f.cpu1 - f.cpu0, f.cpu2 - f.cpu1, f.cpu3 - f.cpu2,
      f.heartbeat_s > 0 ? (f.cpu3 - f.cpu2) / f.heartbeat_s : 0.0,
      static_cast<long long>(f.server_threads), f.rss_connected / 1024.0,
      f.rss_joined / 1024.0,
      std::max(f.server_hwm_kb, server_rss_max_kb_.load()) / 1024.0,
      f.client_cpu_join, f.client_cpu_hb, f.client_hwm_kb / 1024.0,
      load_before.c_str(), LoadAverage().c_str(),
      server_killed_.load() ? " SERVER_KILLED_MEMORY_LIMIT" : "");
  if (errors > 0) {
    std::printf(
        "  errors: connect=%d join=%d plan_hash_mismatch=%d heartbeat=%lld "
        "job_error=%lld; first join error: %s; first heartbeat error: %s\n",
        f.connect_failures, f.join_errors, f.hash_mismatches,
        static_cast<long long>(f.heartbeat_errors),
        static_cast<long long>(f.job_errors),
        f.join_error.empty() ? "-" : f.join_error.c_str(),
        f.heartbeat_error.empty() ? "-" : f.heartbeat_error.c_str());
  }
  std::fflush(stdout);
}

int LoadGenerator::Run() {
  const std::string load_before = LoadAverage();
  absl::StatusOr<std::vector<muon::v1::RankManifest>> manifests =
      LoadManifests(world_);
  if (!manifests.ok()) {
    std::fprintf(stderr, "coordinator_load_bench: manifests: %s\n",
                 manifests.status().ToString().c_str());
    return 1;
  }
  const bool compact = absl::GetFlag(FLAGS_compact_manifests);
  RunFigures f;
  MakeAgents(*std::move(manifests), compact, &f);
  std::thread watchdog([this] { Watchdog(); });
  ConnectPhase(&f);
  JoinPhase(&f);
  HeartbeatPhase(&f);
  done_.store(true);
  watchdog.join();
  PrintFigures(f, compact, load_before);
  return f.errors() > 0 || server_killed_.load() ? 3 : 0;
}

// Runs one N: forks the server child and the load generator child, waits
// for the load generator, then stops the server. Returns the load
// generator's exit code.
int RunOne(int world, const std::string& secret) {
  int port_pipe[2], control_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(control_pipe) != 0) {
    std::perror("pipe");
    return 1;
  }
  std::fflush(nullptr);
  const pid_t server = fork();
  if (server < 0) {
    std::perror("fork");
    return 1;
  }
  if (server == 0) {
    close(port_pipe[0]);
    close(control_pipe[1]);
    ServeChild(world, secret, port_pipe[1], control_pipe[0]);
  }
  close(port_pipe[1]);
  close(control_pipe[0]);
  int port = -1;
  if (!ReadAll(port_pipe[0], &port, sizeof(port)) || port <= 0) {
    std::fprintf(stderr, "coordinator_load_bench: the server did not start\n");
    close(control_pipe[1]);
    waitpid(server, nullptr, 0);
    return 1;
  }
  close(port_pipe[0]);
  const pid_t client = fork();
  if (client < 0) {
    std::perror("fork");
    return 1;
  }
  if (client == 0) {
    close(control_pipe[1]);
    // The load generator is thousands of hosts in one process: Abseil's
    // deadlock detection (on in Debian's build, and gRPC's mutexes are
    // absl::Mutex) would cost it per lock in proportion to the mutexes of
    // all those channels, which no real host agent has.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    const int code = LoadGenerator(world, port, server, secret).Run();
    std::fflush(nullptr);
    _exit(code);  // skip tearing down N channels
  }
  int status = 0;
  waitpid(client, &status, 0);
  close(control_pipe[1]);  // the server exits
  waitpid(server, nullptr, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  std::fprintf(stderr, "coordinator_load_bench: load generator died (%d)\n",
               status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  const int per_host = absl::GetFlag(FLAGS_ranks_per_host);
  if (per_host < 1 || per_host > 1024) {
    std::fprintf(stderr,
                 "coordinator_load_bench: --ranks_per_host %d is not in "
                 "[1, 1024]\n",
                 per_host);
    return 2;
  }
  std::vector<int> worlds;
  for (absl::string_view item :
       absl::StrSplit(absl::GetFlag(FLAGS_agents), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(item, &n) || n < 1 || n > muon::kMaxWorldSize ||
        n % per_host != 0) {
      std::fprintf(stderr,
                   "coordinator_load_bench: bad --agents item \"%.*s\"\n",
                   static_cast<int>(item.size()), item.data());
      return 2;
    }
    worlds.push_back(n);
  }
  if (worlds.empty() || absl::GetFlag(FLAGS_duration_s) <= 0 ||
      absl::GetFlag(FLAGS_heartbeat_interval_s) <= 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  absl::StatusOr<std::string> secret = muon::GenerateSecret();
  if (!secret.ok()) {
    std::fprintf(stderr, "coordinator_load_bench: %s\n",
                 secret.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "# coordinator_load_bench: %ld cores of %s, gRPC %s, duration %.0f s, "
      "heartbeat interval %.2f s, %d client threads, %d x %dx%d "
      "Shard(0) matrices per manifest\n",
      sysconf(_SC_NPROCESSORS_ONLN), muon::bench::CpuDescription().c_str(),
      grpc::Version().c_str(), absl::GetFlag(FLAGS_duration_s),
      absl::GetFlag(FLAGS_heartbeat_interval_s),
      absl::GetFlag(FLAGS_client_threads), absl::GetFlag(FLAGS_matrices),
      absl::GetFlag(FLAGS_matrix_size), absl::GetFlag(FLAGS_matrix_size));
  std::fflush(stdout);
  int worst = 0;
  for (int world : worlds) worst = std::max(worst, RunOne(world, *secret));
  return worst;
}
