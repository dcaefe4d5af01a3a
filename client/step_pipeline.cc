#include "client/step_pipeline.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/bfloat16.h"

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

kernels::ParamDType KernelDType(DType dtype) {
  return dtype == DType::kBFloat16 ? kernels::ParamDType::kBFloat16
                                   : kernels::ParamDType::kFloat32;
}

StepPipeline::StepPipeline(StepPipelineParts parts, StepPipelineRun run)
    : rank_(parts.rank),
      params_(*parts.params),
      bound_(*parts.bound),
      options_(*parts.options),
      rule_(*parts.rule),
      state_(parts.state),
      device_(parts.device),
      runtime_(parts.runtime),
      agent_(parts.agent),
      fill_report_(std::move(parts.fill_report)),
      plan_(std::move(run.plan)),
      executor_(std::move(run.executor)),
      rank_flags_(std::move(run.rank_flags)),
      abort_communicators_(std::move(run.abort_communicators)),
      device_wait_timeout_(run.device_wait_timeout),
      replan_every_steps_(run.replan_every_steps),
      overlap_(run.overlap_backward) {
  stats_.ops.reserve(4 * plan_.buckets_size());
}

absl::Status StepPipeline::Step(void* stream) {
  MUON_ASSIGN_OR_RETURN(device::Stream * caller,
                        ResolveStream(stream, "the step"));
  return RunStep(caller);
}

absl::Status StepPipeline::Refuse(absl::Status refusal) {
  if (refusal.ok()) {
    return absl::InvalidArgumentError("StepPipeline::Refuse: an OK status");
  }
  if (overlap_begun_) {
    // Buckets of this step already run: Step finishes it (failing it,
    // naming what is missing, and undoing it under check_finite).
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": RefuseStep during a step begun by MarkReady ",
        "(finish it with Step); the refusal was: ", refusal.message()));
  }
  if (overlap_) {
    // The other ranks' buckets may run before any agreement: this rank's
    // own failure, which the coordinator makes the job's (a world of one
    // has nobody to tell, and steps on).
    return FailedWithPeersWaiting(refusal);
  }
  refusal_ = refusal;
  absl::Status s = RunStep(nullptr);
  refusal_ = absl::OkStatus();
  return s.ok() ? refusal : s;
}

absl::StatusOr<device::Stream*> StepPipeline::ResolveStream(void* native,
                                                            const char* what) {
  if (!device_.is_host()) return CallerStream(native);
  if (native != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": a stream was given for ", what,
                     " but the parameters are on ", device_.ToString(),
                     " (pass no stream for CPU tensors)"));
  }
  return nullptr;
}

absl::Status StepPipeline::RunStep(device::Stream* caller) {
  // A step begun during backward (MarkReady) finishes what is left. With
  // check_finite under overlap, a rank that marked nothing takes the same
  // path, so that every rank's collectives come in the same order (the
  // buckets' first, the agreement after).
  if (!overlap_begun_ && overlap_checks_finite()) {
    MUON_RETURN_IF_ERROR(BeginOverlappedStep(caller));
  }
  if (overlap_begun_) return FinishOverlappedStep(caller);
  // At a re-plan boundary every rank switches to the coordinator's new
  // plan before the step (ExecutionOptions.replan_every_steps).
  MUON_RETURN_IF_ERROR(MaybeReplan());
  // A rank's refused inputs (Preflight) or non-finite gradients: every
  // rank fails here, before the momentum pass writes anything and before
  // any data collective.
  MUON_RETURN_IF_ERROR(CheckStepInputs(caller));
  const absl::Time start = absl::Now();
  // The peers go on to their exchanges: a failed snapshot is this rank's
  // alone.
  if (options_.transactional_step) {
    if (absl::Status s = TakeSnapshot(caller); !s.ok()) {
      return FailedWithPeersWaiting(s);
    }
  }
  if (absl::Status s = Commit(absl::OkStatus(), MomentumAndExchange(caller));
      !s.ok()) {
    if (options_.transactional_step) {
      if (absl::Status r = RestoreSnapshot(caller); !r.ok()) {
        return absl::Status(
            s.code(),
            absl::StrCat(s.message(), "; restoring the snapshot on ",
                         device_.ToString(), " failed too: ", r.ToString()));
      }
    }
    return s;
  }
  Report(start);
  return absl::OkStatus();
}

absl::Status StepPipeline::MomentumAndExchange(device::Stream* caller) {
  // Momentum and Nesterov on the local shards (elementwise: exact on
  // shards), reading the trainer's gradient where it lies.
  absl::Status run;
  for (size_t i = 0; i < params_.size() && run.ok(); ++i) {
    run = OnCaller(caller,
                   [&] { return MomentumOne(static_cast<int>(i), caller); });
  }
  if (!run.ok()) {
    // A partial momentum pass still in flight must not outlive the step.
    (void)SyncCaller(caller);
    return run;
  }
  return executor_->Run(state_->update_sources(), params_, rule_, &stats_,
                        caller);
}

absl::Status StepPipeline::Commit(absl::Status own, absl::Status run) {
  if (!own.ok()) {
    // This rank's own error after its executor finished the step: reported
    // so that the job fails on every rank. With no coordinator and a run
    // that ended well, the peers are not waiting for it (under
    // check_finite they learn of it in the agreement); a failed run may
    // have left them in a collective or the agreement.
    if (agent_ != nullptr) return agent_->OnOwnFailure(own);
    return run.ok() ? own : FailedWithPeersWaiting(own);
  }
  const bool ran = run.ok();
  if (ran && post_update_fault_) run = post_update_fault_(step_ + 1);
  // Every data collective of the step has run on this rank: the ranks
  // agree on the outcome and roll back together.
  if (ran && options_.transactional_step) return AgreeOnCommit(run);
  if (run.ok()) return run;
  // A failed collective: the coordinator's error naming the failed rank
  // (bounded wait); this rank's own failure is reported to every rank.
  // Without a coordinator the run may have failed on this rank alone
  // (its peers then wait in their next collective, or in the commit
  // agreement, which must not pair with this rank's next step's).
  if (agent_ != nullptr) return agent_->OnStepFailed(run);
  return FailedWithPeersWaiting(run);
}

absl::Status StepPipeline::FailedWithPeersWaiting(const absl::Status& own) {
  if (own.ok() || rank_flags_->world_size() <= 1) return own;
  if (agent_ != nullptr) return agent_->OnOwnFailure(own);
  if (abort_communicators_) abort_communicators_();
  return own;
}

absl::Status StepPipeline::TakeSnapshot(device::Stream* caller) {
  return OnCaller(caller, [&] {
    return state_->snapshot().Save(&executor_->kernels(), caller, params_,
                                   state_->buffers(), step_);
  });
}

void StepPipeline::Report(absl::Time start) {
  stats_.step_time_s = absl::ToDoubleSeconds(absl::Now() - start);
  ++step_;
  if (agent_ == nullptr || !fill_report_) return;
  // A pooled report whose storage is reused: no allocation once warm.
  v1::StepReport* report = agent_->AcquireReport();
  if (report == nullptr) return;
  fill_report_(report);
  agent_->Submit(report);
}

absl::StatusOr<device::Stream*> StepPipeline::CallerStream(void* native) {
  if (caller_ == nullptr || caller_native_ != native) {
    caller_.reset();
    MUON_ASSIGN_OR_RETURN(
        caller_, runtime_->WrapStream(
                     native, absl::StrCat("rank ", rank_, " caller stream")));
    caller_native_ = native;
  }
  return caller_.get();
}

absl::Status StepPipeline::SyncCaller(device::Stream* caller) {
  if (caller == nullptr) return absl::OkStatus();
  return caller->Synchronize(device_wait_timeout_);
}

absl::Status StepPipeline::MaybeReplan() {
  if (agent_ == nullptr || replan_every_steps_ <= 0 || step_ == 0 ||
      step_ % replan_every_steps_ != 0 || replanned_at_ == step_) {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::Plan> plan = agent_->Replan(step_);
  if (!plan.ok()) {
    // Every rank switches at this boundary or none may step on: this
    // rank's own failure (not a peer's, whatever its code), reported at
    // once so that the coordinator makes it the job error.
    return agent_->OnOwnFailure(absl::Status(
        plan.status().code(),
        absl::StrCat("rank ", rank_, ": re-planning after step ", step_,
                     " failed: ", plan.status().message())));
  }
  replanned_at_ = step_;
  if (plan->hash() == plan_.hash()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<StepExecutor>> executor =
      executor_->ForPlan(*plan);
  if (!executor.ok()) {
    return agent_->OnOwnFailure(absl::InternalError(
        absl::StrCat("rank ", rank_, ": the re-plan after step ", step_,
                     " does not fit this rank's parameters: ",
                     executor.status().message())));
  }
  executor_ = *std::move(executor);
  plan_ = *std::move(plan);
  return absl::OkStatus();
}

absl::Status StepPipeline::BindOne(int index) {
  if (index >= static_cast<int>(bound_.size())) return absl::OkStatus();
  Parameter& p = *bound_[index];
  ParamView& v = params_[index];
  if (static_cast<int64_t>(p.data.size()) != v.local_numel()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", p.name, "\" holds ",
                     p.data.size(), " values but its local shape ",
                     ShapeToString(v.local_shape), " needs ", v.local_numel()));
  }
  if (!p.grad.empty() &&
      static_cast<int64_t>(p.grad.size()) != v.local_numel()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": parameter \"", p.name, "\" has a gradient of ",
        p.grad.size(), " values but its local shape ",
        ShapeToString(v.local_shape), " needs ", v.local_numel()));
  }
  v.data = p.data.data();
  v.grad = p.grad.empty() ? nullptr : p.grad.data();
  return absl::OkStatus();
}

absl::Status StepPipeline::BindAll() {
  for (size_t i = 0; i < bound_.size(); ++i) {
    MUON_RETURN_IF_ERROR(BindOne(static_cast<int>(i)));
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::Preflight() {
  MUON_RETURN_IF_ERROR(BindAll());
  for (const ParamView& v : params_) {
    if (v.grad == nullptr && v.local_numel() > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank_, ": parameter \"", v.name,
                       "\" has no gradient (its "
                       "local shape ",
                       ShapeToString(v.local_shape), " needs ", v.local_numel(),
                       " values)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::MomentumOne(int index, device::Stream* stream) {
  const ParamView& p = params_[index];
  const OptimizerState::Momentum& buf = state_->momentum(index);
  UpdateSource& src = state_->update_sources()[index];
  // The executor forms Nesterov's U from the gradient per bucket.
  src.grad = options_.nesterov ? p.grad : nullptr;
  src.grad_dtype = KernelDType(p.grad_dtype);
  if (buf.size() == 0) return absl::OkStatus();
  return rule_.Momentum(executor_->kernels(), stream, index, buf.data(),
                        buf.dtype, p.grad, KernelDType(p.grad_dtype),
                        buf.size());
}

absl::Status StepPipeline::AgreeOnCommit(const absl::Status& local) {
  const absl::Status gathered = GatherRankFlags(local.ok() ? 0.0f : 1.0f);
  if (!local.ok()) return local;  // this rank's own error comes first
  MUON_RETURN_IF_ERROR(gathered);
  if (const int r = rank_flags_->FirstRaised(); r >= 0) {
    return absl::AbortedError(absl::StrCat(
        "rank ", rank_, ": rank ", r, " failed step ", step_ + 1, " (rank ", r,
        "'s error names the cause); the step was rolled back: parameters, "
        "momentum and step count are unchanged on every rank"));
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::GatherRankFlags(float flag) {
  absl::Status gathered = rank_flags_->Gather(flag);
  if (!gathered.ok() && agent_ != nullptr) {
    gathered = agent_->OnStepFailed(gathered);
  }
  return gathered;
}

absl::Status StepPipeline::FindNonFinite(device::Stream* caller, int begin,
                                         int end, NonFinite* found) {
  *found = NonFinite();
  MUON_RETURN_IF_ERROR(LaunchNonFiniteScan(caller, begin, end));
  MUON_RETURN_IF_ERROR(SyncCaller(caller));
  return ReadNonFinite(begin, end, found);
}

absl::Status StepPipeline::LaunchNonFiniteScan(device::Stream* caller,
                                               int begin, int end) {
  for (int i = begin; i < end; ++i) {
    const ParamView& p = params_[i];
    const int64_t numel = state_->momentum(i).size();
    if (numel == 0) continue;
    MUON_RETURN_IF_ERROR(OnCaller(caller, [&] {
      return executor_->kernels().FirstNonFinite(
          caller, p.grad, KernelDType(p.grad_dtype), numel,
          state_->nonfinite_slot(i));
    }));
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::ReadNonFinite(int begin, int end, NonFinite* found) {
  *found = NonFinite();
  MUON_RETURN_IF_ERROR(state_->FetchNonfinite(begin, end));
  for (int i = begin; i < end; ++i) {
    if (state_->momentum(i).size() == 0 || state_->nonfinite(i) < 0) continue;
    const ParamView& p = params_[i];
    found->param = i;
    found->index = state_->nonfinite(i);
    const int64_t size = DTypeSize(p.grad_dtype);
    const char* at = static_cast<const char*>(p.grad) + found->index * size;
    if (p.grad_dtype == DType::kBFloat16) {
      kernels::bf16_t raw;
      MUON_RETURN_IF_ERROR(runtime_->CopyToHost(&raw, at, size));
      found->value = kernels::Bf16ToFloat(raw);
    } else {
      MUON_RETURN_IF_ERROR(runtime_->CopyToHost(&found->value, at, size));
    }
    break;
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::CheckStepInputs(device::Stream* caller) {
  const absl::Status preflight = refusal_.ok() ? Preflight() : refusal_;
  // Without a control group there is nothing to agree over; under
  // overlap_backward the ranks that marked parameters gather nothing here
  // (their buckets' collectives come first), so neither may this one.
  if (!rank_flags_->collective() || overlap_) {
    // The peers go on to their exchanges (or already run their buckets).
    if (!preflight.ok()) return FailedWithPeersWaiting(preflight);
    return CheckGradientsFinite(caller);
  }
  if (!preflight.ok()) {
    // This rank's part of the agreement its peers wait in (the finite
    // check's, or the one below): they fail naming it.
    (void)GatherRankFlags(kPreflightRefused);
    return preflight;
  }
  if (*options_.check_finite) return CheckGradientsFinite(caller);
  MUON_RETURN_IF_ERROR(GatherRankFlags(0.0f));
  if (const int r = rank_flags_->FirstRaised(); r >= 0) {
    return PeerRefused(r, kStepNotTaken);
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::PeerRefused(int peer, const char* outcome) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank_, ": rank ", peer, " refused step ", step_ + 1,
      "'s inputs (rank ", peer, "'s error names the parameter)", outcome));
}

absl::Status StepPipeline::CheckGradientsFinite(device::Stream* caller) {
  if (!*options_.check_finite) return absl::OkStatus();
  NonFinite found;
  // A device error here is this rank's own failure, raised before any
  // collective and reported, so that the other ranks' agreement fails too.
  if (absl::Status s =
          FindNonFinite(caller, 0, static_cast<int>(params_.size()), &found);
      !s.ok()) {
    return FailedWithPeersWaiting(s);
  }
  bool any_bad = false;
  return AgreeOnFinite(found, /*undone=*/false, &any_bad);
}

absl::Status StepPipeline::AgreeOnFinite(const NonFinite& found, bool undone,
                                         bool* any_bad) {
  *any_bad = false;
  const char* outcome = undone ? kStepUndone : kStepNotTaken;
  absl::Status local = absl::OkStatus();
  if (found.param >= 0) {
    local = absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": parameter \"", params_[found.param].name,
        "\" has a non-finite gradient (", found.value, " at local index ",
        found.index, ") at step ", step_ + 1, outcome));
  }
  if (!rank_flags_->collective()) {
    // No agreement: the peers go on to their exchanges.
    *any_bad = !local.ok();
    return FailedWithPeersWaiting(local);
  }
  // Agreement: each rank contributes 1 + the index of its first bad
  // parameter (0 = all finite; exact in float below 2^24 parameters; -1
  // from a rank that could not read its scan, FinishOverlappedStep).
  MUON_RETURN_IF_ERROR(GatherRankFlags(static_cast<float>(found.param + 1)));
  *any_bad = !local.ok() || rank_flags_->FirstRaised() >= 0;
  if (!local.ok()) return local;
  if (const int r = rank_flags_->FirstRaised(); r >= 0) {
    if (rank_flags_->flag(r) == kPreflightRefused)
      return PeerRefused(r, outcome);
    if (rank_flags_->flag(r) < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, ": rank ", r,
          " could not check its gradients for NaN/Inf (rank ", r,
          "'s error names the cause) at step ", step_ + 1, outcome));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": rank ", r,
                     " has a non-finite gradient (its parameter #",
                     static_cast<int64_t>(rank_flags_->flag(r)) - 1, "; rank ",
                     r, "'s error names it) at step ", step_ + 1, outcome));
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::RestoreSnapshot(device::Stream* caller) {
  MUON_RETURN_IF_ERROR(OnCaller(caller, [&] {
    return state_->snapshot().Restore(&executor_->kernels(), caller, params_,
                                      state_->buffers(), &step_);
  }));
  return SyncCaller(caller);
}

absl::Status StepPipeline::BeginOverlappedStep(device::Stream* producer) {
  MUON_RETURN_IF_ERROR(MaybeReplan());
  param_ready_.assign(params_.size(), 0);
  grad_fingerprints_.assign(params_.size(), 0);
  enqueued_ready_ = 0;
  // Nesterov's gradient pointers are this step's, set as each parameter is
  // made ready: a parameter a failed step never makes ready forms its
  // update from its momentum, not from the last step's (maybe freed)
  // gradient.
  for (UpdateSource& src : state_->update_sources()) src.grad = nullptr;
  overlap_start_ = absl::Now();
  // Before the first momentum pass writes anything: what a step with a bad
  // gradient on any rank is undone to, read from the parameters' current
  // storage (a bound Parameter's data may have moved since the last step).
  // Waited for: later passes may run on other streams.
  // The peers' buckets may already run: a failure here is this rank's.
  absl::Status begun;
  if (overlap_checks_finite()) {
    begun = BindAll();
    if (begun.ok()) begun = TakeSnapshot(producer);
    if (begun.ok()) begun = SyncCaller(producer);
  }
  if (begun.ok()) {
    begun = executor_->Begin(state_->update_sources(), params_, rule_, nullptr);
  }
  MUON_RETURN_IF_ERROR(FailedWithPeersWaiting(begun));
  overlap_begun_ = true;
  return absl::OkStatus();
}

absl::Status StepPipeline::ReadyOne(int index, device::Stream* producer) {
  ParamView& p = params_[index];
  const int64_t n = state_->momentum(index).size();
  MUON_RETURN_IF_ERROR(BindOne(index));
  if (p.grad == nullptr && n > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", p.name,
                     "\" was marked ready without a gradient"));
  }
  if (n > 0) {
    // Every gradient is scanned into its slot; Step reads the slots and
    // the ranks agree there. The step goes on meanwhile (its buckets'
    // collectives are under way on the other ranks) and is undone there.
    if (overlap_checks_finite()) {
      MUON_RETURN_IF_ERROR(LaunchNonFiniteScan(producer, index, index + 1));
    }
    MUON_RETURN_IF_ERROR(
        OnCaller(producer, [&] { return MomentumOne(index, producer); }));
    if (device_.is_host() && !executor_->async()) {
      grad_fingerprints_[index] =
          Fingerprint(p.grad, n * DTypeSize(p.grad_dtype));
    }
  }
  // Ready once its momentum pass is enqueued (never run twice). The
  // executor's streams read the momentum (and Nesterov's gradient) after
  // the pass on the producer's stream; a failure here fails the step.
  param_ready_[index] = 1;
  if (n > 0) return FailedWithPeersWaiting(executor_->OrderAfter(producer));
  return absl::OkStatus();
}

absl::Status StepPipeline::MarkReady(int index, void* stream) {
  if (index < 0 || index >= static_cast<int>(params_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank_, ": MarkReady: parameter index ", index,
                     " is outside [0, ", params_.size(), ")"));
  }
  if (!overlap_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": MarkReady needs execution.overlap_backward"));
  }
  MUON_ASSIGN_OR_RETURN(device::Stream * producer,
                        ResolveStream(stream, "MarkReady"));
  if (!overlap_begun_) MUON_RETURN_IF_ERROR(BeginOverlappedStep(producer));
  if (param_ready_[index]) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", params_[index].name,
                     "\" was marked ready twice in step ", step_ + 1));
  }
  MUON_RETURN_IF_ERROR(ReadyOne(index, producer));
  const int ready = executor_->ReadyBuckets(param_ready_);
  if (ready > enqueued_ready_) {
    enqueued_ready_ = ready;
    return FailedWithPeersWaiting(executor_->EnqueueReady(ready));
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::FinishOverlappedStep(device::Stream* caller) {
  absl::Status status;
  for (size_t i = 0; i < params_.size() && status.ok(); ++i) {
    if (!param_ready_[i]) status = ReadyOne(static_cast<int>(i), caller);
  }
  if (status.ok()) {
    status = CheckGradientsUnchanged();
  } else {
    // The buckets Finish enqueues still read the unmarked parameters'
    // gradients: after what `caller` has queued. A failure to order them
    // is sticky in the executor, and Finish returns it.
    (void)executor_->OrderAfter(caller);
  }
  // The buckets already running must end on every rank (their
  // collectives), whatever failed here.
  absl::Status finished = executor_->Finish(&stats_);
  overlap_begun_ = false;
  if (!status.ok() && overlap_checks_finite()) {
    return AbandonCheckedStep(caller, status, finished);
  }
  MUON_RETURN_IF_ERROR(Commit(status, finished));
  if (overlap_checks_finite()) {
    MUON_RETURN_IF_ERROR(AgreeOnFiniteOrUndo(caller));
  }
  Report(overlap_start_);
  return absl::OkStatus();
}

absl::Status StepPipeline::AbandonCheckedStep(device::Stream* caller,
                                              const absl::Status& own,
                                              const absl::Status& finished) {
  // Where the buckets' collectives ran, the other ranks wait in the
  // agreement: "could not check" (-1) makes them fail and undo theirs.
  if (finished.ok() && rank_flags_->collective()) {
    (void)GatherRankFlags(-1.0f);
  }
  const absl::Status reported = Commit(own, finished);
  return UndoFromSnapshot(
      caller, absl::Status(reported.code(),
                           absl::StrCat(reported.message(),
                                        "; the step was undone on this rank: "
                                        "parameters, momentum and step count "
                                        "are as before it")));
}

absl::Status StepPipeline::UndoFromSnapshot(device::Stream* caller,
                                            const absl::Status& failed) {
  const int64_t step = step_ + 1;
  if (absl::Status r = RestoreSnapshot(caller); !r.ok()) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank_, ": step ", step, " failed (", failed.message(),
        ") and restoring its snapshot failed too (", r.ToString(),
        "); parameters and momentum hold the step's update"));
  }
  return failed;
}

absl::Status StepPipeline::CheckGradientsUnchanged() const {
  // Debug mode (the sequential schedule), CPU parameters only (the
  // fingerprints read host memory).
  if (!device_.is_host() || executor_->async()) return absl::OkStatus();
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = state_->momentum(i).size();
    const ParamView& p = params_[i];
    if (n == 0 || p.grad == nullptr) continue;
    if (Fingerprint(p.grad, n * DTypeSize(p.grad_dtype)) !=
        grad_fingerprints_[i]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, ": the gradient of parameter \"", p.name,
          "\" changed after MarkReady in step ", step_ + 1,
          "; it must stay unchanged until step() returns (the step read it "
          "at MarkReady and at its bucket's gather)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepPipeline::AgreeOnFiniteOrUndo(device::Stream* caller) {
  // The scans ran before the executor's streams (OrderAfter), which Finish
  // waited for; those of the parameters Step marked, on `caller`.
  NonFinite found;
  absl::Status read = SyncCaller(caller);
  if (read.ok()) {
    read = ReadNonFinite(0, static_cast<int>(params_.size()), &found);
  }
  // A rank that cannot read its scans cannot check: every rank fails.
  if (!read.ok()) return AbandonCheckedStep(caller, read, absl::OkStatus());
  bool any_bad = false;
  absl::Status finite = AgreeOnFinite(found, /*undone=*/true, &any_bad);
  if (finite.ok()) return finite;
  if (!any_bad) {
    finite = absl::Status(finite.code(),
                          absl::StrCat(finite.message(),
                                       "; the step's non-finite check failed, "
                                       "so the step was undone"));
  }
  return UndoFromSnapshot(caller, finite);
}

}  // namespace muon
