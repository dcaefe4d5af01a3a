// Muon::MarkReady and the step that starts during backward
// (ExecutionOptions.overlap_backward): a parameter marked ready gets its
// momentum at once, and every bucket whose parameters are all ready is
// handed to the executor's streams (StepExecutor::EnqueueReady), which
// gather, orthogonalize and redistribute it while the caller goes on with
// backward; Step then finishes what is left.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/muon.h"
#include "common/status_macros.h"

namespace muon {
namespace {

// FNV-1a over `bytes` bytes: the debug mode's record of a gradient at
// MarkReady, compared again at Step.
uint64_t Fingerprint(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < bytes; ++i) {
    h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::Status Muon::BeginOverlappedStep() {
  MUON_RETURN_IF_ERROR(MaybeReplan());
  param_ready_.assign(params_.size(), 0);
  grad_fingerprints_.assign(params_.size(), 0);
  enqueued_ready_ = 0;
  overlap_start_ = absl::Now();
  MUON_RETURN_IF_ERROR(
      executor_->Begin(state_->update_sources(), params_, rule_, nullptr));
  overlap_begun_ = true;
  return absl::OkStatus();
}

absl::Status Muon::ReadyOne(int index) {
  ParamView& p = params_[index];
  const int64_t n = state_->momentum(index).size();
  MUON_RETURN_IF_ERROR(BindOne(index));
  if (p.grad == nullptr && n > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", p.name,
                     "\" was marked ready without a gradient"));
  }
  if (n > 0) {
    MUON_RETURN_IF_ERROR(MomentumOne(index, nullptr));
    if (!executor_->async()) {
      grad_fingerprints_[index] =
          Fingerprint(p.grad, n * DTypeSize(p.grad_dtype));
    }
  }
  param_ready_[index] = 1;
  return absl::OkStatus();
}

absl::Status Muon::MarkReady(int index) {
  if (index < 0 || index >= static_cast<int>(params_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank_, ": MarkReady: parameter index ", index,
                     " is outside [0, ", params_.size(), ")"));
  }
  if (!overlap_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": MarkReady needs execution.overlap_backward"));
  }
  if (!overlap_begun_) MUON_RETURN_IF_ERROR(BeginOverlappedStep());
  if (param_ready_[index]) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", params_[index].name,
                     "\" was marked ready twice in step ", step_ + 1));
  }
  MUON_RETURN_IF_ERROR(ReadyOne(index));
  const int ready = executor_->ReadyBuckets(param_ready_);
  if (ready > enqueued_ready_) {
    enqueued_ready_ = ready;
    MUON_RETURN_IF_ERROR(executor_->EnqueueReady(ready));
  }
  return absl::OkStatus();
}

absl::Status Muon::FinishOverlappedStep() {
  absl::Status status;
  for (size_t i = 0; i < params_.size() && status.ok(); ++i) {
    if (!param_ready_[i]) status = ReadyOne(static_cast<int>(i));
  }
  // Debug mode (the sequential schedule): a gradient changed after its
  // parameter was marked ready is an error naming it (the step read it at
  // MarkReady and again at its bucket's gather).
  if (status.ok() && !executor_->async()) {
    for (size_t i = 0; i < params_.size() && status.ok(); ++i) {
      const int64_t n = state_->momentum(i).size();
      const ParamView& p = params_[i];
      if (n == 0 || p.grad == nullptr) continue;
      if (Fingerprint(p.grad, n * DTypeSize(p.grad_dtype)) !=
          grad_fingerprints_[i]) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank_, ": the gradient of parameter \"", p.name,
            "\" changed after MarkReady in step ", step_ + 1,
            "; it must stay unchanged until step() returns (the step read it "
            "at MarkReady and at its bucket's gather)"));
      }
    }
  }
  // The buckets already running must end on every rank (their
  // collectives), whatever failed here.
  absl::Status finished = executor_->Finish(&stats_);
  overlap_begun_ = false;
  if (!status.ok()) {
    // This rank's own error after its peers may have finished the step:
    // reported so that the job fails on every rank (restart from a
    // checkpoint), as a failed step does without transactional_step.
    if (agent_ != nullptr) status = agent_->OnOwnFailure(status);
    return status;
  }
  if (!finished.ok()) {
    return agent_ != nullptr ? agent_->OnStepFailed(finished) : finished;
  }
  CountStep(overlap_start_);
  return absl::OkStatus();
}

}  // namespace muon
