#include "client/agent.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muon {

Agent::Agent(CoordinationClient* client, int rank, uint64_t incarnation,
             Options options)
    : client_(client),
      rank_(rank),
      incarnation_(incarnation),
      options_(options) {
  const int capacity = std::max(1, options_.report_queue_capacity);
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < capacity + 1; ++i) {
    pool_.push_back(std::make_unique<v1::StepReport>());
    free_.push_back(pool_.back().get());
  }
  queue_.assign(capacity, nullptr);
}

Agent::~Agent() { Stop(); }

absl::StatusOr<v1::Plan> Agent::Join(const v1::RankManifest& manifest,
                                     int64_t timeout_ms) {
  v1::JoinRequest request;
  *request.mutable_manifest() = manifest;
  request.set_incarnation(incarnation_);
  request.set_timeout_ms(timeout_ms);
  MUON_ASSIGN_OR_RETURN(v1::JoinResponse response, client_->Join(request));
  return response.plan();
}

absl::Status Agent::ConfirmPlanHash(const std::string& hash, int world_size,
                                    absl::Duration timeout) {
  MUON_RETURN_IF_ERROR(
      client_->KeySet(absl::StrCat("plan_hash/", rank_), hash));
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::string> other =
        client_->KeyGet(absl::StrCat("plan_hash/", r), timeout);
    if (!other.ok()) {
      return absl::Status(
          other.status().code(),
          absl::StrCat("rank ", rank_, ": waiting for rank ", r,
                       "'s plan hash: ", other.status().message()));
    }
    if (*other != hash) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, " holds plan ", hash, " but rank ", r, " holds plan ",
          *other, "; every rank must run the same plan"));
    }
  }
  return absl::OkStatus();
}

void Agent::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return;
  started_ = true;
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  report_thread_ = std::thread([this] { ReportLoop(); });
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
  if (free_.empty()) {
    ++dropped_;
    return nullptr;
  }
  v1::StepReport* report = free_.back();
  free_.pop_back();
  report->Clear();  // keeps the storage of its repeated fields
  return report;
}

void Agent::Submit(v1::StepReport* report) {
  report->set_rank(rank_);
  report->set_incarnation(incarnation_);
  absl::MutexLock lock(&mu_);
  if (queue_size_ == queue_.size()) {
    ++dropped_;
    free_.push_back(report);
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
      free_.push_back(queue_[queue_head_]);
      queue_head_ = (queue_head_ + 1) % queue_.size();
    }
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (report_thread_.joinable()) report_thread_.join();
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
  while (true) {
    // Failures are not fatal here: the coordinator marks the rank lost.
    (void)client_->Heartbeat(request);
    absl::MutexLock lock(&mu_);
    auto stop = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop),
                             options_.heartbeat_interval)) {
      return;
    }
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
    free_.push_back(report);
    if (s.ok()) {
      ++sent_;
    } else {
      ++dropped_;
    }
  }
}

}  // namespace muon
