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
//   heartbeat thread: Heartbeat every heartbeat_interval. A response that
//     carries the job error (the coordinator saw a rank lost or failed)
//     is kept (job_error()) and runs the abort callback once (the
//     communicator's Abort: pending collectives return at once). Failures
//     of the Heartbeat RPC itself are not fatal: when they last longer than
//     the heartbeat timeout the agent says so once on stderr
//     ("coordinator unreachable") and training goes on.
//   report thread:    queue -> ReportStep, one at a time.
//
// Failure propagation (XLA's model): a step that fails goes through
// OnStepFailed, which turns a communication error (Unavailable, Aborted,
// DeadlineExceeded: a peer's socket closed, the context was aborted) into
// the coordinator's error naming the failed rank, waiting a bounded time
// for it; a rank's own failure (any other code) is reported to the
// coordinator, which tells every rank.
//
// Thread-safety: Report and counters may be called from any thread; Join,
// Start and Stop from one thread.
#ifndef MUON_CONTROL_AGENT_H_
#define MUON_CONTROL_AGENT_H_

#include <cstdint>
#include <functional>
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
    // Interval between heartbeats; zero = a fifth of the coordinator's
    // heartbeat timeout (from the Join response), at most 1 s.
    absl::Duration heartbeat_interval = absl::ZeroDuration();
    // Step reports waiting to be sent; newer reports are dropped (and
    // counted) when the queue is full.
    int report_queue_capacity = 64;
    // Stop tells the coordinator that the rank leaves cleanly (it becomes
    // "finished", never "lost"). Tests set false to stand for a crash.
    bool leave_on_stop = true;
    // Join sends a CompactManifest (rank, coordinate, layout hash) instead
    // of the manifest when this rank is not rank 0 and its manifest follows
    // from the layout (plan/compact_manifest.h); false sends it whole.
    bool compact_manifest = true;
  };

  // `client` is not owned and must outlive the agent.
  Agent(CoordinationClient* client, int rank, uint64_t incarnation,
        Options options);
  ~Agent();

  // Sends the manifest (compact when Options::compact_manifest allows; whole
  // again when the coordinator asks for it) and waits for the plan (every
  // rank of the job gets the same plan or the same error).
  // Errors: those of CoordinationClient::Join (InvalidArgument naming the
  // parameter and rank, DeadlineExceeded, Unavailable).
  absl::StatusOr<v1::Plan> Join(const v1::RankManifest& manifest,
                                int64_t timeout_ms);

  // Publishes this rank's plan hash in the key-value store and checks it
  // against rank 0's and the next rank's ((rank + 1) mod world_size): two
  // reads per rank, O(world_size) in all (reading every rank's was
  // O(world_size^2) RPCs: 268 million at 16,384 ranks). If every rank
  // equals its successor, every rank holds the same plan; a rank that
  // differs from rank 0 or its successor fails, the coordinator learns it
  // from the step's failure and every rank aborts (agent failure
  // propagation).
  // Errors: FailedPrecondition naming the rank whose hash differs;
  // DeadlineExceeded when a rank did not publish within `timeout`.
  absl::Status ConfirmPlanHash(const std::string& hash, int world_size,
                               absl::Duration timeout);

  // The coordinator's plan for the steps after `step` (re-planning,
  // CoordinationClient::Replan); the same for every rank at that step.
  // Errors: those of CoordinationClient::Replan.
  absl::StatusOr<v1::Plan> Replan(int64_t step);

  // Starts the heartbeat and report threads.
  void Start();

  // Called once, from the heartbeat thread (or OnStepFailed), when the job
  // error is first seen; typically the communicator's Abort(). May be set
  // after Start: set after the job error was seen, it runs at once, on the
  // caller's thread.
  void SetAbortCallback(std::function<void()> abort);

  // The coordinator's job error naming the failed rank (Aborted), or OK
  // while none is known.
  absl::Status job_error() const;
  // The rank the job error names, or -1.
  int failed_rank() const;
  // Whether Heartbeats have failed for longer than the heartbeat timeout,
  // or the coordinator no longer knows this rank (NotFound/Aborted: it was
  // restarted; ranks do not re-register into a running job). Said once on
  // stderr; cleared by the next successful Heartbeat.
  bool coordinator_unreachable() const;

  // The error a failed step should return. `local` is the step's own error.
  //  - A communication error (Unavailable, Aborted, DeadlineExceeded): waits
  //    up to the heartbeat timeout plus three heartbeat intervals (one for
  //    a host agent's relay, control/host_agent.h) for the
  //    coordinator's job error and returns Aborted naming the failed rank
  //    ("rank 0: step failed: rank 2 lost: no heartbeat for 0.31 s ...;
  //    this rank saw: <local>"). When none comes, `local` is reported to the
  //    coordinator (so the other ranks abort) and returned with a note.
  //  - Any other error is this rank's own: it is reported to the
  //    coordinator at once (every other rank aborts naming this rank), the
  //    local communicator is aborted, and `local` is returned unchanged.
  // OK stays OK.
  absl::Status OnStepFailed(const absl::Status& local);

  // A failure known to be this rank's own whatever its code (e.g. the
  // Replan RPC failing on this rank): reported to the coordinator at once,
  // the local communicator aborted (once), `local` returned unchanged. OK
  // stays OK.
  absl::Status OnOwnFailure(const absl::Status& local);

  // The heartbeat interval in use (after Join).
  absl::Duration heartbeat_interval() const;
  // The coordinator's heartbeat timeout (after Join; 30 s if it sent none).
  absl::Duration heartbeat_timeout() const;
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
  // fails at once). Then, with Options::leave_on_stop, one last Heartbeat
  // tells the coordinator the rank leaves (bounded the same way).
  // Idempotent.
  void Stop(absl::Duration timeout = absl::Seconds(2));

  // Reports whose ReportStep succeeded.
  int64_t reports_sent() const;
  // Reports dropped: queue full, ReportStep failed, or still queued at Stop.
  int64_t reports_dropped() const;

 private:
  void HeartbeatLoop();
  // HeartbeatLoop's handling of one heartbeat's outcome: answered; answered
  // NotFound/Aborted (the coordinator restarted); or failed otherwise
  // (`failures` counts consecutive failures, `last_ok` is the last answer).
  void OnHeartbeatAnswered(const v1::HeartbeatResponse& response);
  void OnRankUnknown(const absl::Status& status);
  void OnHeartbeatFailed(const absl::Status& status, absl::Time now,
                         absl::Time last_ok, int* failures);
  void ReportLoop();
  // Keeps a job error from a Heartbeat response; runs the abort callback
  // the first time. Returns whether one is known.
  bool TakeResponse(const v1::HeartbeatResponse& response);
  void RunAbortOnce();
  // Sends one Heartbeat reporting `error` (or leaving) right now.
  void SendReport(const std::string& error, bool leaving);

  // "rank R finished (left the job after step S)" for a peer the
  // coordinator lists as finished, else "" (also when it cannot be asked).
  std::string FinishedPeer();

  // What polling the coordinator after a communication error found.
  struct FailureCause {
    bool reachable = true;      // the last poll got an answer
    int host = -1;              // the rank hosting the coordinator, or -1
    std::string finished_peer;  // FinishedPeer(), when one left early
    absl::Duration waited;      // the poll's bound
  };
  // Polls the coordinator (besides the heartbeat thread) until it names
  // the failed rank (TakeResponse), a peer has finished, the coordinator's
  // host stops answering, or heartbeat_timeout + 2 heartbeat intervals
  // pass: a lost rank is known heartbeat_timeout after its last heartbeat,
  // which came at most one interval before it failed.
  FailureCause PollForFailureCause();
  CoordinationClient* const client_;  // Not owned.
  const int rank_;
  const uint64_t incarnation_;
  const Options options_;

  mutable absl::Mutex mu_;
  absl::Duration heartbeat_timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::string job_error_ ABSL_GUARDED_BY(mu_);  // empty while none
  int failed_rank_ ABSL_GUARDED_BY(mu_) = -1;
  // The rank whose process hosts the coordinator, or -1 (from Join).
  int coordinator_rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool coordinator_lost_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> abort_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  void PushFreeLocked(v1::StepReport* report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::StepReport* PopFreeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Every report object; free_ and the ring queue_ hold pointers into it.
  std::vector<std::unique_ptr<v1::StepReport>> pool_;
  // Free reports, a FIFO ring (the least recently returned is reused
  // first): after pool_.size() reports every object has been filled once
  // and holds its storage, however late the reporter thread returns them.
  std::vector<v1::StepReport*> free_ ABSL_GUARDED_BY(mu_);
  size_t free_head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t free_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::StepReport*> queue_ ABSL_GUARDED_BY(mu_);  // ring buffer
  size_t queue_head_ ABSL_GUARDED_BY(mu_) = 0;
  size_t queue_size_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread heartbeat_thread_;
  std::thread report_thread_;
};

// A rank that could not create its optimizer (`local`, not OK) still
// joins, carrying its error (JoinRequest.error; rank and world size in the
// manifest), so that the coordinator fails the job at once naming it: the
// other ranks' Joins return its error instead of waiting out their
// timeouts. The job then stays failed, as after manifests that disagree:
// its ranks start again. Nothing is sent for a world of one (no peer
// waits, and it may create its optimizer again in the same job). Best
// effort, one RPC: returns the Join's status (the coordinator's error
// naming this rank when it was delivered); callers return `local`
// whatever it is. `client` not owned.
absl::Status ReportFailedJoin(CoordinationClient* client, int rank,
                              int world_size, uint64_t incarnation,
                              const absl::Status& local);

}  // namespace muon

#endif  // MUON_CONTROL_AGENT_H_
