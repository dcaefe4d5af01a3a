#include "server/coordinator_service.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/checked_math.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "common/wire_names.h"
#include "plan/compact_manifest.h"
#include "plan/manifest_validation.h"
#include "plan/plan_job.h"
#include "plan/planner.h"
#include "plan/replan.h"

namespace muon {
namespace {

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

// Median of `sorted` without its element at index `skip` (mean of the two
// middle values for an even count); sorted.size() >= 2.
double MedianWithout(const std::vector<double>& sorted, size_t skip) {
  const size_t n = sorted.size() - 1;
  auto at = [&](size_t i) { return sorted[i < skip ? i : i + 1]; };
  return n % 2 == 1 ? at(n / 2) : 0.5 * (at(n / 2 - 1) + at(n / 2));
}

// The first `max_bytes` bytes of `text`, or fewer: cut before a UTF-8
// continuation byte, so that the result stays valid UTF-8 (as a proto3
// string must) when `text` is.
absl::string_view CutAtUtf8Boundary(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return text.substr(0, cut);
}

// Ranks for a message: "0, 1, 2", at most 64 of them, then " and N more"
// (a message naming every rank of a large job would be megabytes).
std::string RankListText(std::vector<int> ranks) {
  constexpr size_t kListed = 64;
  const size_t n = ranks.size();
  if (n > kListed) ranks.resize(kListed);
  return absl::StrCat(
      absl::StrJoin(ranks, ", "),
      n > kListed ? absl::StrCat(" and ", n - kListed, " more") : "");
}

// InvalidArgument when `report` has more than kMaxReportOps operations.
absl::Status CheckReportOps(const v1::StepReport& report) {
  if (report.ops_size() <= CoordinatorService::kMaxReportOps) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", report.rank(), "'s report of step ", report.step(),
                   " has ", report.ops_size(), " ops; at most ",
                   CoordinatorService::kMaxReportOps, " are accepted"));
}

}  // namespace

CoordinatorService::CoordinatorService(Options options)
    : options_(std::move(options)),
      kv_(options_.kv_limits),
      world_size_(options_.world_size) {}

CoordinatorService::~CoordinatorService() { Shutdown(); }

void CoordinatorService::Log(absl::string_view line) const {
  if (options_.log) options_.log(line);
}

void CoordinatorService::NoteJobStateLocked() {
  const v1::JobState state = JobStateLocked();
  if (state == logged_state_ && generation_ == logged_generation_) return;
  if (options_.log) {
    Log(absl::StrCat("event=job_state job=", LogValue(options_.job_id),
                     " generation=", generation_,
                     " from=", WireName(logged_state_), " to=", WireName(state),
                     " ranks_joined=", ranks_.size(),
                     " world_size=", world_size_));
  }
  logged_state_ = state;
  logged_generation_ = generation_;
  if (options_.observer != nullptr) {
    options_.observer->OnJobState(logged_state_, generation_);
  }
}

absl::Status CoordinatorService::CheckJobId(const std::string& job_id) const {
  if (job_id.empty() || job_id == options_.job_id) return absl::OkStatus();
  if (options_.log) {
    Log(absl::StrCat("event=rejected reason=job_id request_job=",
                     LogValue(job_id), " job=", LogValue(options_.job_id)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "request is for job \"", job_id, "\" but this coordinator serves job \"",
      options_.job_id, "\""));
}

v1::JobState CoordinatorService::JobStateLocked() const {
  switch (state_) {
    case Phase::kWaiting:
      return v1::JOB_STATE_WAITING;
    case Phase::kFailed:
      return v1::JOB_STATE_FAILED;
    case Phase::kPlanned:
      break;
  }
  if (!run_error_.empty()) return v1::JOB_STATE_FAILED;
  // O(1): heartbeats ask for it (counters kept by Heartbeat and ReportStep).
  if (finished_count_ == world_size_) return v1::JOB_STATE_FINISHED;
  return reported_count_ > 0 ? v1::JOB_STATE_RUNNING : v1::JOB_STATE_PLANNED;
}

int64_t CoordinatorService::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

bool CoordinatorService::GenerationOverLocked(absl::Time now) const {
  if (ranks_.empty()) {
    return kv_.size() > 0 &&
           now - last_key_activity_ > options_.heartbeat_timeout;
  }
  for (const auto& [rank, info] : ranks_) {
    const bool gone = info.joins_in_flight == 0 &&
                      now - info.last_seen > options_.heartbeat_timeout;
    if (!info.finished && !gone) return false;
  }
  return true;
}

void CoordinatorService::MaybeStartGenerationLocked(absl::Time now) {
  if (!GenerationOverLocked(now)) return;
  ++generation_;
  world_size_ = options_.world_size;
  state_ = Phase::kWaiting;
  error_ = absl::OkStatus();
  run_error_.clear();
  failed_rank_ = -1;
  // in_process_ranks_ stays: the rank that shares this process noted it
  // before the Join that started this generation.
  plan_.Clear();
  rank_plan_.Clear();
  layout_ = JobLayout();
  replans_.clear();
  ranks_.clear();
  rank_index_.clear();
  finished_count_ = 0;
  reported_count_ = 0;
  kv_.Clear();
  NoteJobStateLocked();
}

void CoordinatorService::NoteKeyActivity() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  MaybeStartGenerationLocked(now);
  last_key_activity_ = now;
}

std::string CoordinatorService::MissingRanksLocked() const {
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    if (ranks_.find(r) == ranks_.end()) missing.push_back(r);
  }
  return absl::StrCat("[", RankListText(std::move(missing)), "]");
}

void CoordinatorService::FailLocked(absl::Status status) {
  state_ = Phase::kFailed;
  error_ = std::move(status);
  NoteJobStateLocked();
}

void CoordinatorService::PlanLocked(Completions* completions) {
  absl::StatusOr<std::optional<JobPlan>> job = PlanJoinedLocked(completions);
  if (job.ok() && !job->has_value()) return;  // ranks asked to resend
  if (!job.ok()) {
    if (options_.log) {
      Log(absl::StrCat("event=plan_failed job=", LogValue(options_.job_id),
                       " generation=", generation_, " world_size=", world_size_,
                       " code=", absl::StatusCodeToString(job.status().code()),
                       " error=", LogValue(job.status().message())));
    }
    FailLocked(job.status());
    CompleteJoinsLocked(completions);
    return;
  }
  std::optional<JobPlan>& planned = *job;
  plan_ = std::move(planned->plan);
  rank_plan_ = PlanForRank(plan_, /*rank=*/-1);  // no rank's schedule
  layout_ = std::move(planned->layout);
  replans_.clear();
  state_ = Phase::kPlanned;
  if (options_.log) {
    int compact = 0;
    for (const auto& [rank, info] : ranks_) compact += info.compact ? 1 : 0;
    Log(absl::StrCat(
        "event=plan job=", LogValue(options_.job_id),
        " generation=", generation_, " hash=", LogValue(plan_.hash()),
        " version=", plan_.version(), " matrices=", plan_.matrices_size(),
        " ranks=", world_size_, " compact_manifests=", compact, " policy=",
        LogValue(plan_.policy()), " max_load_flops=", plan_.max_load_flops()));
  }
  if (options_.observer != nullptr) {
    options_.observer->OnPlan(plan_.version(), plan_.hash());
  }
  NoteJobStateLocked();
  CompleteJoinsLocked(completions);
  const absl::Time now = options_.now();
  for (auto& [rank, info] : ranks_) info.last_seen = now;
}

absl::StatusOr<bool> CoordinatorService::FollowsRank0Locked(
    std::vector<int>* resend) const {
  const RankInfo& info0 = ranks_.at(0);
  if (info0.compact) {
    return absl::InvalidArgumentError(
        "rank 0 sent a compact manifest; rank 0 must send its full manifest "
        "(it defines the job's layout)");
  }
  const v1::RankManifest& m0 = info0.manifest;
  if (!CheckManifestFollowsLayout(m0).ok()) {
    // No shared layout (pipeline stages, requested owners, ...): every
    // compact rank sends its full manifest and the full checks run.
    for (const auto& [rank, info] : ranks_) {
      if (info.compact) resend->push_back(rank);
    }
    return false;
  }
  const std::string h0 = ManifestLayoutHash(m0);
  const Mesh mesh = MeshFromProto(m0.mesh());
  bool follows = true;
  for (const auto& [rank, info] : ranks_) {
    if (rank == 0) continue;
    if (info.compact) {
      const std::vector<int> want = mesh.Coord(rank);
      const auto& got = info.compact_manifest.coord();
      if (!std::equal(want.begin(), want.end(), got.begin(), got.end())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, " reports mesh coordinate (",
            absl::StrJoin(got, ", "), ") but rank ", rank, " of mesh ",
            mesh.ToString(), " is at (", absl::StrJoin(want, ", "), ")"));
      }
      if (info.compact_manifest.layout_hash() != h0) resend->push_back(rank);
      continue;
    }
    if (ManifestLayoutHash(info.manifest) != h0) {
      MUON_RETURN_IF_ERROR(DiagnoseLayoutMismatch(m0, info.manifest));
      follows = false;  // a difference the diagnosis does not name
    } else if (!CheckManifestFollowsLayout(info.manifest).ok()) {
      follows = false;  // its local shapes: the full checks name them
    }
  }
  return follows;
}

absl::StatusOr<std::optional<JobPlan>> CoordinatorService::PlanJoinedLocked(
    Completions* completions) {
  bool any_compact = false;
  for (const auto& [rank, info] : ranks_) any_compact |= info.compact;
  std::vector<int> resend;
  bool follows = false;
  if (any_compact) {
    MUON_ASSIGN_OR_RETURN(follows, FollowsRank0Locked(&resend));
  }
  if (!resend.empty()) {
    v1::JoinResponse again;
    again.set_send_full_manifest(true);
    for (int rank : resend) {
      ranks_.erase(rank);
      rank_index_[rank] = nullptr;
    }
    for (auto it = join_waiters_.begin(); it != join_waiters_.end();) {
      if (ranks_.count(it->second.rank)) {
        ++it;
        continue;
      }
      completions->push_back(
          [done = std::move(it->second.done), again] { done(again); });
      join_waiters_.erase(it++);
    }
    return std::optional<JobPlan>();
  }
  if (follows) {
    // Every rank follows rank 0's layout: plan it without any per-rank
    // manifest (O(matrices + ranks)).
    MUON_ASSIGN_OR_RETURN(JobLayout layout,
                          LayoutFromSpec(JobSpecFromManifest(
                              ranks_.at(0).manifest, options_.job_id)));
    MUON_ASSIGN_OR_RETURN(
        JobPlan job,
        PlanLayout(std::move(layout), options_.job_id, options_.plan_defaults));
    return std::optional<JobPlan>(std::move(job));
  }
  std::vector<v1::RankManifest> manifests;
  manifests.reserve(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    const RankInfo& info = ranks_[r];
    if (!info.compact) {
      manifests.push_back(info.manifest);
      continue;
    }
    MUON_ASSIGN_OR_RETURN(v1::RankManifest m,
                          ManifestForRank(ranks_.at(0).manifest, r));
    manifests.push_back(std::move(m));
  }
  MUON_ASSIGN_OR_RETURN(
      JobPlan job, PlanJob(manifests, options_.job_id, options_.plan_defaults));
  return std::optional<JobPlan>(std::move(job));
}

void CoordinatorService::CompleteJoinsLocked(Completions* completions) {
  const absl::Time now = options_.now();
  for (auto& [id, waiter] : join_waiters_) {
    auto it = ranks_.find(waiter.rank);
    if (it != ranks_.end()) {
      --it->second.joins_in_flight;
      it->second.last_seen = now;
    }
    absl::StatusOr<v1::JoinResponse> result =
        shutdown_ ? absl::UnavailableError("coordinator is shutting down")
        : state_ == Phase::kPlanned
            ? absl::StatusOr<v1::JoinResponse>(JoinResponseLocked())
            : absl::StatusOr<v1::JoinResponse>(error_);
    completions->push_back(
        [done = std::move(waiter.done), result = std::move(result)]() mutable {
          done(std::move(result));
        });
  }
  join_waiters_.clear();
}

void CoordinatorService::ExpireJoin(uint64_t id) {
  JoinCallback done;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    auto w = join_waiters_.find(id);
    if (w == join_waiters_.end()) return;  // completed already
    const int rank = w->second.rank;
    done = std::move(w->second.done);
    error = absl::DeadlineExceededError(
        absl::StrCat("rank ", rank, " timed out after ",
                     absl::FormatDuration(w->second.timeout),
                     " waiting for ranks ", MissingRanksLocked(), " to join (",
                     ranks_.size(), " of ", world_size_, " joined)"));
    join_waiters_.erase(w);
    auto it = ranks_.find(rank);
    if (it != ranks_.end()) {
      --it->second.joins_in_flight;
      it->second.last_seen = options_.now();
    }
    if (options_.log) {
      Log(absl::StrCat("event=join_timeout rank=", rank,
                       " missing=", LogValue(MissingRanksLocked()),
                       " joined=", ranks_.size(), " world_size=", world_size_,
                       " error=", LogValue(error.message())));
    }
  }
  done(error);
}

absl::StatusOr<v1::JoinResponse> CoordinatorService::Join(
    const v1::JoinRequest& request) {
  absl::Notification finished;
  absl::StatusOr<v1::JoinResponse> result;
  JoinAsync(request, [&](absl::StatusOr<v1::JoinResponse> r) {
    result = std::move(r);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

void CoordinatorService::JoinAsync(const v1::JoinRequest& request,
                                   JoinCallback done) {
  absl::Status bad_job = CheckJobId(request.job_id());
  if (!bad_job.ok()) {
    done(bad_job);
    return;
  }
  Completions completions;
  bool waiting = false;
  absl::StatusOr<v1::JoinResponse> result;
  {
    absl::MutexLock lock(&mu_);
    result = JoinLocked(request, done, &waiting, &completions);
    if (!waiting && !result.ok() && options_.log) {
      const bool compact = !request.has_manifest() && request.has_compact();
      Log(absl::StrCat(
          "event=join_rejected rank=",
          compact ? request.compact().rank() : request.manifest().rank(),
          " incarnation=", request.incarnation(),
          " code=", absl::StatusCodeToString(result.status().code()),
          " error=", LogValue(result.status().message())));
    }
  }
  for (auto& complete : completions) complete();
  if (!waiting) done(std::move(result));
}

namespace {

// The rank a Join names (its compact or full manifest's).
int JoinRank(const v1::JoinRequest& request) {
  return !request.has_manifest() && request.has_compact()
             ? request.compact().rank()
             : request.manifest().rank();
}

// Collects the results of one HostJoin's entries and calls `done` once:
// at the first error (naming the host) or the first response that asks for
// full manifests, at once, since the host must act on it before the other
// entries can finish (their later results are then dropped; a rejoin with
// the same incarnations replaces their waits); else with the shared
// response once every entry has one.
class HostJoinResults {
 public:
  HostJoinResults(std::string host, int entries,
                  CoordinatorService::JoinCallback done)
      : host_(std::move(host)), left_(entries), done_(std::move(done)) {}

  void Add(absl::StatusOr<v1::JoinResponse> result) {
    CoordinatorService::JoinCallback done;
    {
      absl::MutexLock lock(&mu_);
      if (!done_) return;  // already answered
      const bool now = !result.ok() || result->send_full_manifest();
      if (!now && --left_ > 0) return;
      done = std::move(done_);
      done_ = nullptr;
    }
    if (!result.ok()) {
      done(absl::Status(result.status().code(),
                        absl::StrCat("HostJoin from ", host_, ": ",
                                     result.status().message())));
      return;
    }
    done(std::move(result));
  }

 private:
  const std::string host_;
  absl::Mutex mu_;
  int left_ ABSL_GUARDED_BY(mu_);
  CoordinatorService::JoinCallback done_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void CoordinatorService::HostJoinAsync(const v1::HostJoinRequest& request,
                                       JoinCallback done) {
  const std::string host = absl::StrCat(
      "host \"", LogValue(CutAtUtf8Boundary(request.host(), kMaxHostNameBytes)),
      "\"");
  absl::Status bad = CheckJobId(request.job_id());
  if (bad.ok() && request.host().size() > kMaxHostNameBytes) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("HostJoin: the host name is ", request.host().size(),
                     " bytes; at most ", kMaxHostNameBytes));
  }
  if (bad.ok() &&
      (request.ranks_size() < 1 || request.ranks_size() > kMaxHostRanks)) {
    bad = absl::InvalidArgumentError(
        absl::StrCat("HostJoin: ", host, " lists ", request.ranks_size(),
                     " ranks; must be in [1, ", kMaxHostRanks, "]"));
  }
  absl::flat_hash_set<int> seen;
  for (const v1::JoinRequest& join : request.ranks()) {
    if (!bad.ok()) break;
    if (!join.job_id().empty()) bad = CheckJobId(join.job_id());
    if (bad.ok() && !seen.insert(JoinRank(join)).second) {
      bad = absl::InvalidArgumentError(absl::StrCat(
          "HostJoin: ", host, " lists rank ", JoinRank(join), " twice"));
    }
  }
  if (!bad.ok()) {
    done(bad);
    return;
  }
  auto results = std::make_shared<HostJoinResults>(host, request.ranks_size(),
                                                   std::move(done));
  for (const v1::JoinRequest& join : request.ranks()) {
    v1::JoinRequest entry = join;
    entry.set_job_id(request.job_id());
    JoinAsync(entry, [results](absl::StatusOr<v1::JoinResponse> result) {
      results->Add(std::move(result));
    });
  }
}

absl::Status CoordinatorService::FailedJoinLocked(
    const v1::JoinRequest& request, int rank, Completions* completions) {
  const bool compact = !request.has_manifest() && request.has_compact();
  MUON_RETURN_IF_ERROR(
      CheckJoinLocked(rank, compact ? request.compact().world_size()
                                    : request.manifest().world_size()));
  const absl::string_view error =
      CutAtUtf8Boundary(request.error(), kMaxErrorBytes);
  const absl::Status status = absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, " could not create its optimizer: ", error));
  if (options_.log) {
    Log(absl::StrCat("event=join_failed_rank rank=", rank,
                     " error=", LogValue(status.message())));
  }
  // A planned job's ranks wait in no Join (a rank that joins again gets
  // the plan at once): nothing to release, and the running job goes on.
  if (state_ == Phase::kPlanned) return status;
  // The rank counts as seen now, so that the failed generation ends once
  // every rank it knows has been silent for heartbeat_timeout.
  RankEntryLocked(rank, request.incarnation(), options_.now());
  FailLocked(status);
  CompleteJoinsLocked(completions);
  return status;
}

absl::Status CoordinatorService::CheckJoinLocked(int rank, int64_t world) {
  if (world < 1 || world > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " reports world size ", world,
                     "; must be in [1, ", kMaxWorldSize, "]"));
  }
  if (world_size_ != 0 && world != world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " reports world size ", world,
                     " but the job's world size is ", world_size_,
                     options_.world_size > 0 ? " (set on the coordinator)"
                                             : " (from the first rank to join)",
                     "; this Join is rejected, the job goes on"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("a rank joined as rank ", rank,
                     " but ranks must be in "
                     "[0, ",
                     world, "); this Join is rejected"));
  }
  if (world_size_ == 0) world_size_ = static_cast<int>(world);
  return absl::OkStatus();
}

absl::StatusOr<v1::JoinResponse> CoordinatorService::JoinLocked(
    const v1::JoinRequest& request, JoinCallback& done, bool* waiting,
    Completions* completions) {
  const bool compact = !request.has_manifest() && request.has_compact();
  const int rank =
      compact ? request.compact().rank() : request.manifest().rank();
  if (shutdown_) return absl::UnavailableError("coordinator is shutting down");
  const absl::Time now = options_.now();
  MaybeStartGenerationLocked(now);

  auto it = ranks_.find(rank);
  if (it != ranks_.end() && it->second.incarnation != request.incarnation()) {
    return absl::AbortedError(absl::StrCat(
        "rank ", rank, " of job \"", options_.job_id, "\" (generation ",
        generation_, ", ", WireName(JobStateLocked()),
        ") is held by incarnation ", it->second.incarnation,
        "; this join has incarnation ", request.incarnation(),
        ": a second job or a restarted rank is rejected until the running "
        "job ends (restart the whole job)"));
  }
  if (state_ == Phase::kFailed) return error_;
  if (!request.error().empty()) {
    return FailedJoinLocked(request, rank, completions);
  }
  if (state_ == Phase::kPlanned) {
    if (it == ranks_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " joined after the job was planned with ",
                       world_size_, " ranks"));
    }
    return RejoinPlannedLocked(request, rank, now, it->second);
  }
  MUON_RETURN_IF_ERROR(
      CheckJoinLocked(rank, compact ? request.compact().world_size()
                                    : request.manifest().world_size()));
  if (join_waiters_.size() >= options_.max_waiting_joins) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Join: ", join_waiters_.size(), " calls already wait; the limit is ",
        options_.max_waiting_joins));
  }

  RecordJoinLocked(request, rank, now);
  const absl::Duration timeout = std::min(
      request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                               : options_.default_join_timeout,
      options_.max_join_timeout);
  const uint64_t id = next_join_waiter_++;
  join_waiters_.emplace(id, JoinWaiter{rank, timeout, std::move(done)});
  *waiting = true;
  // Every waiter gets its deadline, the one completing the world too:
  // planning may ask compact ranks for their full manifests and remove
  // them, and this waiter then waits for them like the others (ExpireJoin
  // ignores a waiter completed already).
  timer_.Schedule(absl::Now() + timeout, [this, id] { ExpireJoin(id); });
  if (static_cast<int>(ranks_.size()) == world_size_) PlanLocked(completions);
  return v1::JoinResponse();  // unused: the waiter is completed later
}

// A Join of a rank that is already part of the plan: accepts it again when
// its layout hash matches its first join's, else FailedPrecondition.
absl::StatusOr<v1::JoinResponse> CoordinatorService::RejoinPlannedLocked(
    const v1::JoinRequest& request, int rank, absl::Time now, RankInfo& info) {
  const bool compact = !request.has_manifest() && request.has_compact();
  // An idempotent retry of a rank that is already part of the plan (or
  // a new optimizer of a rank that left): it is back, with the same
  // layout and options (the plan was made for them).
  const std::string before = info.compact ? info.compact_manifest.layout_hash()
                                          : ManifestLayoutHash(info.manifest);
  const std::string again = compact ? request.compact().layout_hash()
                                    : ManifestLayoutHash(request.manifest());
  if (before != again) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, " joined job \"", options_.job_id,
        "\" again after it was planned, with another manifest (its "
        "parameters, placements or optimizer and execution options differ "
        "from its first join): the job's plan is not for it; a second "
        "optimizer with other settings needs a job of its own (another "
        "job id or process group)"));
  }
  info.last_seen = now;
  if (info.finished) --finished_count_;
  info.finished = false;
  NoteJobStateLocked();
  return JoinResponseLocked();
}

CoordinatorService::RankInfo& CoordinatorService::RankEntryLocked(
    int rank, uint64_t incarnation, absl::Time now) {
  RankInfo& info = ranks_[rank];
  if (static_cast<size_t>(rank) >= rank_index_.size()) {
    rank_index_.resize(rank + 1, nullptr);
  }
  rank_index_[rank] = &info;
  info.incarnation = incarnation;
  info.last_seen = now;
  return info;
}

// Stores the joining rank's incarnation and manifest in ranks_ (and
// rank_index_), counts its Join in flight and logs "event=join".
void CoordinatorService::RecordJoinLocked(const v1::JoinRequest& request,
                                          int rank, absl::Time now) {
  const bool compact = !request.has_manifest() && request.has_compact();
  RankInfo& info = RankEntryLocked(rank, request.incarnation(), now);
  info.compact = compact;
  if (compact) {
    info.compact_manifest = request.compact();
    info.manifest.Clear();
  } else {
    info.manifest = request.manifest();
  }
  ++info.joins_in_flight;
  if (options_.log) {
    Log(absl::StrCat("event=join rank=", rank, " world_size=", world_size_,
                     " manifest=", compact ? "compact" : "full",
                     " incarnation=", request.incarnation(),
                     " joined=", ranks_.size(), " generation=", generation_));
  }
}

void CoordinatorService::NoteInProcessRank(int rank) {
  absl::MutexLock lock(&mu_);
  if (std::find(in_process_ranks_.begin(), in_process_ranks_.end(), rank) ==
      in_process_ranks_.end()) {
    in_process_ranks_.push_back(rank);
  }
}

v1::JoinResponse CoordinatorService::JoinResponseLocked() const {
  v1::JoinResponse response;
  // PlanForRank(plan_, rank): O(matrices) per rank, not O(ranks); the
  // plan's schedule is compact, each rank derives its own operations
  // (GetPlan serves the whole plan, with the loads).
  *response.mutable_plan() = rank_plan_;
  response.set_heartbeat_timeout_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  if (in_process_ranks_.size() == 1) {
    response.set_coordinator_in_rank(true);
    response.set_coordinator_rank(in_process_ranks_[0]);
  }
  return response;
}

absl::StatusOr<CoordinatorService::RankInfo*>
CoordinatorService::FindRankLocked(int rank, uint64_t incarnation) {
  RankInfo* info = rank >= 0 && static_cast<size_t>(rank) < rank_index_.size()
                       ? rank_index_[rank]
                       : nullptr;
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("rank ", rank, " has not joined the job"));
  }
  if (info->incarnation != incarnation) {
    return absl::AbortedError(
        absl::StrCat("rank ", rank, " is incarnation ", info->incarnation,
                     " but the request comes from incarnation ", incarnation,
                     " (a stale or restarted process)"));
  }
  return info;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorService::Heartbeat(
    const v1::HeartbeatRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  MUON_ASSIGN_OR_RETURN(RankInfo * info,
                        FindRankLocked(request.rank(), request.incarnation()));
  const absl::Time now = options_.now();
  ApplyHeartbeatLocked(request, now, info);
  return HeartbeatResponseLocked(now);
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorService::HostHeartbeat(
    const v1::HostHeartbeatRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  // Built only for an error: a heartbeat's path allocates nothing of it.
  const auto host = [&request] {
    return absl::StrCat("host \"", LogValue(request.host()), "\"");
  };
  if (request.host().size() > kMaxHostNameBytes) {
    // Kept in each listed rank's entry: bounded before it is copied.
    return absl::InvalidArgumentError(
        absl::StrCat("HostHeartbeat: the host name is ", request.host().size(),
                     " bytes; at most ", kMaxHostNameBytes));
  }
  if (request.ranks_size() > kMaxHostRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostHeartbeat: ", host(), " lists ", request.ranks_size(),
                     " ranks; at most ", kMaxHostRanks));
  }
  absl::MutexLock lock(&mu_);
  absl::InlinedVector<RankInfo*, 16> infos;
  for (const v1::HeartbeatRequest& beat : request.ranks()) {
    if (!beat.job_id().empty()) MUON_RETURN_IF_ERROR(CheckJobId(beat.job_id()));
    absl::StatusOr<RankInfo*> info =
        FindRankLocked(beat.rank(), beat.incarnation());
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("HostHeartbeat from ", host(), ": ",
                                       info.status().message()));
    }
    infos.push_back(*info);
  }
  // A rank listed twice is the same RankInfo twice.
  absl::InlinedVector<RankInfo*, 16> sorted = infos;
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    const size_t i =
        std::find(infos.begin(), infos.end(), *twice) - infos.begin();
    return absl::InvalidArgumentError(
        absl::StrCat("HostHeartbeat: ", host(), " lists rank ",
                     request.ranks(static_cast<int>(i)).rank(), " twice"));
  }
  const absl::Time now = options_.now();
  for (int i = 0; i < request.ranks_size(); ++i) {
    if (infos[i]->host != request.host()) infos[i]->host = request.host();
    ApplyHeartbeatLocked(request.ranks(i), now, infos[i]);
  }
  return HeartbeatResponseLocked(now);
}

void CoordinatorService::ApplyHeartbeatLocked(
    const v1::HeartbeatRequest& request, absl::Time now, RankInfo* info) {
  info->last_seen = now;
  if (request.leaving() && !info->finished) {
    info->finished = true;
    ++finished_count_;
    if (options_.log) {
      Log(absl::StrCat("event=rank_finished rank=", request.rank(),
                       " finished=", finished_count_,
                       " world_size=", world_size_));
    }
  }
  if (!request.error().empty() && state_ == Phase::kPlanned) {
    // Kept as the job error and sent with every heartbeat response: cut.
    const absl::string_view error =
        CutAtUtf8Boundary(request.error(), kMaxErrorBytes);
    if (!info->failure_logged && options_.log) {
      info->failure_logged = true;
      Log(absl::StrCat("event=rank_failed rank=", request.rank(),
                       " error=", LogValue(error)));
    }
    FailRankLocked(request.rank(),
                   absl::StrCat("rank ", request.rank(), " failed: ", error));
  }
}

v1::HeartbeatResponse CoordinatorService::HeartbeatResponseLocked(
    absl::Time now) {
  CheckLostLocked(now);
  NoteJobStateLocked();
  v1::HeartbeatResponse response;
  response.set_job_state(JobStateLocked());
  if (!run_error_.empty()) {
    response.set_job_error(run_error_);
    response.set_failed_rank(failed_rank_);
  }
  return response;
}

void CoordinatorService::FailRankLocked(int rank, std::string message) {
  if (!run_error_.empty()) return;  // the first failure wins
  run_error_ = std::move(message);
  failed_rank_ = rank;
}

void CoordinatorService::CheckLostLocked(absl::Time now) {
  if (state_ != Phase::kPlanned || !run_error_.empty()) return;
  // A scan of every rank, at most every tenth of the heartbeat timeout (and
  // 1 s): heartbeats of a large job then cost O(1) amortized, and a lost
  // rank is still named within 1.1 heartbeat timeouts of its last sign.
  const absl::Duration every =
      std::min(options_.heartbeat_timeout / 10, absl::Seconds(1));
  if (now >= last_lost_check_ && now - last_lost_check_ < every) return;
  last_lost_check_ = now;
  const RankInfo* silent = nullptr;
  int silent_rank = -1;
  // Over the index, not the tree: the entries' addresses are known up
  // front, so their cache misses overlap (131,072 ranks: 5 ms, against
  // 21 ms walking the std::map, during which heartbeats wait for mu_).
  for (size_t rank = 0; rank < rank_index_.size(); ++rank) {
    const RankInfo* info = rank_index_[rank];
    if (info == nullptr || info->finished || info->joins_in_flight > 0) {
      continue;
    }
    if (now - info->last_seen <= options_.heartbeat_timeout) continue;
    if (silent == nullptr || info->last_seen < silent->last_seen) {
      silent = info;
      silent_rank = static_cast<int>(rank);
    }
  }
  if (silent == nullptr) return;
  // The ranks of a host agent are heard through it: its heartbeat lists
  // them at once, but one may have dropped out of the last few (the agent
  // had not heard from it) or been refreshed by a later ReportSteps. A host
  // whose freshest rank is silent for over half the timeout (the agent
  // beats every fifth of it) is either dead or late: wait until that is
  // settled (at most half a timeout) rather than name one rank of a dead
  // host alone.
  std::vector<int> host_ranks;
  absl::Time host_last_seen = silent->last_seen;
  if (!silent->host.empty()) {
    host_ranks = HostRanksLocked(silent->host, &host_last_seen);
  }
  const absl::Duration host_silence = now - host_last_seen;
  const bool host_lost =
      host_ranks.size() >= 2 && host_silence > options_.heartbeat_timeout;
  if (host_ranks.size() >= 2 && !host_lost &&
      host_silence > options_.heartbeat_timeout / 2) {
    return;
  }
  if (options_.log) {
    Log(absl::StrFormat(
        "event=rank_lost rank=%d silent_s=%.3f heartbeat_timeout_s=%.3f "
        "last_step=%d",
        silent_rank, absl::ToDoubleSeconds(now - silent->last_seen),
        absl::ToDoubleSeconds(options_.heartbeat_timeout),
        silent->reported ? silent->last_report.step() : -1));
  }
  if (!host_lost) host_ranks.clear();
  FailRankLocked(silent_rank, LostMessage(silent_rank, *silent, host_ranks,
                                          now - silent->last_seen));
  NoteJobStateLocked();
}

std::vector<int> CoordinatorService::HostRanksLocked(
    const std::string& host, absl::Time* last_seen) const {
  std::vector<int> host_ranks;
  for (size_t rank = 0; rank < rank_index_.size(); ++rank) {
    const RankInfo* other = rank_index_[rank];
    if (other == nullptr || other->finished || other->host != host) continue;
    host_ranks.push_back(static_cast<int>(rank));
    *last_seen = std::max(*last_seen, other->last_seen);
  }
  return host_ranks;
}

std::string CoordinatorService::LostMessage(int rank, const RankInfo& info,
                                            std::vector<int> host_ranks,
                                            absl::Duration silence) const {
  const std::string why =
      absl::StrFormat("no heartbeat for %.2f s (heartbeat timeout %.2f s)",
                      absl::ToDoubleSeconds(silence),
                      absl::ToDoubleSeconds(options_.heartbeat_timeout));
  if (host_ranks.empty()) return absl::StrCat("rank ", rank, " lost: ", why);
  return absl::StrCat("ranks ", RankListText(std::move(host_ranks)),
                      " of host \"", absl::CEscape(info.host),
                      "\" lost: ", why);
}

absl::StatusOr<v1::ReportStepResponse> CoordinatorService::ReportStep(
    const v1::StepReport& report) {
  MUON_RETURN_IF_ERROR(CheckJobId(report.job_id()));
  MUON_RETURN_IF_ERROR(CheckReportOps(report));
  {
    absl::MutexLock lock(&mu_);
    MUON_ASSIGN_OR_RETURN(RankInfo * info,
                          FindRankLocked(report.rank(), report.incarnation()));
    MUON_RETURN_IF_ERROR(PlanReadyLocked());
    const absl::Time now = options_.now();
    ApplyReportLocked(report, now, info);
    CheckLostLocked(now);
    NoteJobStateLocked();
  }
  if (options_.observer != nullptr) options_.observer->OnStepReport(report);
  return v1::ReportStepResponse();
}

absl::StatusOr<v1::ReportStepResponse> CoordinatorService::ReportSteps(
    const v1::StepReports& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  if (request.reports_size() > kMaxHostRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReportSteps: ", request.reports_size(),
                     " reports in one call; at most ", kMaxHostRanks));
  }
  for (const v1::StepReport& report : request.reports()) {
    MUON_RETURN_IF_ERROR(CheckReportOps(report));
  }
  {
    absl::MutexLock lock(&mu_);
    std::vector<RankInfo*> infos;
    for (const v1::StepReport& report : request.reports()) {
      if (!report.job_id().empty()) {
        MUON_RETURN_IF_ERROR(CheckJobId(report.job_id()));
      }
      MUON_ASSIGN_OR_RETURN(
          RankInfo * info, FindRankLocked(report.rank(), report.incarnation()));
      infos.push_back(info);
    }
    MUON_RETURN_IF_ERROR(PlanReadyLocked());
    const absl::Time now = options_.now();
    for (int i = 0; i < request.reports_size(); ++i) {
      ApplyReportLocked(request.reports(i), now, infos[i]);
    }
    // After the whole batch: none of its ranks counts as silent.
    CheckLostLocked(now);
    NoteJobStateLocked();
  }
  if (options_.observer != nullptr) {
    for (const v1::StepReport& report : request.reports()) {
      options_.observer->OnStepReport(report);
    }
  }
  return v1::ReportStepResponse();
}

void CoordinatorService::ApplyReportLocked(const v1::StepReport& report,
                                           absl::Time now, RankInfo* info) {
  info->last_seen = now;
  if (!info->reported) ++reported_count_;
  info->reported = true;
  info->last_report = report;
  info->last_report_at = now;
  KeepReportLocked(*info, report);
}

void CoordinatorService::KeepReportLocked(RankInfo& info,
                                          const v1::StepReport& report) {
  const size_t capacity =
      static_cast<size_t>(std::max(1, options_.reports_kept));
  if (info.reports.size() < capacity) {
    info.reports.push_back(report);
    return;
  }
  info.reports[info.next_report] = report;
  info.next_report = (info.next_report + 1) % capacity;
}

absl::StatusOr<v1::GetReportsResponse> CoordinatorService::GetReports(
    const v1::GetReportsRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  if (request.rank() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetReports: rank is ", request.rank(),
                     "; must be >= 0 or -1 (every rank)"));
  }
  if (request.last_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetReports: last_steps is ", request.last_steps(),
                     "; must be >= 0 (0 = every kept step)"));
  }
  absl::MutexLock lock(&mu_);
  if (request.rank() >= 0 && ranks_.find(request.rank()) == ranks_.end()) {
    return absl::NotFoundError(
        absl::StrCat("rank ", request.rank(), " has not joined the job"));
  }
  v1::GetReportsResponse response;
  // The response's size as it grows (ByteSizeLong of the whole response
  // at each report would be quadratic): each report's own size plus its
  // field tag and length prefix (at most 1 + 5 bytes).
  size_t bytes = 0;
  for (const auto& [rank, info] : ranks_) {
    if (request.rank() >= 0 && rank != request.rank()) continue;
    for (const v1::StepReport* report :
         KeptReportsLocked(info, request.last_steps())) {
      bytes += report->ByteSizeLong() + 6;
      if (bytes > options_.max_response_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "GetReports: the kept reports exceed the coordinator's largest "
            "response (",
            options_.max_response_bytes, " bytes) at rank ", rank,
            "'s report of step ", report->step(), " (", response.reports_size(),
            " reports before it); ask for fewer ",
            "steps per rank (muonctl's --last_steps, now ",
            request.last_steps(), ") or one rank (GetReportsRequest.rank)"));
      }
      *response.add_reports() = *report;
    }
  }
  return response;
}

std::vector<const v1::StepReport*> CoordinatorService::KeptReportsLocked(
    const RankInfo& info, int last_steps) const {
  // Oldest first: the ring from next_report on, then its start.
  std::vector<const v1::StepReport*> kept;
  kept.reserve(info.reports.size());
  for (size_t i = 0; i < info.reports.size(); ++i) {
    kept.push_back(&info.reports[(info.next_report + i) % info.reports.size()]);
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [](const v1::StepReport* a, const v1::StepReport* b) {
                     return a->step() < b->step();
                   });
  if (last_steps > 0 && kept.size() > static_cast<size_t>(last_steps)) {
    kept.erase(kept.begin(), kept.end() - last_steps);
  }
  return kept;
}

std::vector<double> CoordinatorService::SortedStepTimesLocked() const {
  std::vector<double> times;
  for (const auto& [rank, info] : ranks_) {
    if (info.reported) times.push_back(info.last_report.step_time_s());
  }
  std::sort(times.begin(), times.end());
  return times;
}

bool CoordinatorService::IsStragglerLocked(
    const RankInfo& info, const std::vector<double>& sorted_times) const {
  // Needs the rank's own report plus at least 2 others.
  if (!info.reported || sorted_times.size() < 3) return false;
  const double t = info.last_report.step_time_s();
  const size_t self = static_cast<size_t>(
      std::lower_bound(sorted_times.begin(), sorted_times.end(), t) -
      sorted_times.begin());
  const double median = MedianWithout(sorted_times, self);
  return median > 0 && t > options_.straggler_factor * median;
}

int64_t CoordinatorService::HighestStepLocked() const {
  int64_t highest = std::numeric_limits<int64_t>::min();
  for (const auto& [rank, info] : ranks_) {
    if (info.reported) highest = std::max(highest, info.last_report.step());
  }
  return highest;
}

bool CoordinatorService::IsLateLocked(const RankInfo& info, absl::Time now,
                                      const std::vector<double>& sorted_times,
                                      int64_t highest_step) const {
  if (!info.reported || info.finished || sorted_times.size() < 3) return false;
  // Another rank reported a later step exactly when the highest reported
  // step is above this rank's own.
  if (highest_step <= info.last_report.step()) return false;
  const size_t n = sorted_times.size();
  const double median =
      n % 2 == 1 ? sorted_times[n / 2]
                 : 0.5 * (sorted_times[n / 2 - 1] + sorted_times[n / 2]);
  return median > 0 && absl::ToDoubleSeconds(now - info.last_report_at) >
                           options_.straggler_factor * median;
}

absl::Status CoordinatorService::PlanReadyLocked() const {
  switch (state_) {
    case Phase::kPlanned:
      return absl::OkStatus();
    case Phase::kFailed:
      return absl::FailedPreconditionError(
          absl::StrCat("job \"", options_.job_id,
                       "\" has no plan: planning failed: ", error_.message()));
    case Phase::kWaiting:
      break;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job \"", options_.job_id, "\" has no plan yet: ", ranks_.size(), " of ",
      world_size_ > 0 ? absl::StrCat(world_size_) : std::string("?"),
      " ranks joined"));
}

absl::StatusOr<v1::ReplanResponse> CoordinatorService::Replan(
    const v1::ReplanRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  MUON_RETURN_IF_ERROR(CheckReplanLocked(request));
  const int64_t step = request.step();
  v1::ReplanResponse response;
  auto cached = replans_.find(step);
  if (cached != replans_.end()) {
    *response.mutable_plan() = cached->second;
    return response;
  }
  if (!replans_.empty() && step < replans_.begin()->first) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.rank(), " asked to re-plan at step ", step,
        " but the oldest kept re-plan is at step ", replans_.begin()->first));
  }
  std::vector<const std::vector<v1::StepReport>*> reports(world_size_, nullptr);
  for (const auto& [rank, info] : ranks_) {
    if (rank >= 0 && rank < world_size_) reports[rank] = &info.reports;
  }
  const std::vector<double> seconds_per_flop = MeasuredSecondsPerFlop(
      reports, std::max<int64_t>(plan_.first_step(), 1) - 1);
  if (!seconds_per_flop.empty()) {
    MUON_ASSIGN_OR_RETURN(
        PlannerOptions planner,
        PlannerOptionsForJob(layout_, options_.job_id, options_.plan_defaults));
    MUON_ASSIGN_OR_RETURN(
        v1::Plan plan, ReplanWithMeasuredCosts(layout_, std::move(planner),
                                               plan_, seconds_per_flop, step));
    if (plan.hash() != plan_.hash()) {
      plan_ = std::move(plan);
      rank_plan_ = PlanForRank(plan_, /*rank=*/-1);
      if (options_.observer != nullptr) {
        options_.observer->OnPlan(plan_.version(), plan_.hash());
      }
    }
  }
  if (options_.log) {
    Log(absl::StrCat(
        "event=replan job=", LogValue(options_.job_id), " step=", step,
        " hash=", LogValue(plan_.hash()), " version=", plan_.version(),
        " matrices=", plan_.matrices_size(), " ranks=", world_size_,
        " measured=", !seconds_per_flop.empty(), " by_rank=", request.rank()));
  }
  replans_[step] = rank_plan_;
  while (replans_.size() > 4) replans_.erase(replans_.begin());
  *response.mutable_plan() = rank_plan_;
  return response;
}

// Checks that the asking rank is joined, the job has a plan and no run-time
// error, and `request.step()` is a multiple of execution.replan_every_steps.
absl::Status CoordinatorService::CheckReplanLocked(
    const v1::ReplanRequest& request) {
  MUON_RETURN_IF_ERROR(
      FindRankLocked(request.rank(), request.incarnation()).status());
  MUON_RETURN_IF_ERROR(PlanReadyLocked());
  if (!run_error_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", options_.job_id, "\" failed: ", run_error_));
  }
  const int64_t every = layout_.execution.replan_every_steps();
  const int64_t step = request.step();
  if (every <= 0 || step <= 0 || step % every != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", request.rank(), " asked to re-plan at step ",
                     step, " but execution.replan_every_steps is ", every,
                     every > 0 ? absl::StrCat(" (re-plans happen after steps ",
                                              every, ", ", 2 * every, ", ...)")
                               : " (re-planning is off)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::JobInfo> CoordinatorService::GetJob(
    const v1::GetJobRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  CheckLostLocked(options_.now());
  v1::JobInfo info;
  info.set_job_id(options_.job_id);
  info.set_failed_rank(failed_rank_);
  info.set_world_size(world_size_);
  info.set_ranks_joined(static_cast<int>(ranks_.size()));
  info.set_state(JobStateLocked());
  info.set_generation(generation_);
  if (state_ == Phase::kPlanned) info.set_plan_hash(plan_.hash());
  if (state_ == Phase::kFailed) {
    info.set_error(std::string(error_.message()));
  } else if (!run_error_.empty()) {
    info.set_error(run_error_);
  }
  return info;
}

absl::StatusOr<v1::Plan> CoordinatorService::GetPlan(
    const v1::GetPlanRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  MUON_RETURN_IF_ERROR(PlanReadyLocked());
  return plan_;
}

absl::StatusOr<v1::JobSpec> CoordinatorService::GetJobSpec(
    const v1::GetJobSpecRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  MUON_RETURN_IF_ERROR(PlanReadyLocked());
  return JobSpecFromLayout(layout_, plan_.job_id());
}

absl::StatusOr<v1::GetAssignmentsResponse> CoordinatorService::GetAssignments(
    const v1::GetAssignmentsRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  MUON_RETURN_IF_ERROR(PlanReadyLocked());
  v1::GetAssignmentsResponse response;
  for (int r = 0; r < plan_.world_size(); ++r) {
    v1::RankAssignment* a = response.add_ranks();
    a->set_rank(r);
  }
  for (const v1::MatrixPlan& m : plan_.matrices()) {
    v1::RankAssignment* a = response.mutable_ranks(m.owner());
    a->add_matrices(
        m.index() >= 0 && m.index() < static_cast<int>(layout_.matrices.size())
            ? layout_.matrices[m.index()].name
            : m.param());
    a->set_ns_flops(a->ns_flops() + m.ns_flops());
  }
  return response;
}

v1::RankState CoordinatorService::RankStateLocked(const RankInfo& info,
                                                  absl::Time now) const {
  if (state_ == Phase::kFailed) return v1::RANK_STATE_FAILED;
  if (info.finished) return v1::RANK_STATE_FINISHED;
  if (info.joins_in_flight == 0 &&
      now - info.last_seen > options_.heartbeat_timeout) {
    return v1::RANK_STATE_LOST;
  }
  if (state_ == Phase::kWaiting) return v1::RANK_STATE_JOINING;
  return info.reported ? v1::RANK_STATE_RUNNING : v1::RANK_STATE_READY;
}

absl::StatusOr<v1::ListRanksResponse> CoordinatorService::ListRanks(
    const v1::ListRanksRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  CheckLostLocked(now);
  // Once for every rank: O(ranks log ranks) in all, not O(ranks^2).
  const std::vector<double> step_times = SortedStepTimesLocked();
  const int64_t highest_step = HighestStepLocked();
  v1::ListRanksResponse response;
  for (const auto& [rank, info] : ranks_) {
    v1::RankStatus* s = response.add_ranks();
    s->set_rank(rank);
    s->set_state(RankStateLocked(info, now));
    s->set_incarnation(info.incarnation);
    s->set_last_heartbeat_unix_s(UnixSeconds(info.last_seen));
    s->set_last_step(info.reported ? info.last_report.step() : -1);
    s->set_last_step_time_s(info.last_report.step_time_s());
    s->set_matrices_orthogonalized(info.last_report.matrices_orthogonalized());
    s->set_ns_flops(info.last_report.ns_flops());
    s->set_straggler(IsStragglerLocked(info, step_times) ||
                     IsLateLocked(info, now, step_times, highest_step));
    s->set_reports_dropped(info.last_report.reports_dropped());
  }
  return response;
}

std::map<v1::RankState, int> CoordinatorService::RankStateCounts() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.now();
  CheckLostLocked(now);
  std::map<v1::RankState, int> counts;
  for (const auto& [rank, info] : ranks_) ++counts[RankStateLocked(info, now)];
  return counts;
}

absl::StatusOr<v1::KeySetResponse> CoordinatorService::KeySet(
    const v1::KeySetRequest& request) {
  MUON_RETURN_IF_ERROR(CheckJobId(request.job_id()));
  NoteKeyActivity();
  MUON_RETURN_IF_ERROR(kv_.Set(request.key(), request.value()));
  return v1::KeySetResponse();
}

void CoordinatorService::KeyGetAsync(const v1::KeyGetRequest& request,
                                     KeyGetCallback done) {
  absl::Status bad_job = CheckJobId(request.job_id());
  if (!bad_job.ok()) {
    done(bad_job);
    return;
  }
  NoteKeyActivity();
  kv_.GetAsync(request.key(), absl::Milliseconds(request.timeout_ms()),
               [done = std::move(done)](absl::StatusOr<std::string> value) {
                 if (!value.ok()) {
                   done(value.status());
                   return;
                 }
                 v1::KeyGetResponse response;
                 response.set_value(*std::move(value));
                 done(std::move(response));
               });
}

absl::StatusOr<v1::KeyGetResponse> CoordinatorService::KeyGet(
    const v1::KeyGetRequest& request) {
  absl::Notification finished;
  absl::StatusOr<v1::KeyGetResponse> result;
  KeyGetAsync(request, [&](absl::StatusOr<v1::KeyGetResponse> r) {
    result = std::move(r);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

void CoordinatorService::Shutdown() {
  kv_.Shutdown();
  Completions completions;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    CompleteJoinsLocked(&completions);
  }
  timer_.Shutdown();
  for (auto& complete : completions) complete();
}

}  // namespace muon
