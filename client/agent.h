// The per-rank agent: the rank's link to the coordinator. It joins the job
// (manifest in, plan out), confirms that every rank holds the same plan
// hash, and, once started, sends heartbeats and step reports from
// background threads so that the training step never waits on gRPC.
//
// Lifecycle: construct -> Join -> ConfirmPlanHash -> Start -> Report* ->
// Stop (or destroy). Talks only to a CoordinationClient (gRPC or
// in-process), never to gRPC directly.
//
// Reports: Report() puts the step's report in a bounded queue (capacity
// Options::report_queue_capacity) and returns; a background thread sends
// the queue in order with CoordinationClient::ReportStep, stamping
// StepReport.reports_dropped. A report is dropped, and counted in
// reports_dropped(), when the queue is full (the coordinator is slow), when
// its ReportStep fails (the coordinator is gone or rejects it), or when Stop
// finds it still queued. The internal mutex is never held across an RPC, so
// neither a slow nor a failing coordinator delays Report().
//
//   heartbeat thread: Heartbeat every heartbeat_interval (failures ignored:
//     the coordinator marks a silent rank lost).
//   report thread:    queue -> ReportStep, one at a time.
//
// Thread-safety: Report and counters may be called from any thread; Join,
// Start and Stop from one thread.
#ifndef MUON_CLIENT_AGENT_H_
#define MUON_CLIENT_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordination/coordination_client.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

class Agent {
 public:
  struct Options {
    // Interval between heartbeats.
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // Step reports waiting to be sent; newer reports are dropped (and
    // counted) when the queue is full.
    int report_queue_capacity = 64;
  };

  // `client` is not owned and must outlive the agent.
  Agent(CoordinationClient* client, int rank, uint64_t incarnation,
        Options options);
  ~Agent();

  // Sends the manifest and waits for the plan (every rank of the job gets
  // the same plan or the same error).
  // Errors: those of CoordinationClient::Join (InvalidArgument naming the
  // parameter and rank, DeadlineExceeded, Unavailable).
  absl::StatusOr<v1::Plan> Join(const v1::RankManifest& manifest,
                                int64_t timeout_ms);

  // Publishes this rank's plan hash in the key-value store and checks that
  // every rank of `world_size` published the same one.
  // Errors: FailedPrecondition naming the rank whose hash differs;
  // DeadlineExceeded when a rank did not publish within `timeout`.
  absl::Status ConfirmPlanHash(const std::string& hash, int world_size,
                               absl::Duration timeout);

  // Starts the heartbeat and report threads.
  void Start();
  // Queues a report for the background thread (sets its rank and
  // incarnation); never blocks and never waits on the coordinator: when the
  // queue is full the report is dropped and counted.
  void Report(v1::StepReport report);

  // Allocation-free reporting for the step path: returns a report to fill
  // from a pool of report_queue_capacity + 1 preallocated reports (their
  // repeated fields keep their storage from earlier steps, so a steady
  // step allocates nothing), or nullptr when every pooled report is queued
  // or being sent (the report is then dropped and counted). Never blocks on
  // the coordinator. Pass the result to Submit.
  v1::StepReport* AcquireReport();
  // Queues a report from AcquireReport (sets its rank and incarnation); a
  // full queue drops it and counts it. Never blocks on the coordinator.
  void Submit(v1::StepReport* report);
  // Gives queued reports up to `timeout` to go out, drops (and counts) the
  // rest, and stops the threads. Bound: `timeout` plus the RPC each thread
  // may have in flight, which the transport's deadline bounds
  // (GrpcCoordinationClient: its rpc_timeout; an unreachable coordinator
  // fails at once). Idempotent.
  void Stop(absl::Duration timeout = absl::Seconds(2));

  // Reports whose ReportStep succeeded.
  int64_t reports_sent() const;
  // Reports dropped: queue full, ReportStep failed, or still queued at Stop.
  int64_t reports_dropped() const;

 private:
  void HeartbeatLoop();
  void ReportLoop();

  CoordinationClient* const client_;  // Not owned.
  const int rank_;
  const uint64_t incarnation_;
  const Options options_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Every report object; free_ and the ring queue_ hold pointers into it.
  std::vector<std::unique_ptr<v1::StepReport>> pool_;
  std::vector<v1::StepReport*> free_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepReport*> queue_ ABSL_GUARDED_BY(mu_);  // ring buffer
  size_t queue_head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queue_size_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread heartbeat_thread_;
  std::thread report_thread_;
};

}  // namespace muon

#endif  // MUON_CLIENT_AGENT_H_
