#include "control/agent.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "plan/compact_manifest.h"

namespace muon {

Agent::Agent(CoordinationClient* client, int rank, uint64_t incarnation,
             Options options)
    : client_(client),
      rank_(rank),
      incarnation_(incarnation),
      options_(options) {
  const int capacity = std::max(1, options_.report_queue_capacity);
  absl::MutexLock lock(&mu_);
  free_.assign(capacity + 1, nullptr);
  for (int i = 0; i < capacity + 1; ++i) {
    pool_.push_back(std::make_unique<v1::StepReport>());
    PushFreeLocked(pool_.back().get());
  }
  queue_.assign(capacity, nullptr);
}

Agent::~Agent() { Stop(); }

absl::StatusOr<v1::Plan> Agent::Join(const v1::RankManifest& manifest,
                                     int64_t timeout_ms) {
  v1::JoinRequest request;
  request.set_incarnation(incarnation_);
  request.set_timeout_ms(timeout_ms);
  // Rank 0 defines the layout; the others send O(1) bytes when theirs
  // follows from it (plan/compact_manifest.h).
  if (options_.compact_manifest && manifest.rank() != 0 &&
      CheckManifestFollowsLayout(manifest).ok()) {
    *request.mutable_compact() = MakeCompactManifest(manifest);
  } else {
    *request.mutable_manifest() = manifest;
  }
  MUON_ASSIGN_OR_RETURN(v1::JoinResponse response, client_->Join(request));
  if (response.send_full_manifest()) {
    // Our layout differs from rank 0's: the full manifest names how.
    request.clear_compact();
    *request.mutable_manifest() = manifest;
    MUON_ASSIGN_OR_RETURN(response, client_->Join(request));
  }
  absl::MutexLock lock(&mu_);
  if (response.heartbeat_timeout_ms() > 0) {
    heartbeat_timeout_ = absl::Milliseconds(response.heartbeat_timeout_ms());
  }
  coordinator_rank_ =
      response.coordinator_in_rank() ? response.coordinator_rank() : -1;
  interval_ = options_.heartbeat_interval > absl::ZeroDuration()
                  ? options_.heartbeat_interval
                  : std::min(absl::Seconds(1), heartbeat_timeout_ / 5);
  return response.plan();
}

absl::Status Agent::ConfirmPlanHash(const std::string& hash, int world_size,
                                    absl::Duration timeout) {
  MUON_RETURN_IF_ERROR(
      client_->KeySet(absl::StrCat("plan_hash/", rank_), hash));
  // Rank 0's hash and the next rank's (one read when the next is rank 0).
  const int next = (rank_ + 1) % std::max(1, world_size);
  const int peers[] = {0, next};
  for (int i = 0; i < (next == 0 ? 1 : 2); ++i) {
    const int r = peers[i];
    if (r == rank_) continue;
    absl::StatusOr<std::string> other =
        client_->KeyGet(absl::StrCat("plan_hash/", r), timeout);
    if (!other.ok()) {
      return absl::Status(
          other.status().code(),
          absl::StrCat("rank ", rank_, ": waiting for rank ", r,
                       "'s plan hash: ", other.status().message()));
    }
    if (*other != hash) {
      const absl::Status mismatch = absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, " holds plan ", hash, " but rank ", r, " holds plan ",
          *other, "; every rank must run the same plan"));
      // The coordinator makes it the job error: the ranks whose neighbours
      // agree abort too.
      SendReport(std::string(mismatch.message()), /*leaving=*/false);
      return mismatch;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Plan> Agent::Replan(int64_t step) {
  v1::ReplanRequest request;
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  request.set_step(step);
  MUON_ASSIGN_OR_RETURN(v1::ReplanResponse response, client_->Replan(request));
  return std::move(*response.mutable_plan());
}

void Agent::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return;
  started_ = true;
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  report_thread_ = std::thread([this] { ReportLoop(); });
}

void Agent::SetAbortCallback(std::function<void()> abort) {
  bool run_now = false;
  {
    absl::MutexLock lock(&mu_);
    abort_ = abort;
    // The job error came before there was anything to abort: aborted at
    // once, so the first collective fails instead of waiting its timeout.
    run_now = aborted_;
  }
  if (run_now && abort) abort();  // outside mu_, as RunAbortOnce
}

absl::Status Agent::job_error() const {
  absl::MutexLock lock(&mu_);
  if (job_error_.empty()) return absl::OkStatus();
  return absl::AbortedError(job_error_);
}

int Agent::failed_rank() const {
  absl::MutexLock lock(&mu_);
  return failed_rank_;
}

bool Agent::coordinator_unreachable() const {
  absl::MutexLock lock(&mu_);
  return coordinator_lost_;
}

absl::Duration Agent::heartbeat_interval() const {
  absl::MutexLock lock(&mu_);
  return interval_;
}

absl::Duration Agent::heartbeat_timeout() const {
  absl::MutexLock lock(&mu_);
  return heartbeat_timeout_;
}

bool Agent::TakeResponse(const v1::HeartbeatResponse& response) {
  {
    absl::MutexLock lock(&mu_);
    if (response.job_error().empty()) return !job_error_.empty();
    if (job_error_.empty()) {
      job_error_ = response.job_error();
      failed_rank_ = response.failed_rank();
    }
  }
  RunAbortOnce();
  return true;
}

void Agent::RunAbortOnce() {
  std::function<void()> abort;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    abort = abort_;
  }
  // Outside mu_: Abort waits for the pending collective to return.
  if (abort) abort();
}

void Agent::SendReport(const std::string& error, bool leaving) {
  v1::HeartbeatRequest request;
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  request.set_error(error);
  request.set_leaving(leaving);
  absl::StatusOr<v1::HeartbeatResponse> response = client_->Heartbeat(request);
  if (response.ok() && !leaving) TakeResponse(*response);
}

absl::Status Agent::OnOwnFailure(const absl::Status& local) {
  if (local.ok()) return local;
  SendReport(std::string(local.message()), /*leaving=*/false);
  RunAbortOnce();
  return local;
}

Agent::FailureCause Agent::PollForFailureCause() {
  absl::Duration interval, timeout;
  FailureCause cause;
  {
    absl::MutexLock lock(&mu_);
    interval = interval_;
    timeout = heartbeat_timeout_;
    cause.host = coordinator_rank_ == rank_ ? -1 : coordinator_rank_;
  }
  // Two intervals for the coordinator's scan and this rank's poll, one
  // more for a host agent's relay (its cached host heartbeat response).
  cause.waited = timeout + 3 * interval;
  const absl::Time deadline = absl::Now() + cause.waited;
  v1::HeartbeatRequest request;
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  int failures = 0;
  while (true) {
    absl::StatusOr<v1::HeartbeatResponse> response =
        client_->Heartbeat(request);
    cause.reachable = response.ok();
    failures = cause.reachable ? 0 : failures + 1;
    if (response.ok() && TakeResponse(*response)) break;
    // A peer that left the job normally (its optimizer or process group
    // ended) while this rank still steps: known at once, no need to wait.
    if (cause.reachable) {
      cause.finished_peer = FinishedPeer();
      if (!cause.finished_peer.empty()) {
        // The heartbeat's answer may be a host agent's cached one: the
        // job's own state, asked now, says whether the peer left after a
        // failure (then that failure is the cause).
        absl::StatusOr<v1::JobInfo> job = client_->GetJob();
        if (job.ok() && job->failed_rank() >= 0 && !job->error().empty()) {
          v1::HeartbeatResponse known;
          known.set_job_error(job->error());
          known.set_failed_rank(job->failed_rank());
          TakeResponse(known);
          cause.finished_peer.clear();
        }
        break;
      }
    }
    if (absl::Now() >= deadline) break;
    // The coordinator lived in rank `host`'s process and no longer
    // answers: that rank is gone; no need to wait out the timeout.
    if (cause.host >= 0 && failures >= 3) break;
    absl::SleepFor(std::max(absl::Milliseconds(1), interval / 2));
  }
  return cause;
}

absl::Status Agent::OnStepFailed(const absl::Status& local) {
  if (local.ok()) return local;
  const bool communication = absl::IsUnavailable(local) ||
                             absl::IsAborted(local) ||
                             absl::IsDeadlineExceeded(local);
  // This rank's own failure: the coordinator tells everyone.
  if (!communication) return OnOwnFailure(local);
  const FailureCause cause = PollForFailureCause();
  std::string error;
  int failed = -1;
  {
    absl::MutexLock lock(&mu_);
    error = job_error_;
    failed = failed_rank_;
  }
  if (error.empty() && !cause.finished_peer.empty()) {
    RunAbortOnce();
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": step failed: ", cause.finished_peer,
                     " while rank ", rank_,
                     " is still stepping: every rank must call step() the same "
                     "number of times; this rank saw: ",
                     local.message()));
  }
  if (!error.empty()) {
    if (failed == rank_) return local;
    return absl::AbortedError(absl::StrCat(
        "rank ", rank_, ": step failed: ", error,
        " (reported by the coordinator); this rank saw: ", local.message()));
  }
  if (!cause.reachable && cause.host >= 0) {
    return absl::AbortedError(absl::StrCat(
        "rank ", rank_, ": step failed: rank ", cause.host,
        " lost: the coordinator it hosted no longer answers (its process "
        "ended or stopped); this rank saw: ",
        local.message()));
  }
  if (!cause.reachable) {
    return absl::Status(
        local.code(),
        absl::StrCat(local.message(), " [rank ", rank_,
                     ": the coordinator is unreachable, so it cannot say "
                     "which rank failed (a rank embedding it may have died)]"));
  }
  // Nobody lost: report this failure so the other ranks abort too.
  SendReport(std::string(local.message()), /*leaving=*/false);
  RunAbortOnce();
  return absl::Status(
      local.code(),
      absl::StrCat(local.message(), " [rank ", rank_,
                   ": the coordinator knew of no failed rank within ",
                   absl::FormatDuration(cause.waited), "]"));
}

std::string Agent::FinishedPeer() {
  absl::StatusOr<v1::ListRanksResponse> ranks = client_->ListRanks();
  if (!ranks.ok()) return "";
  // The rank that left first (its last heartbeat is its leaving one): the
  // ranks whose step then failed may have left since, too.
  const v1::RankStatus* first = nullptr;
  for (const v1::RankStatus& r : ranks->ranks()) {
    if (r.rank() == rank_ || r.state() != v1::RANK_STATE_FINISHED) continue;
    if (first == nullptr ||
        r.last_heartbeat_unix_s() < first->last_heartbeat_unix_s()) {
      first = &r;
    }
  }
  if (first == nullptr) return "";
  return absl::StrCat("rank ", first->rank(),
                      " finished (left the job after step ", first->last_step(),
                      ")");
}

void Agent::Report(v1::StepReport report) {
  v1::StepReport* slot = AcquireReport();
  if (slot == nullptr) return;
  *slot = std::move(report);
  Submit(slot);
}

// mu_ is never held across an RPC or a wait (Await releases it), so the
// locks below are short whatever the coordinator does.
v1::StepReport* Agent::AcquireReport() {
  absl::MutexLock lock(&mu_);
  if (free_size_ == 0) {
    ++dropped_;
    return nullptr;
  }
  v1::StepReport* report = PopFreeLocked();
  report->Clear();  // keeps the storage of its repeated fields
  return report;
}

void Agent::PushFreeLocked(v1::StepReport* report) {
  free_[(free_head_ + free_size_) % free_.size()] = report;
  ++free_size_;
}

v1::StepReport* Agent::PopFreeLocked() {
  v1::StepReport* report = free_[free_head_];
  free_head_ = (free_head_ + 1) % free_.size();
  --free_size_;
  return report;
}

void Agent::Submit(v1::StepReport* report) {
  report->set_rank(rank_);
  report->set_incarnation(incarnation_);
  absl::MutexLock lock(&mu_);
  if (queue_size_ == queue_.size()) {
    ++dropped_;
    PushFreeLocked(report);
    return;
  }
  queue_[(queue_head_ + queue_size_) % queue_.size()] = report;
  ++queue_size_;
}

void Agent::Stop(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return;
    // Give queued reports a bounded chance to go out.
    auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_size_ == 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&drained), timeout);
    stopping_ = true;
    dropped_ += static_cast<int64_t>(queue_size_);
    for (; queue_size_ > 0; --queue_size_) {
      PushFreeLocked(queue_[queue_head_]);
      queue_head_ = (queue_head_ + 1) % queue_.size();
    }
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (report_thread_.joinable()) report_thread_.join();
  // A clean leave: the coordinator marks the rank finished, never lost.
  if (options_.leave_on_stop) SendReport("", /*leaving=*/true);
  absl::MutexLock lock(&mu_);
  started_ = false;
  stopping_ = false;
}

int64_t Agent::reports_sent() const {
  absl::MutexLock lock(&mu_);
  return sent_;
}

int64_t Agent::reports_dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void Agent::HeartbeatLoop() {
  v1::HeartbeatRequest request;
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  absl::Time last_ok = absl::Now();
  int failures = 0;  // consecutive failed heartbeats
  while (true) {
    absl::StatusOr<v1::HeartbeatResponse> response =
        client_->Heartbeat(request);
    const absl::Time now = absl::Now();
    if (response.ok()) {
      last_ok = now;
      failures = 0;
      OnHeartbeatAnswered(*response);
    } else if (absl::IsNotFound(response.status()) ||
               absl::IsAborted(response.status())) {
      OnRankUnknown(response.status());
    } else {
      OnHeartbeatFailed(response.status(), now, last_ok, &failures);
    }
    absl::MutexLock lock(&mu_);
    auto stop = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), interval_)) {
      return;
    }
  }
}

// A heartbeat succeeded: says so once if the coordinator had been lost,
// then takes the response's job state.
void Agent::OnHeartbeatAnswered(const v1::HeartbeatResponse& response) {
  bool was_lost = false;
  {
    absl::MutexLock lock(&mu_);
    was_lost = coordinator_lost_;
    coordinator_lost_ = false;
  }
  if (was_lost) {
    std::fprintf(stderr, "rank %d: the coordinator is reachable again\n",
                 rank_);
  }
  TakeResponse(response);
}

// A heartbeat answered NotFound or Aborted: the coordinator restarted; says
// so once and marks it lost.
void Agent::OnRankUnknown(const absl::Status& status) {
  // The coordinator answers but no longer knows this rank (or this
  // incarnation): it restarted. Ranks do not re-register into a
  // running job: said once, training goes on, reports are dropped.
  absl::MutexLock lock(&mu_);
  if (!coordinator_lost_) {
    coordinator_lost_ = true;
    std::fprintf(stderr,
                 "rank %d: the coordinator no longer knows this rank "
                 "(%s): it was restarted; ranks do not re-register into "
                 "a running job (restart the job to have a coordinator "
                 "again); training goes on, step reports are dropped\n",
                 rank_, std::string(status.message()).c_str());
  }
}

// A heartbeat failed otherwise: records the embedded coordinator's rank as
// lost after 3 Unavailable answers in a row (and aborts), and marks the
// coordinator lost once it has been silent for heartbeat_timeout_.
void Agent::OnHeartbeatFailed(const absl::Status& status, absl::Time now,
                              absl::Time last_ok, int* failures) {
  // The coordinator lived in another rank's process (embedded) and has
  // been unavailable for 3 heartbeats in a row: that rank is gone, and it
  // can no longer tell anyone. Record it as the job error and abort the
  // pending collectives, as a coordinator's verdict would.
  bool host_lost = false;
  {
    absl::MutexLock lock(&mu_);
    if (coordinator_rank_ >= 0 && coordinator_rank_ != rank_ &&
        job_error_.empty() && absl::IsUnavailable(status) && ++*failures >= 3) {
      job_error_ = absl::StrCat(
          "rank ", coordinator_rank_,
          " lost: the coordinator it hosted no longer answers (its "
          "process ended or stopped)");
      failed_rank_ = coordinator_rank_;
      host_lost = true;
    }
  }
  if (host_lost) RunAbortOnce();
  // Otherwise not fatal: training goes on while the data path is
  // healthy; the coordinator marks this rank lost if it cannot hear it.
  absl::MutexLock lock(&mu_);
  if (!coordinator_lost_ && now - last_ok > heartbeat_timeout_) {
    coordinator_lost_ = true;
    std::fprintf(stderr,
                 "rank %d: the coordinator has been unreachable for %s "
                 "(%s); training goes on, step reports are dropped\n",
                 rank_, absl::FormatDuration(now - last_ok).c_str(),
                 std::string(status.message()).c_str());
  }
}

void Agent::ReportLoop() {
  while (true) {
    v1::StepReport* report = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || queue_size_ > 0;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_size_ == 0) return;  // stopping
      report = queue_[queue_head_];
      queue_head_ = (queue_head_ + 1) % queue_.size();
      --queue_size_;
      // The count so far, this report not included (it may still go out).
      report->set_reports_dropped(dropped_);
    }
    // The RPC runs without mu_: Report() never waits on it.
    absl::Status s = client_->ReportStep(*report);
    absl::MutexLock lock(&mu_);
    PushFreeLocked(report);
    if (s.ok()) {
      ++sent_;
    } else {
      ++dropped_;
    }
  }
}

absl::Status ReportFailedJoin(CoordinationClient* client, int rank,
                              int world_size, uint64_t incarnation,
                              const absl::Status& local) {
  // A world of one has no peer waiting, and may create its optimizer again
  // in the same job (a failed job stays failed).
  if (client == nullptr || local.ok() || world_size <= 1) return local;
  v1::JoinRequest request;
  request.set_incarnation(incarnation);
  request.mutable_manifest()->set_rank(rank);
  request.mutable_manifest()->set_world_size(world_size);
  request.set_error(std::string(local.message()));
  return client->Join(request).status();
}

}  // namespace muon
