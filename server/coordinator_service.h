// The coordinator's core: job membership, planning, rank health, step
// reports and key-value rendezvous. No gRPC here: server/grpc_service.h
// translates RPCs into calls on this class, and
// server/local_coordination_client.h calls it in-process.
//
// Who talks to whom: every trainer rank Joins with its manifest and blocks;
// when the last rank of the world has joined, the job is planned exactly
// once through PlanJob (plan/plan_job.h: manifest checks, planner, schedule,
// ValidatePlan, hash; the same entry point muonctl and a trainer without a
// coordinator use), and every waiting rank receives the same plan or the
// same error. Ranks then Heartbeat and
// ReportStep; muonctl reads GetJob/GetPlan/GetAssignments/ListRanks/
// GetReports.
//
// Reports: the last Options::reports_kept StepReports of each rank are kept
// in a per-rank ring (the oldest is overwritten); GetReports returns them.
// Stragglers: ListRanks flags a rank whose last step time exceeds
// straggler_factor times the median of the other ranks' last step times
// (see ListRanks).
//
// Job state (GetJob.state, HeartbeatResponse.job_state):
//   waiting --(last rank joins, plan ok)--> planned
//   waiting --(manifests disagree)--> failed
//   planned --(first step report)--> running
//   planned/running --(every rank left cleanly)--> finished
//   planned/running --(a rank lost, or a rank reports an error)--> failed
// "failed" keeps the error (GetJob.error); later Joins of the same job get
// that same error. A Join that cannot belong to the job (rank out of range,
// another world size, above kMaxWorldSize) is rejected alone and does not
// fail the job.
//
// Job generations: a daemon serves one job after another. A generation ends
// when the job finished, or when every rank that joined has left or gone
// silent for heartbeat_timeout (a failed job whose ranks exited, or ranks
// that gave up waiting); the next Join or KeySet then starts generation + 1
// from a clean state and removes the previous generation's rendezvous keys.
// While a generation is live, a second job is rejected before it writes
// anything: its Join finds the rank held by another incarnation (Aborted)
// and its KeySet finds the key set to another value (AlreadyExists).
//
// Waiting calls hold no thread: JoinAsync and KeyGetAsync register a
// callback completed by the call that ends the wait (the last Join, a
// KeySet), by a deadline timer (one thread for all waiters), or by Shutdown.
// Join and KeyGet are blocking wrappers for in-process callers.
//
// Failure propagation (XLA's coordination service model: the coordinator is
// the one that knows, and tells everyone): once planned, any call from any
// rank (Heartbeat, ReportStep) and GetJob/ListRanks check every rank's
// silence; the first rank silent longer than heartbeat_timeout (not blocked
// in Join, not finished) becomes the job error "rank R lost: no heartbeat
// for X s (heartbeat timeout Y s)". A rank whose own step failed reports it
// (HeartbeatRequest.error) and that becomes the job error unless one is
// known. Every HeartbeatResponse then carries the job error and the rank it
// names; agents abort their pending collectives on seeing it. The first
// failure wins: later ones do not overwrite it.
//
// Rank state (computed when read):
//   joining --(plan made)--> ready --(first ReportStep)--> running
//   any --(no Join/Heartbeat/ReportStep for heartbeat_timeout, and not
//          blocked in Join)--> lost
//   any --(job failed)--> failed
//   any --(Heartbeat with leaving)--> finished (never lost afterwards)
// A rank is a straggler (ListRanks) when its last step time is far above
// the median, or, while late, when others have reported later steps and its
// time since its last report is already straggler_factor times the median
// (a frozen rank is flagged before it is lost).
//
// Logs and metrics (server/coordinator_observer.h): with Options::log set,
// one key=value line per join ("event=join"), rejected join
// ("event=join_rejected", "event=join_timeout"), request for another job
// ("event=rejected reason=job_id"), plan ("event=plan", "event=plan_failed",
// "event=replan"), job state change ("event=job_state"), lost rank
// ("event=rank_lost"), failed rank ("event=rank_failed") and rank that left
// ("event=rank_finished"). Heartbeats and step reports log nothing unless
// they change a state. Options::observer receives accepted step reports,
// job state changes and plans (the daemon's Prometheus metrics).
//
// Lifecycle: construct -> calls from any threads -> Shutdown (wakes every
// blocked Join and KeyGet with Unavailable) -> destroy when no call is in
// flight.
// Thread-safety: every method may be called concurrently.
#ifndef MUON_SERVER_COORDINATOR_SERVICE_H_
#define MUON_SERVER_COORDINATOR_SERVICE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "muon/v1/coordinator.pb.h"
#include "plan/plan_job.h"
#include "server/coordinator_observer.h"
#include "server/deadline_timer.h"
#include "server/kv_store.h"

namespace muon {

class CoordinatorService {
 public:
  struct Options {
    // The job this coordinator serves; requests naming another job id are
    // rejected (an empty job id in a request means this job).
    std::string job_id = "job";
    // Number of ranks; 0 = taken from the first Join's manifest.
    int world_size = 0;
    // Join wait when JoinRequest.timeout_ms is 0.
    absl::Duration default_join_timeout = absl::Seconds(60);
    // A rank not heard from (Join, Heartbeat, ReportStep) for this long is
    // "lost", and the job fails naming it. Agents heartbeat every fifth of
    // it (at most 1 s). After a rank dies the others' steps fail naming it
    // within about this long (2x at most): keep it below the launcher's
    // grace period (muonrun: 20 s).
    absl::Duration heartbeat_timeout = absl::Seconds(10);
    // Policy and bucket size for jobs whose manifests leave them unset
    // (ExecutionOptions.assignment_policy empty, bucket_size_bytes 0); a
    // manifest's value wins. Everything else the planner uses comes from
    // the manifests (see PlanJob).
    PlanDefaults plan_defaults;
    // Step reports kept per rank (a ring: the oldest is overwritten); values
    // below 1 are taken as 1.
    int reports_kept = 256;
    // A rank is a straggler when its last step time exceeds this factor times
    // the median of the other ranks' last step times.
    double straggler_factor = 2.0;
    // Clock for heartbeats and report times (tests inject one). Join and
    // KeyGet waits use real time.
    std::function<absl::Time()> now = [] { return absl::Now(); };
    // Bounds on the rendezvous store (key/value sizes, total bytes, waiting
    // KeyGets).
    KeyValueStore::Limits kv_limits;
    // Joins waiting for the other ranks at once.
    size_t max_waiting_joins = 1 << 17;
    // Longest Join wait a request may ask for (longer ones are capped).
    absl::Duration max_join_timeout = absl::Hours(1);
    // Largest GetReports response, bytes: the transport's message limit
    // (CoordinatorServer::Start lowers it to its max_message_bytes). A
    // larger answer is refused (ResourceExhausted) before it is built whole.
    size_t max_response_bytes = size_t{64} << 20;
    // Structured log lines (see "Logs and metrics" above); empty: none. The
    // daemon logs them with glog's LOG(INFO).
    CoordinatorLog log;
    // Step reports, job state changes and plans, for metrics; null: none.
    // Not owned; must outlive the service.
    CoordinatorObserver* observer = nullptr;
  };

  explicit CoordinatorService(Options options);
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;
  ~CoordinatorService();

  const Options& options() const { return options_; }

  // Registers a rank and blocks until every rank has joined and the plan is
  // made, or request.timeout_ms passes (0 = default_join_timeout). A retry
  // with the same incarnation rejoins (e.g. after a client-side timeout).
  // Errors:
  //   InvalidArgument: job id mismatch; or the job failed: a manifest is
  //     invalid or disagrees with another rank's (names the parameter, ranks
  //     and values), a rank is out of range, or world sizes disagree. Every
  //     rank of the job receives the same error.
  //   Aborted: the rank already joined with another incarnation.
  //   DeadlineExceeded: other ranks did not join in time (names them).
  //   Unavailable: the service is shutting down.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request);

  // Join without blocking: `done` receives Join's result exactly once, from
  // this call, the call that completes the job, the deadline timer or
  // Shutdown (never with the service's lock held). Also ResourceExhausted
  // when Options::max_waiting_joins calls already wait.
  using JoinCallback = std::function<void(absl::StatusOr<v1::JoinResponse>)>;
  void JoinAsync(const v1::JoinRequest& request, JoinCallback done);

  // A host agent's Joins (HostJoinRequest): each entry as JoinAsync, and
  // `done` once: at the first entry's error (naming the host) or the first
  // response that asks for full manifests (send_full_manifest: rejoin
  // those ranks, same incarnations, with their full manifests), without
  // waiting for the other entries; else with the response every rank
  // shares once every entry has it. Holds no thread while waiting.
  // Errors: those of Join for any entry; InvalidArgument (job id, no
  // entries, more than kMaxHostRanks, a rank listed twice).
  void HostJoinAsync(const v1::HostJoinRequest& request, JoinCallback done);

  // Records that `rank` calls from the coordinator's own process
  // (LocalCoordinationClient). When exactly one rank does, Join responses
  // name it as the coordinator's host (JoinResponse.coordinator_rank).
  void NoteInProcessRank(int rank);

  // Records that a rank is alive; returns the job state and, once the job
  // failed at run time, the job error naming the failed rank. request.error
  // reports this rank's own failure (the first failure becomes the job error,
  // its first kMaxErrorBytes kept, cut at a UTF-8 character boundary);
  // request.leaving marks the rank finished. Errors: InvalidArgument (job id),
  // NotFound (rank never joined),
  //   Aborted (stale incarnation).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);

  // Records a rank's step: last step, step time, matrices and FLOPs, and
  // keeps the whole report (per-operation timings) in the rank's ring of the
  // last reports_kept reports; the rank becomes RANK_STATE_RUNNING. Also counts
  // as a heartbeat. Errors: InvalidArgument (job id; more than
  // kMaxReportOps ops), NotFound (rank never joined),
  //   Aborted (stale incarnation), FailedPrecondition (no plan yet).
  absl::StatusOr<v1::ReportStepResponse> ReportStep(
      const v1::StepReport& report);

  // A host agent's heartbeat: each entry of request.ranks as Heartbeat
  // does, under one lock, then one response. All or nothing: the entries
  // are checked first.
  // Errors: InvalidArgument (job id of the call or an entry; more than
  // kMaxHostRanks entries; a rank listed twice; a host name longer than
  // kMaxHostNameBytes), NotFound (a rank never
  // joined), Aborted (a stale incarnation); each names the host and rank.
  absl::StatusOr<v1::HeartbeatResponse> HostHeartbeat(
      const v1::HostHeartbeatRequest& request);

  // A host agent's batch of step reports: each as ReportStep, all or
  // nothing (checked first).
  // Errors: those of ReportStep for any report (naming its rank);
  // InvalidArgument (more than kMaxHostRanks reports, or a report with
  // more than kMaxReportOps ops).
  absl::StatusOr<v1::ReportStepResponse> ReportSteps(
      const v1::StepReports& request);

  // Most ranks one host agent speaks for in one call.
  static constexpr int kMaxHostRanks = 1024;
  // Longest host name of a HostHeartbeat or HostJoin, bytes: a heartbeat's
  // host is kept in each of its ranks' entries (muonrun's is "node K
  // (hostname)", hostname at most 64 bytes on Linux).
  static constexpr size_t kMaxHostNameBytes = 256;
  // Most bytes of a rank's error (HeartbeatRequest.error, JoinRequest.error)
  // kept in the job error; the rest is cut at a UTF-8 boundary.
  static constexpr size_t kMaxErrorBytes = 4096;
  // Most operations in one StepReport: 2^20. A rank reports about 4 per
  // bucket (gather, orthogonalize, redistribute, apply), so this is 2^18
  // buckets a step, above any plan's (46,848 expert matrices over 2 ranks
  // make about 82k operations); a full report is about 40 MB, under the
  // server's largest message, which bounds each of the reports_kept
  // reports a rank keeps. The count bounds the work per report.
  static constexpr int kMaxReportOps = 1 << 20;

  // Re-planning from measured times (ExecutionOptions.replan_every_steps,
  // plan/replan.h): the plan for the steps after request.step. The first
  // rank asking at a step boundary makes it (the ranks' measured
  // Newton-Schulz seconds per FLOP since the current plan began, from their
  // kept reports), and it becomes the job's plan (GetPlan); every rank
  // asking at that step gets the same one (the last 4 boundaries are
  // kept). Unchanged owners keep the current plan.
  // Errors: InvalidArgument (job id), NotFound (rank never joined),
  //   Aborted (stale incarnation), FailedPrecondition (no plan, the job
  //   failed, re-planning off, a step that is not a positive multiple of
  //   replan_every_steps, or a boundary older than the kept ones).
  absl::StatusOr<v1::ReplanResponse> Replan(const v1::ReplanRequest& request);

  // Job summary. Errors: InvalidArgument (job id).
  absl::StatusOr<v1::JobInfo> GetJob(const v1::GetJobRequest& request);

  // The plan. Errors: InvalidArgument (job id), FailedPrecondition (no plan:
  //   still waiting for ranks, or planning failed; the message says which).
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& request);

  // The planned job's layout as a job spec (JobSpecFromLayout: mesh,
  // parameters with global shapes, placements and sub-meshes, execution
  // options, optimizer.ns_steps), job_id the job's. Errors: as GetPlan.
  absl::StatusOr<v1::JobSpec> GetJobSpec(const v1::GetJobSpecRequest& request);

  // Per rank (every rank of the world), the matrices it orthogonalizes
  // (parameter names; "name[e]" for slice e of a 3-D expert stack) and its
  // NS FLOPs. Errors: as GetPlan.
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments(
      const v1::GetAssignmentsRequest& request);

  // Status of every rank that joined, by rank: state, incarnation, last
  // heartbeat, and from its latest report the step, step time, matrices,
  // FLOPs and reports_dropped (the agent's count).
  // straggler: the rank's last step time is greater than straggler_factor
  // times the median of the last step times of the OTHER ranks that have
  // reported (the mean of the two middle values for an even count). Needs at
  // least 2 other ranks with a report (with fewer, nobody is flagged: one
  // other rank is no majority to compare with) and a positive median.
  // Ranks are compared on their latest reports whatever their step numbers
  // and states (a lost rank's last step time still counts).
  // Errors: InvalidArgument (job id).
  absl::StatusOr<v1::ListRanksResponse> ListRanks(
      const v1::ListRanksRequest& request);

  // Number of ranks in each state (RANK_STATE_JOINING, ...), after the same
  // lost-rank check as ListRanks: what the metrics endpoint scrapes, without
  // building ListRanks' per-rank statuses or sorting step times.
  std::map<v1::RankState, int> RankStateCounts();

  // The kept step reports (at most reports_kept per rank) of request.rank
  // (-1 = every rank that joined), the last request.last_steps of each rank
  // (0 = all kept), ordered by rank, then step (then arrival).
  // Errors:
  //   InvalidArgument: job id; rank < -1; last_steps < 0.
  //   NotFound: request.rank >= 0 has not joined.
  //   ResourceExhausted: the reports add up to more than
  //     Options::max_response_bytes (names the limit; ask for fewer with
  //     last_steps, muonctl's --last_steps).
  absl::StatusOr<v1::GetReportsResponse> GetReports(
      const v1::GetReportsRequest& request);

  // Key-value rendezvous of the current job generation (KeyValueStore:
  // set once, bounded sizes). Errors: InvalidArgument (job id, empty or
  // oversized key or value), AlreadyExists (the key holds another value),
  // ResourceExhausted (store or waiter limits); KeyGet also
  // DeadlineExceeded (names the key) and Unavailable (shutdown).
  absl::StatusOr<v1::KeySetResponse> KeySet(const v1::KeySetRequest& request);
  absl::StatusOr<v1::KeyGetResponse> KeyGet(const v1::KeyGetRequest& request);
  // KeyGet without blocking; `done` as in JoinAsync.
  using KeyGetCallback =
      std::function<void(absl::StatusOr<v1::KeyGetResponse>)>;
  void KeyGetAsync(const v1::KeyGetRequest& request, KeyGetCallback done);

  // The current job generation (1 for the first job).
  int64_t generation() const;

  // Writes one structured log line through Options::log (nothing when it
  // is empty). For the layers above, e.g. the gRPC layer's rejected
  // credentials ("event=rejected reason=unauthenticated ...").
  void Log(absl::string_view line) const;

  // Wakes every blocked Join and KeyGet with Unavailable and makes later
  // ones fail the same way. Idempotent.
  void Shutdown();

 private:
  // Where the job is in its planning: the job state (JobStateLocked) adds
  // running, finished and run-time failures from the ranks' counters.
  enum class Phase { kWaiting, kPlanned, kFailed };
  using Completions = std::vector<std::function<void()>>;

  struct JoinWaiter {
    int rank = 0;
    absl::Duration timeout;
    JoinCallback done;
  };

  struct RankInfo {
    uint64_t incarnation = 0;
    bool finished = false;      // left cleanly (Heartbeat with leaving)
    absl::Time last_report_at;  // when last_report arrived
    // The rank's full manifest, or (compact) its CompactManifest: its
    // layout then follows from rank 0's (plan/compact_manifest.h).
    v1::RankManifest manifest;
    bool compact = false;
    v1::CompactManifest compact_manifest;
    absl::Time last_seen;
    // The host agent that heartbeats for the rank (HostHeartbeatRequest's
    // host), or empty: a host that goes silent has all its ranks named.
    std::string host;
    int joins_in_flight = 0;  // Join calls of this rank now blocked
    bool reported = false;
    bool failure_logged = false;  // "event=rank_failed" written
    v1::StepReport last_report;
    // The last reports_kept reports: a ring of at most that many entries,
    // `next_report` indexes the oldest once it is full.
    std::vector<v1::StepReport> reports;
    size_t next_report = 0;
  };

  // OK for an empty job id or this job's; else InvalidArgument naming both
  // (and logs "event=rejected reason=job_id").
  absl::Status CheckJobId(const std::string& job_id) const;
  // Logs and tells the observer when the job state changed since the last
  // call (O(1)).
  void NoteJobStateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's state: the phase, refined by the ranks' reports and leaves.
  v1::JobState JobStateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Join up to registering the rank; sets *waiting when the caller must wait
  // (then `done` is kept in join_waiters_), else returns the result.
  absl::StatusOr<v1::JoinResponse> JoinLocked(const v1::JoinRequest& request,
                                              JoinCallback& done, bool* waiting,
                                              Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JoinLocked for a rank already in the plan (`info`): the job's Join
  // response when its layout hash matches its first join's (marks it
  // unfinished again), else FailedPrecondition.
  absl::StatusOr<v1::JoinResponse> RejoinPlannedLocked(
      const v1::JoinRequest& request, int rank, absl::Time now, RankInfo& info)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank `rank`'s entry in ranks_ and rank_index_ (made if new), with its
  // incarnation and last_seen set.
  RankInfo& RankEntryLocked(int rank, uint64_t incarnation, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the joining rank in ranks_ and rank_index_ (incarnation,
  // manifest, last_seen, one more Join in flight) and logs it.
  void RecordJoinLocked(const v1::JoinRequest& request, int rank,
                        absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Join carrying its rank's creation error (JoinRequest.error, after the
  // incarnation check): once its rank and world size pass CheckJoinLocked,
  // the error naming the rank (InvalidArgument, at most 4 KiB of the
  // rank's text) fails a waiting job, completing every waiting Join with
  // it; the rank is recorded as seen, so the failed generation ends as any
  // other once its ranks are silent. A planned job goes on (none of its
  // ranks waits in a Join). Returned to the caller too.
  absl::Status FailedJoinLocked(const v1::JoinRequest& request, int rank,
                                Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a Join's rank and world size against the job (rejects the call
  // alone) and learns the world size from the first rank.
  absl::Status CheckJoinLocked(int rank, int64_t world)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes every waiting Join with the job's plan or error.
  void CompleteJoinsLocked(Completions* completions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends waiting Join `id` with DeadlineExceeded (timer thread).
  void ExpireJoin(uint64_t id);
  // Whether the current generation is over (see "Job generations").
  bool GenerationOverLocked(absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Starts the next generation when the current one is over.
  void MaybeStartGenerationLocked(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next generation for a KeySet/KeyGet and notes the activity.
  void NoteKeyActivity();

  // Validates and plans once every rank has joined; sets state_.
  void PlanLocked(Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan of the joined ranks. With compact manifests: rank 0's layout,
  // each compact rank's coordinate and layout hash checked against it
  // (O(matrices + ranks)); ranks whose hash differs are answered with
  // send_full_manifest and removed (returns nullopt: no plan yet); a full
  // manifest whose layout differs from rank 0's is named by
  // DiagnoseLayoutMismatch. Otherwise, or for a mixed job that does not
  // follow rank 0's layout, PlanJob on every rank's (derived) manifest.
  absl::StatusOr<std::optional<JobPlan>> PlanJoinedLocked(
      Completions* completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the joined ranks can be planned from rank 0's layout; the
  // compact ranks to ask for their full manifest go to `resend`.
  absl::StatusOr<bool> FollowsRank0Locked(std::vector<int>* resend) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Marks the job failed with `status` and wakes every waiter.
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `report` to the rank's ring, overwriting the oldest when full.
  void KeepReportLocked(RankInfo& info, const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last step times of the ranks that reported, ascending.
  std::vector<double> SortedStepTimesLocked() const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a rank's last step time marks it a straggler (see ListRanks);
  // `sorted_times` is SortedStepTimesLocked(), the rank's own included.
  bool IsStragglerLocked(const RankInfo& info,
                         const std::vector<double>& sorted_times) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Once planned and without a run-time error: records the first rank
  // silent for longer than heartbeat_timeout as the job error. A rank of a
  // host agent with other ranks is named with all of them once every one
  // is silent that long (the host is lost); while the host's freshest rank
  // is silent between half the timeout and the timeout, nothing is named
  // yet (the host may be dead, or just late).
  void CheckLostLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The unfinished ranks whose host agent is `host`, ascending; raises
  // *last_seen to the latest of their last_seen.
  std::vector<int> HostRanksLocked(const std::string& host,
                                   absl::Time* last_seen) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // "rank R lost: no heartbeat for S s (...)" when `host_ranks` is empty,
  // else "ranks R, S, ... of host \"H\" lost: ..." naming `host_ranks` (at
  // most 64, then a count). `silence`: how long R has been silent.
  std::string LostMessage(int rank, const RankInfo& info,
                          std::vector<int> host_ranks,
                          absl::Duration silence) const;
  // Records a run-time failure naming `rank` unless one is known.
  void FailRankLocked(int rank, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One rank's heartbeat (`info` is its entry): seen now, finished when
  // leaving, its error the job error when it is the first.
  void ApplyHeartbeatLocked(const v1::HeartbeatRequest& request, absl::Time now,
                            RankInfo* info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After heartbeats: the lost-rank scan, then the job state and error.
  v1::HeartbeatResponse HeartbeatResponseLocked(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One rank's step report (`info` is its entry), kept in its ring (the
  // caller runs the lost-rank scan afterwards).
  void ApplyReportLocked(const v1::StepReport& report, absl::Time now,
                         RankInfo* info) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The highest step any rank reported, or the lowest int64_t when none
  // has (O(ranks)).
  int64_t HighestStepLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a planned rank is late: others reported later steps (the
  // highest reported step, HighestStepLocked, is above its own) and it has
  // not reported for straggler_factor times the median step time. O(1):
  // ListRanks computes `sorted_times` and `highest_step` once for all ranks.
  bool IsLateLocked(const RankInfo& info, absl::Time now,
                    const std::vector<double>& sorted_times,
                    int64_t highest_step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // One rank's state at time `now`.
  v1::RankState RankStateLocked(const RankInfo& info, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Ranks in [0, world_size_) that have not joined, e.g. "[2, 3]": at most
  // 64, then a count ("[0, 1, ..., 63 and 936 more]").
  std::string MissingRanksLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // `info`'s kept reports, oldest step first (then arrival), the last
  // `last_steps` of them (0 = all).
  std::vector<const v1::StepReport*> KeptReportsLocked(const RankInfo& info,
                                                       int last_steps) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Replan's checks: the rank is joined (FindRankLocked), a plan exists,
  // no run-time error, and the step is a multiple of replan_every_steps;
  // else FailedPrecondition (or FindRankLocked's error).
  absl::Status CheckReplanLocked(const v1::ReplanRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when a plan exists, else FailedPrecondition saying why.
  absl::Status PlanReadyLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A Join response: the plan without loads and with the compact schedule
  // (rank_plan_; the same for every rank, each derives its own operations),
  // the heartbeat timeout and the coordinator's host.
  v1::JoinResponse JoinResponseLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Finds a joined rank with a matching incarnation.
  absl::StatusOr<RankInfo*> FindRankLocked(int rank, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  KeyValueStore kv_;

  mutable absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  // Last KeySet/KeyGet (ends a generation whose ranks never joined).
  absl::Time last_key_activity_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, JoinWaiter> join_waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_join_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  int world_size_ ABSL_GUARDED_BY(mu_);  // 0 until known
  Phase state_ ABSL_GUARDED_BY(mu_) = Phase::kWaiting;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // why the job failed
  // Run-time failure (a lost rank or a reported error); empty while none.
  std::string run_error_ ABSL_GUARDED_BY(mu_);
  int failed_rank_ ABSL_GUARDED_BY(mu_) = -1;
  // Ranks that call from this process (NoteInProcessRank). Kept across
  // generations: it is noted before the Join that may start the next one.
  std::vector<int> in_process_ranks_ ABSL_GUARDED_BY(mu_);
  v1::Plan plan_ ABSL_GUARDED_BY(mu_);  // valid when kPlanned
  // plan_ without schedule.ranks and loads: what every Join response
  // shares (each adds its own rank's schedule).
  v1::Plan rank_plan_ ABSL_GUARDED_BY(mu_);
  // The job's layout (for re-planning and the matrices' display names) and,
  // per re-plan step boundary, the plan every rank gets there (PlanForRank
  // form; the last few kept).
  JobLayout layout_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, v1::Plan> replans_ ABSL_GUARDED_BY(mu_);
  std::map<int, RankInfo> ranks_ ABSL_GUARDED_BY(mu_);
  // rank -> its entry of ranks_ (std::map's nodes do not move), or null:
  // one lookup per rank of a heartbeat instead of a walk of the tree.
  std::vector<RankInfo*> rank_index_ ABSL_GUARDED_BY(mu_);
  // Ranks of ranks_ that left cleanly / have reported a step.
  int finished_count_ ABSL_GUARDED_BY(mu_) = 0;
  int reported_count_ ABSL_GUARDED_BY(mu_) = 0;
  // When CheckLostLocked last scanned the ranks.
  absl::Time last_lost_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // The job state and generation last logged (NoteJobStateLocked).
  v1::JobState logged_state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_WAITING;
  int64_t logged_generation_ ABSL_GUARDED_BY(mu_) = 1;
  DeadlineTimer timer_;  // last: destroyed (joined) first
};

}  // namespace muon

#endif  // MUON_SERVER_COORDINATOR_SERVICE_H_
