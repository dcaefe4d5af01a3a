// muon-coordinator: the coordinator daemon, one per job.
//
//   muon-coordinator --job_id=mlp --world_size=4 --port=0 --port_file=/tmp/p
//
// Listens on --host:--port (127.0.0.1 and a free port by default), prints
// "muon-coordinator listening on HOST:PORT", optionally writes the port to
// --port_file (atomically, via rename), and serves until SIGINT or SIGTERM,
// then stops cleanly (blocked Join/KeyGet calls get Unavailable).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "plan/planner.h"
#include "server/coordinator_server.h"

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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muon-coordinator: the distributed Muon job coordinator (gRPC).");
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread (gRPC's included) and wait for
  // them synchronously below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  muon::CoordinatorServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.service.job_id = absl::GetFlag(FLAGS_job_id);
  options.service.world_size = absl::GetFlag(FLAGS_world_size);
  options.service.heartbeat_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  options.service.default_join_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_join_timeout_s));
  options.service.plan_defaults.bucket_size_bytes =
      absl::GetFlag(FLAGS_bucket_size_bytes);
  absl::StatusOr<muon::PlannerOptions::Policy> policy =
      muon::ParsePolicy(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) {
    std::cerr << "muon-coordinator: --policy: " << policy.status().message()
              << std::endl;
    return 2;
  }
  options.service.plan_defaults.policy = *policy;
  if (options.service.world_size < 0) {
    std::cerr << "muon-coordinator: --world_size must be >= 0" << std::endl;
    return 2;
  }
  options.service.reports_kept = absl::GetFlag(FLAGS_reports_kept);
  options.service.straggler_factor = absl::GetFlag(FLAGS_straggler_factor);
  if (options.service.reports_kept < 1 ||
      !(options.service.straggler_factor > 0)) {
    std::cerr << "muon-coordinator: --reports_kept must be >= 1 and "
                 "--straggler_factor > 0"
              << std::endl;
    return 2;
  }

  absl::StatusOr<std::unique_ptr<muon::CoordinatorServer>> server =
      muon::CoordinatorServer::Start(options);
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
  std::cout << "muon-coordinator listening on " << (*server)->address()
            << std::endl;  // endl flushes: launchers read this line

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::cout << "muon-coordinator: signal " << signal_number << ", stopping"
            << std::endl;
  (*server)->Stop();
  return 0;
}
