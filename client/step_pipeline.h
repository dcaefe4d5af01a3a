// StepPipeline: one Muon optimizer step on one rank, in fixed phases:
//   preflight     re-read bound parameters, check every gradient is there
//                 (nothing modified, no collective on failure);
//   finite check  MuonOptions::check_finite: the local scan, then the
//                 ranks' agreement (every rank fails before any data
//                 collective);
//   snapshot      MuonOptions::transactional_step: parameters and state;
//   momentum      buf.lerp_(grad, 1 - momentum) on every local shard
//                 (torch.optim.Muon's momentum_buffer update);
//   exchange and Newton-Schulz
//                 the executor's gather, orthogonalization, redistribution
//                 and apply (StepExecutor);
//   commit        the outcome: this rank's failure reported to every rank,
//                 the ranks' agreement and rollback (transactional_step);
//   report        the step count, the stats and the coordinator's report.
// A step begun during backward (ExecutionOptions.overlap_backward; MarkReady)
// runs the same phases; it changes only when each parameter's preflight and
// momentum run (at its MarkReady) and when its buckets are handed to the
// executor (as soon as all their parameters are ready). At a re-plan
// boundary the pipeline first switches to the coordinator's new plan.
#ifndef MUON_CLIENT_STEP_PIPELINE_H_
#define MUON_CLIENT_STEP_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/muon_options.h"
#include "client/optimizer_state.h"
#include "client/parameter.h"
#include "client/rank_flags.h"
#include "client/step_executor.h"
#include "client/tensor_view.h"
#include "client/update_rule.h"
#include "control/agent.h"
#include "device/device.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// What the pipeline works on, all owned by the optimizer and outliving the
// pipeline: this rank, its parameters (views the preflight re-binds from
// `bound` Parameters, when given), the options and update rule, the state,
// the parameters' device and its runtime, and the coordinator's agent
// (null without a coordinator) with the function that fills its step
// report.
struct StepPipelineParts {
  int rank = 0;
  std::vector<ParamView>* params = nullptr;
  const std::vector<Parameter*>* bound = nullptr;
  const MuonOptions* options = nullptr;
  const UpdateRule* rule = nullptr;
  OptimizerState* state = nullptr;
  device::Device device = device::Device::Host();
  device::Runtime* runtime = nullptr;
  Agent* agent = nullptr;
  std::function<void(v1::StepReport*)> fill_report;
};

// How the pipeline runs: the plan and its executor (owned from here on;
// the executor owns the step's kernels and Newton-Schulz engine), the
// ranks' flag exchange (check_finite and the commit agreement), how long
// the host waits for the caller's stream (seconds), the re-plan period in
// steps (0: never) and whether steps may begin during backward.
struct StepPipelineRun {
  v1::Plan plan;
  std::unique_ptr<StepExecutor> executor;
  std::unique_ptr<RankFlags> rank_flags;
  absl::Duration device_wait_timeout = absl::Minutes(30);
  int replan_every_steps = 0;
  bool overlap_backward = false;
  // Aborts this rank's communicators (data and control; any thread): what
  // a failure of this rank's own does when there is no coordinator to
  // tell. Null: nothing to abort.
  std::function<void()> abort_communicators;
};

// Whether steps begun by MarkReady check their gradients for NaN/Inf
// (check_finite set true with overlap_backward), and so keep a snapshot
// of parameters and state to undo a bad step.
inline bool ChecksFiniteUnderOverlap(const MuonOptions& options,
                                     bool overlap_backward) {
  return overlap_backward && options.check_finite.value_or(false);
}

class StepPipeline {
 public:
  StepPipeline(StepPipelineParts parts, StepPipelineRun run);

  // One step ordered on the caller's stream `stream` (a cudaStream_t of
  // the parameters' device; nullptr = the legacy default stream, and the
  // only value for CPU parameters), or the end of a step begun by
  // MarkReady. Errors: as Muon::StepOnStream.
  absl::Status Step(void* stream);

  // Muon::RefuseStep: `refusal` (not OK) takes the place of Preflight's
  // result in the step's agreement; returns it, or the agreement's error.
  absl::Status Refuse(absl::Status refusal);

  // Parameter `index`'s gradient is final for the coming step (overlap_
  // backward): its preflight and momentum, ordered on `stream` (the
  // cudaStream_t that produced the gradient; nullptr = the legacy default
  // stream, and the only value for CPU parameters, whose momentum runs at
  // once), and the buckets whose parameters are all ready to the executor,
  // whose streams wait for that work. Errors: as Muon::MarkReadyOnStream.
  absl::Status MarkReady(int index, void* stream);

  // Whether a step begun by MarkReady is in flight.
  bool in_overlapped_step() const { return overlap_begun_; }

  // The stream a Step, MarkReady or QK-clip (`what`, for messages) is
  // ordered on: nullptr for CPU parameters (which take no stream:
  // InvalidArgument otherwise), `native` (a cudaStream_t of the
  // parameters' device; nullptr = the legacy default stream) wrapped for
  // CUDA ones, valid until the next call with another handle.
  absl::StatusOr<device::Stream*> ResolveStream(void* native, const char* what);

  const v1::Plan& plan() const { return plan_; }
  const StepExecutor& executor() const { return *executor_; }
  const RankFlags& rank_flags() const { return *rank_flags_; }
  const StepStats& stats() const { return stats_; }
  int64_t step_count() const { return step_; }
  // A loaded state's step count (load_state_dict).
  void set_step_count(int64_t step) { step_ = step; }

  // Test-only fault injection: Muon::SetPostUpdateFaultForTesting.
  void SetPostUpdateFaultForTesting(
      std::function<absl::Status(int64_t step)> fault) {
    post_update_fault_ = std::move(fault);
  }

 private:
  // ---- Phases ----
  // At a re-plan boundary (step_ a positive multiple of replan_every_steps)
  // the coordinator's plan, and a new executor when it changed. Errors:
  // the Replan RPC's or the executor's, reported to the coordinator.
  absl::Status MaybeReplan();
  // Re-reads every bound Parameter's pointers and checks every gradient.
  absl::Status Preflight();
  // One bound Parameter's data and gradient into its view, after checking
  // their sizes (FailedPrecondition naming the parameter and rank); a
  // no-op for views given as ParamView.
  absl::Status BindOne(int index);
  // BindOne for every bound Parameter.
  absl::Status BindAll();
  // A gradient element that is NaN or Inf: its parameter (-1: none), its
  // local index and its value.
  struct NonFinite {
    int param = -1;
    int64_t index = -1;
    float value = 0.0f;
  };
  // Preflight, then check_finite's scan, agreed by every rank before
  // anything is modified: a rank whose Preflight fails returns its own
  // error and raises kPreflightRefused in the ranks' flags (in the finite
  // check's all-gather, or in one of its own without check_finite), so
  // that every other rank fails with PeerRefused naming it instead of
  // waiting in a collective. Errors: Preflight's (FailedPrecondition
  // naming the parameter), PeerRefused's, AgreeOnFinite's, the
  // communicator's.
  absl::Status CheckStepInputs(device::Stream* caller);
  // FailedPrecondition: rank `peer` refused this step's inputs; `outcome`
  // says what became of the step.
  absl::Status PeerRefused(int peer, const char* outcome) const;
  // A rank's flag when its Preflight failed (0 = OK, k + 1 = its first
  // non-finite parameter k, -1 = its scan could not be read).
  static constexpr float kPreflightRefused = -2.0f;
  // How a step that failed an agreement ended.
  static constexpr char kStepNotTaken[] =
      "; the step was not taken: parameters and momentum are unchanged on "
      "every rank";
  static constexpr char kStepUndone[] =
      "; the step was undone: parameters, momentum and step count are as "
      "before it on every rank";
  // check_finite: the local scan and the ranks' agreement.
  absl::Status CheckGradientsFinite(device::Stream* caller);
  // The local scan of parameters [begin, end): the first (optimizer order)
  // whose gradient holds NaN or Inf, or param = -1. LaunchNonFiniteScan,
  // then a wait for `caller`, then ReadNonFinite.
  absl::Status FindNonFinite(device::Stream* caller, int begin, int end,
                             NonFinite* found);
  // Enqueues the scan of parameters [begin, end) on `caller` (runs it at
  // once for nullptr): each gradient's first NaN/Inf index into its slot
  // of the state (OptimizerState::nonfinite_slot).
  absl::Status LaunchNonFiniteScan(device::Stream* caller, int begin, int end);
  // The first bad gradient among the slots of [begin, end), once their
  // scans have finished, with its value read from the gradient.
  absl::Status ReadNonFinite(int begin, int end, NonFinite* found);
  // The ranks' agreement on `found` (this rank's first bad gradient of the
  // step): FailedPrecondition on every rank when any rank has one (its own
  // naming the parameter, value and index; the others naming that rank),
  // saying the step was `undone` or not taken; *any_bad says whether one
  // had (false when the agreement itself failed).
  absl::Status AgreeOnFinite(const NonFinite& found, bool undone,
                             bool* any_bad);
  // Whether a step begun by MarkReady checks its gradients (check_finite
  // with overlap_backward): each is scanned at MarkReady, the ranks agree
  // at Step, and a bad step is undone from the snapshot taken at its
  // first MarkReady.
  bool overlap_checks_finite() const {
    return ChecksFiniteUnderOverlap(options_, overlap_);
  }
  // transactional_step, and check_finite with overlap_backward: parameters
  // and state into the snapshot; back.
  absl::Status TakeSnapshot(device::Stream* caller);
  absl::Status RestoreSnapshot(device::Stream* caller);
  // The momentum step on every local shard on `caller`, then the
  // executor's run.
  absl::Status MomentumAndExchange(device::Stream* caller);
  // Parameter `index`'s momentum step on `stream` (nullptr: the host), and
  // its update source for the executor (which forms Nesterov's U per
  // bucket, so no buffer of U persists).
  absl::Status MomentumOne(int index, device::Stream* stream);
  // The step's outcome on this rank: `own` (an error of this rank's own
  // outside any collective: reported so that every rank fails) or `run`
  // (the momentum and exchange; a failed collective's error becomes the
  // coordinator's job error; transactional_step: the ranks' agreement).
  absl::Status Commit(absl::Status own, absl::Status run);
  // transactional_step's agreement on the outcome after every data
  // collective: Aborted naming the first failed rank.
  absl::Status AgreeOnCommit(const absl::Status& local);
  // One float per rank all-gathered into rank_flags_ (0 = OK); errors
  // through the agent's OnStepFailed when there is one.
  absl::Status GatherRankFlags(float flag);
  // This rank's failure `own` while its peers may be in (or about to
  // enter) the step's collectives, which no agreement will tell them of.
  // With a coordinator it is reported (Agent::OnOwnFailure), which makes
  // it the job's error and aborts every rank's communicators; without
  // one, this rank's communicators are aborted, so that the peers'
  // collectives fail at once instead of at their timeout, or instead of
  // pairing with this rank's next collective. A world of one tells
  // nobody. Returns `own`.
  absl::Status FailedWithPeersWaiting(const absl::Status& own);
  // The step count, the step's time since `start` and the report.
  void Report(absl::Time start);

  // ---- The two schedules ----
  // The whole step at once, on `caller` (nullptr for CPU parameters).
  absl::Status RunStep(device::Stream* caller);
  // overlap_backward: the step's start at the first MarkReady (its
  // snapshot, under check_finite, taken on `producer` and waited for, so
  // that it precedes every momentum pass of the step on any stream); one
  // parameter's preflight, finite scan and momentum on `producer` (and,
  // for CPU parameters in debug mode, its gradient's fingerprint), with
  // the executor ordered after them; Step's end of a step begun by
  // MarkReady, the parameters not marked done on `caller`.
  absl::Status BeginOverlappedStep(device::Stream* producer);
  absl::Status ReadyOne(int index, device::Stream* producer);
  absl::Status FinishOverlappedStep(device::Stream* caller);
  // check_finite under overlap, this rank's own failure at Step (`own`,
  // e.g. a parameter left without a gradient) after the executor's Finish
  // (`finished`): the other ranks' agreement joined with "could not check"
  // when the collectives ran, `own` reported, the snapshot restored on
  // `caller`. Returns `own` as reported, saying the step was undone;
  // Internal when the restore failed too.
  absl::Status AbandonCheckedStep(device::Stream* caller,
                                  const absl::Status& own,
                                  const absl::Status& finished);
  // Restores the overlapped step's snapshot on `caller` after `failed`:
  // returns `failed`, or Internal naming both when the restore failed too.
  absl::Status UndoFromSnapshot(device::Stream* caller,
                                const absl::Status& failed);
  // Debug mode, CPU parameters: FailedPrecondition naming a gradient
  // changed since its MarkReady (its fingerprint differs).
  absl::Status CheckGradientsUnchanged() const;
  // check_finite under overlap, after every data collective of the step
  // ran on this rank: the scans read, the ranks' agreement (after a clean
  // run only, as transactional_step's), and the step undone from its
  // snapshot on `caller` on every rank when any rank had a bad gradient
  // or could not check. Errors: AgreeOnFinite's, or the read's, saying
  // the step was undone; Internal when the restore failed too.
  absl::Status AgreeOnFiniteOrUndo(device::Stream* caller);

  // ---- The caller's stream ----
  // Wrapped (cached per native handle).
  absl::StatusOr<device::Stream*> CallerStream(void* native);
  // Runs `work` (which enqueues on `caller`) inside caller->Launch, so that
  // the caller's device is current for it; at once for nullptr (host). A
  // template, so that the host path makes no std::function (a warm CPU
  // step allocates nothing).
  template <typename Work>
  absl::Status OnCaller(device::Stream* caller, Work&& work) {
    if (caller == nullptr) return work();
    return caller->Launch(device::StreamFn(std::forward<Work>(work)));
  }
  // Waits for the caller's stream (no-op for nullptr).
  absl::Status SyncCaller(device::Stream* caller);

  const int rank_;
  std::vector<ParamView>& params_;
  const std::vector<Parameter*>& bound_;
  const MuonOptions& options_;
  const UpdateRule& rule_;
  OptimizerState* const state_;
  const device::Device device_;
  device::Runtime* const runtime_;
  Agent* const agent_;
  const std::function<void(v1::StepReport*)> fill_report_;
  v1::Plan plan_;
  // CUDA: the caller's stream of the last step, wrapped (before executor_,
  // which refers to it during a step, so that it outlives the executor).
  std::unique_ptr<device::Stream> caller_;
  void* caller_native_ = nullptr;
  std::unique_ptr<StepExecutor> executor_;
  std::unique_ptr<RankFlags> rank_flags_;
  std::function<void()> abort_communicators_;
  const absl::Duration device_wait_timeout_;
  const int replan_every_steps_;
  int64_t replanned_at_ = -1;  // step_ of the last re-plan asked
  std::function<absl::Status(int64_t)> post_update_fault_;  // testing only
  // Set by Refuse for CheckStepInputs, which uses it instead of Preflight.
  absl::Status refusal_;
  // overlap_backward: on, a step begun by MarkReady, its parameters
  // marked, the buckets handed to the executor, gradient fingerprints
  // (CPU parameters in debug mode), and when it began.
  const bool overlap_;
  bool overlap_begun_ = false;
  std::vector<char> param_ready_;
  int enqueued_ready_ = 0;
  std::vector<uint64_t> grad_fingerprints_;
  absl::Time overlap_start_;
  StepStats stats_;
  int64_t step_ = 0;
};

// The kernels' dtype of a parameter or gradient dtype.
kernels::ParamDType KernelDType(DType dtype);

}  // namespace muon

#endif  // MUON_CLIENT_STEP_PIPELINE_H_
