// muon-coordinator: the coordinator daemon, one per job.
//
//   muon-coordinator --job_id=mlp --world_size=4 --port=0 --port_file=/tmp/p
//
// Listens on --host:--port (127.0.0.1 and a free port by default), prints
// "muon-coordinator listening on HOST:PORT", optionally writes the port to
// --port_file (atomically, via rename), and serves until SIGINT or SIGTERM,
// then stops cleanly (blocked Join/KeyGet calls get Unavailable).
//
// Access control (coordination/credentials.h): every RPC must carry the job
// secret, taken from --secret_file (created with mode 0600 and a random
// secret when it does not exist), else MUON_JOB_SECRET / MUON_JOB_SECRET_FILE,
// else generated into a new private directory (mode 0700) whose path is
// printed. --read_token_file (same rule; also generated into that private
// directory) holds muonctl's read-only token. --tls_cert_file and
// --tls_key_file serve TLS; a non-loopback --host without TLS is warned
// about.
//
// Logs: one glog line (to stderr) per join, plan, job state change, lost or
// failed rank and rejected request, key=value style (see "Logs and
// metrics" in server/coordinator_service.h). glog's own flags (gflags) are
// not parsed: the daemon's flags are Abseil's.
//
// Metrics: --metrics_port=N serves Prometheus text metrics at
// http://127.0.0.1:N/metrics (server/metrics.h) and prints "muon-coordinator
// metrics on http://127.0.0.1:N/metrics"; 0 (the default) serves none.
#include <pthread.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "coordination/credentials.h"
#include "glog/logging.h"
#include "plan/planner.h"
#include "server/coordinator_server.h"
#include "server/metrics.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to listen on (loopback by default).");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free port.");
ABSL_FLAG(std::string, job_id, "job",
          "Job id; requests naming another job are rejected.");
ABSL_FLAG(int, world_size, 0,
          "Number of ranks; 0 takes it from the first rank to join.");
ABSL_FLAG(std::string, policy, "lpt",
          "Default owner assignment policy: lpt or round_robin (a job's "
          "execution options override it).");
ABSL_FLAG(int64_t, bucket_size_bytes, 0,
          "Default bucket size bound in fp32 bytes; 0 = one matrix per owner "
          "per bucket.");
ABSL_FLAG(std::string, port_file, "",
          "If set, the bound port is written to this file (atomically).");
ABSL_FLAG(double, heartbeat_timeout_s, 10.0,
          "Seconds without a heartbeat after which a rank is reported lost.");
ABSL_FLAG(double, join_timeout_s, 60.0,
          "Default seconds a Join waits for the other ranks.");
ABSL_FLAG(int, reports_kept, 256,
          "Step reports kept per rank for muonctl timings/trace (a ring).");
ABSL_FLAG(std::string, secret_file, "",
          "File holding the job secret every RPC must carry; created (mode "
          "0600, random) if missing. Default: MUON_JOB_SECRET, "
          "MUON_JOB_SECRET_FILE, else a new file in a private directory.");
ABSL_FLAG(std::string, read_token_file, "",
          "File holding muonctl's read-only token; created (mode 0600, "
          "random) if missing.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate to serve TLS with (needs --tls_key_file).");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key for TLS.");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest request or response, bytes.");
ABSL_FLAG(int, metrics_port, 0,
          "Port of the Prometheus text endpoint on 127.0.0.1 (GET /metrics); "
          "0 = no metrics.");
ABSL_FLAG(double, straggler_factor, 2.0,
          "A rank is flagged a straggler when its last step time exceeds this "
          "factor times the median of the other ranks' (needs >= 2 others).");

namespace {

bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::out | std::ios::trunc);
    if (!out) return false;
    out << port << "\n";
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Reads the token in `path`, or creates the file with a new random one.
absl::StatusOr<std::string> ReadOrCreateToken(const std::string& path) {
  absl::StatusOr<std::string> token = muon::ReadSecretFile(path);
  if (token.ok() || token.status().code() != absl::StatusCode::kNotFound) {
    return token;
  }
  MUON_ASSIGN_OR_RETURN(std::string fresh, muon::GenerateSecret());
  MUON_RETURN_IF_ERROR(muon::WriteSecretFile(path, fresh));
  std::cout << "muon-coordinator: wrote a new token to " << path << std::endl;
  return fresh;
}

// A new private directory for generated tokens, made once.
absl::StatusOr<std::string> PrivateDir() {
  static std::string dir;
  if (!dir.empty()) return dir;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                   "/muon-coordinator-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot create ", pattern));
  }
  dir = pattern;
  return dir;
}

// The job secret and read-only token (see the file comment).
absl::StatusOr<muon::CoordinatorAuth> LoadAuth() {
  muon::CoordinatorAuth auth;
  const std::string secret_file = absl::GetFlag(FLAGS_secret_file);
  std::string read_file = absl::GetFlag(FLAGS_read_token_file);
  if (!secret_file.empty()) {
    MUON_ASSIGN_OR_RETURN(auth.job_secret, ReadOrCreateToken(secret_file));
  } else {
    MUON_ASSIGN_OR_RETURN(auth.job_secret, muon::JobSecretFromEnv());
  }
  if (auth.job_secret.empty()) {
    MUON_ASSIGN_OR_RETURN(std::string dir, PrivateDir());
    MUON_ASSIGN_OR_RETURN(auth.job_secret,
                          ReadOrCreateToken(absl::StrCat(dir, "/job.secret")));
    std::cout << "muon-coordinator: ranks need MUON_JOB_SECRET_FILE=" << dir
              << "/job.secret" << std::endl;
    if (read_file.empty()) read_file = absl::StrCat(dir, "/read.token");
  }
  if (!read_file.empty()) {
    MUON_ASSIGN_OR_RETURN(auth.read_token, ReadOrCreateToken(read_file));
  }
  return auth;
}

// Parses the command line: --help lists this file's flags (Abseil
// matches files named after the program, and "muon-coordinator" is not
// "muon_coordinator_main").
void ParseFlags(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muon-coordinator: the distributed Muon job coordinator (gRPC).");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "muon_coordinator_main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
}

// "" when `seconds` is positive and finite, else the message naming
// `flag` and the value.
std::string PositiveSecondsError(const char* flag, double seconds) {
  if (std::isfinite(seconds) && seconds > 0) return "";
  return absl::StrCat("--", flag, "=", seconds,
                      " must be a positive, finite number of seconds");
}

// The first flag whose value is out of range, as the message for exit
// status 2 (naming the flag and its value); "" when every flag is fine.
std::string FlagUsageError() {
  absl::StatusOr<muon::PlannerOptions::Policy> policy =
      muon::ParsePolicy(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) {
    return absl::StrCat("--policy: ", policy.status().message());
  }
  const int world_size = absl::GetFlag(FLAGS_world_size);
  if (world_size < 0 || world_size > muon::kMaxWorldSize) {
    return absl::StrCat("--world_size=", world_size, " must be in [0, ",
                        muon::kMaxWorldSize,
                        "] (0 = from the first rank to join)");
  }
  for (const auto& [flag, seconds] :
       {std::pair<const char*, double>{
            "heartbeat_timeout_s", absl::GetFlag(FLAGS_heartbeat_timeout_s)},
        {"join_timeout_s", absl::GetFlag(FLAGS_join_timeout_s)}}) {
    if (std::string e = PositiveSecondsError(flag, seconds); !e.empty()) {
      return e;
    }
  }
  if (absl::GetFlag(FLAGS_max_message_bytes) <= 0) {
    return absl::StrCat(
        "--max_message_bytes=", absl::GetFlag(FLAGS_max_message_bytes),
        " must be positive");
  }
  if (absl::GetFlag(FLAGS_reports_kept) < 1 ||
      !(absl::GetFlag(FLAGS_straggler_factor) > 0)) {
    return "--reports_kept must be >= 1 and --straggler_factor > 0";
  }
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < 0 || metrics_port > 65535) {
    return "--metrics_port must be in [0, 65535]";
  }
  return "";
}

// The server's options from the flags (checked by FlagUsageError) and the
// secrets they name (LoadAuth's errors).
absl::StatusOr<muon::CoordinatorServerOptions> ServerOptionsFromFlags() {
  muon::CoordinatorServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  auto& service = options.service;
  service.job_id = absl::GetFlag(FLAGS_job_id);
  service.world_size = absl::GetFlag(FLAGS_world_size);
  service.heartbeat_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  service.default_join_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
  service.plan_defaults.bucket_size_bytes =
      absl::GetFlag(FLAGS_bucket_size_bytes);
  MUON_ASSIGN_OR_RETURN(service.plan_defaults.policy,
                        muon::ParsePolicy(absl::GetFlag(FLAGS_policy)));
  service.reports_kept = absl::GetFlag(FLAGS_reports_kept);
  service.straggler_factor = absl::GetFlag(FLAGS_straggler_factor);
  service.log = [](absl::string_view line) { LOG(INFO) << line; };
  MUON_ASSIGN_OR_RETURN(options.auth, LoadAuth());
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key_file);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  return options;
}

// The Prometheus endpoint of --metrics_port (nullptr for 0), observing the
// service through `options`.
absl::StatusOr<std::unique_ptr<muon::CoordinatorMetrics>> StartMetrics(
    muon::CoordinatorServerOptions* options) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port == 0) return std::unique_ptr<muon::CoordinatorMetrics>();
  muon::MetricsOptions metrics_options;
  metrics_options.port = port;
  absl::StatusOr<std::unique_ptr<muon::CoordinatorMetrics>> started =
      muon::CoordinatorMetrics::Start(metrics_options);
  if (!started.ok()) {
    return absl::Status(
        started.status().code(),
        absl::StrCat("--metrics_port: ", started.status().ToString()));
  }
  options->service.observer = started->get();
  return started;
}

// Sends glog to stderr and turns off Abseil's mutex deadlock detection.
void InitProcess(const char* argv0) {
  // glog to stderr; its gflags-defined flags are set here, never parsed.
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  // Debian's Abseil checks every mutex acquisition for lock-order cycles,
  // gRPC's included: 7% of a heartbeat's CPU and 60% of connection setup
  // at 4,096 agents (docs/coordinator_load.md). The daemon's locks are
  // covered by the tests' builds; skip the check here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

// Blocks SIGINT and SIGTERM in this thread and every thread started after
// it (gRPC's included); returns the set, for sigwait.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

}  // namespace

int main(int argc, char** argv) {
  ParseFlags(argc, argv);
  InitProcess(argv[0]);
  // Wait for the stop signals synchronously below.
  sigset_t stop_signals = BlockStopSignals();

  if (const std::string usage = FlagUsageError(); !usage.empty()) {
    std::cerr << "muon-coordinator: " << usage << std::endl;
    return 2;
  }
  absl::StatusOr<muon::CoordinatorServerOptions> options =
      ServerOptionsFromFlags();
  if (!options.ok()) {
    std::cerr << "muon-coordinator: " << options.status().message()
              << std::endl;
    return 1;
  }
  absl::StatusOr<std::unique_ptr<muon::CoordinatorMetrics>> metrics =
      StartMetrics(&*options);
  if (!metrics.ok()) {
    std::cerr << "muon-coordinator: " << metrics.status().message()
              << std::endl;
    return 1;
  }
  absl::StatusOr<std::unique_ptr<muon::CoordinatorServer>> server =
      muon::CoordinatorServer::Start(*options);
  if (!server.ok()) {
    std::cerr << "muon-coordinator: " << server.status().ToString()
              << std::endl;
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty() && !WritePortFile(port_file, (*server)->port())) {
    std::cerr << "muon-coordinator: cannot write --port_file " << port_file
              << std::endl;
    return 1;
  }
  if (*metrics != nullptr) (*metrics)->Watch((*server)->service());
  std::cout << "muon-coordinator listening on " << (*server)->address()
            << std::endl;  // endl flushes: launchers read this line
  if (*metrics != nullptr) {
    std::cout << "muon-coordinator metrics on " << (*metrics)->url()
              << std::endl;
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::cout << "muon-coordinator: signal " << signal_number << ", stopping"
            << std::endl;
  if (*metrics != nullptr) (*metrics)->Watch(nullptr);
  (*server)->Stop();
  return 0;
}
