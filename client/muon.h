// muon::Muon: torch.optim.Muon for C++, on one device or with parameters
// sharded over ranks (FSDP, DDP, ...).
//
// Single device (no DistributedConfig): per step and per 2-D parameter W
// with gradient G and momentum buffer B (torch.optim.Muon, PyTorch 2.9+):
//   B <- B.lerp(G, 1 - momentum)
//   U <- nesterov ? G.lerp(B, momentum) : B
//   O <- NS_k(U)                      (kernels/newton_schulz.h)
//   W <- W * (1 - lr * weight_decay)
//   W <- W - AdjustLR(lr, shape) * O
// Distributed: the same numbers (bitwise, in fp32) with each matrix
// orthogonalized exactly once in the world, by its owner rank (see
// client/step_executor.h); momentum buffers stay sharded like the
// parameters, so a checkpoint saves and restores per rank.
//
// Lifecycle: Create (validates arguments; in distributed mode joins the job
// through the coordinator and receives the plan) -> [fill grads, Step]* .
// Thread-compatible.
#ifndef MUON_CLIENT_MUON_H_
#define MUON_CLIENT_MUON_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/distributed_config.h"
#include "client/muon_options.h"
#include "client/optimizer_state.h"
#include "client/owner_transform.h"
#include "client/parameter.h"
#include "client/qk_clip.h"
#include "client/qk_clipper.h"
#include "client/rank_flags.h"
#include "client/step_executor.h"
#include "client/step_pipeline.h"
#include "client/step_snapshot.h"
#include "client/tensor_view.h"
#include "comm/communicator.h"
#include "control/agent.h"
#include "device/device.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "kernels/step_kernels.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

class CheckpointReader;

// The optimizer's memory on the parameters' device, in bytes, counted by
// the allocator it allocates through (device::CountingAllocator).
struct OptimizerMemory {
  // The momentum buffers: sum of local numel x the buffer dtype's size
  // (torch.optim.Muon's state for the same parameters).
  int64_t momentum_bytes = 0;
  // Everything that persists between steps: the momentum buffers,
  // NorMuon's row state and the finite check's results (8 bytes per
  // parameter).
  int64_t state_bytes = 0;
  // The snapshot of MuonOptions::transactional_step, or of check_finite
  // under overlap_backward (0 without either).
  int64_t snapshot_bytes = 0;
  // The step executor's buffers: (prefetch_count + 1) bucket slots
  // (this rank's U and O of the bucket's matrices, the owned matrices'
  // full U and O, and an owner transform's row state) and the exchange
  // buffers.
  int64_t buffer_bytes = 0;
  // On CUDA: the step kernels' scratch (the Newton-Schulz iteration's
  // bf16 or fp32 copies of the largest owned shape, and NorMuon's row
  // sums; allocated by the kernels themselves, not through the counted
  // allocator). 0 on the host.
  int64_t scratch_bytes = 0;
  // The largest total of state, snapshot and step buffers held at once so
  // far (a re-plan holds two executors' buffers for a moment), plus
  // scratch_bytes.
  int64_t peak_bytes = 0;
};

// One parameter's optimizer state on this rank, in torch's state_dict
// vocabulary (optimizer.state_dict()["state"][i]["momentum_buffer"]) plus
// what a resharding load needs: the global shape, the placements and the
// box of the global tensor this rank's shard covers.
struct ParamState {
  std::string name;                     // the parameter's name (the key)
  std::vector<int64_t> global_shape;    // [rows, cols] or [experts, rows, cols]
  std::vector<std::string> placements;  // DTensor spelling, one per mesh dim
  std::vector<Range> box;               // per tensor dim, the global range held
  std::vector<float> momentum_buffer;   // fp32, row-major, prod(box sizes)
  // The owner transform's row state (NorMuon's; empty without a
  // variant), saved under Muon::row_state_name(): fp32, one per row of the
  // box (prod(box sizes but the last)), as a [..., rows, 1] tensor.
  std::vector<float> row_state;
};

// The optimizer's state on one rank: rank-symmetric (every holder keeps the
// momentum of its own shard), so it saves and restores per rank without the
// plan.
struct OptimizerStateDict {
  int64_t step = 0;                // optimizer steps taken
  Mesh mesh;                       // the mesh the state was taken on
  std::string plan_hash;           // the plan it ran (informative)
  std::vector<ParamState> params;  // optimizer order
};

class Muon {
 public:
  // Creates the optimizer over views of the trainer's parameters
  // (client/tensor_view.h): the step reads each view's gradient and writes
  // its data in place; the optimizer owns only its momentum buffers (in
  // MuonOptions::momentum_dtype) and step buffers (OptimizerMemory). The memory
  // behind the views is not owned and must outlive the optimizer (or be
  // re-bound: SetGrad). Errors (all raised before any collective, with nothing
  // modified):
  //   InvalidArgument: an option out of range (names it and its value); a
  //     parameter that is not 2-D (names it and its shape), not contiguous,
  //     or without data; placements that do not fit the mesh; a custom
  //     assign_fn with a missing, duplicated or out-of-range owner (names
  //     the parameter and the ranks); manifests that disagree across ranks
  //     (from the coordinator, the same error on every rank).
  //   InvalidArgument: parameters on different devices (names two of them
  //     and their devices); CUDA parameters with a process group whose
  //     buffers are not on their device, or (world size > 1, check_finite or
  //     transactional_step) without a host control group.
  //   Unimplemented / FailedPrecondition: CUDA parameters in a build
  //     without CUDA, or on a device that is not visible.
  //   DeadlineExceeded / Unavailable: the coordinator or other ranks did
  //     not answer in time.
  static absl::StatusOr<std::unique_ptr<Muon>> Create(
      std::vector<ParamView> params, const MuonOptions& options = {},
      std::optional<DistributedConfig> distributed_config = std::nullopt);

  // The same over owning Parameters (client/parameter.h), which stay bound:
  // every Step re-reads their data and grad vectors, so grads may be
  // reassigned between steps. `params` are not owned and must outlive the
  // optimizer.
  // Errors: as above; InvalidArgument when a parameter's data size does not
  // match its local shape.
  static absl::StatusOr<std::unique_ptr<Muon>> Create(
      std::vector<Parameter*> params, const MuonOptions& options = {},
      std::optional<DistributedConfig> distributed_config = std::nullopt);

  ~Muon();

  // One optimizer step over every parameter. For CUDA parameters, the
  // same as StepOnStream(nullptr): ordered on CUDA's legacy default stream.
  // Errors: FailedPrecondition when a gradient is missing or has the wrong
  // size (names the parameter and rank; raised before any collective, with
  // parameters and state untouched); FailedPrecondition when, with
  // options.check_finite, a gradient on any rank holds NaN or Inf (names
  // the rank, the parameter, the value and the step, step_count() + 1;
  // raised on every rank before any data collective, parameters and
  // momentum untouched everywhere; a step begun by MarkReady is undone
  // instead, see MarkReady); communicator errors. With
  // options.transactional_step, any error leaves this rank's parameters,
  // momentum and step_count() as before the call (bitwise), and a failure
  // on any rank fails the step on every rank: the other ranks return
  // Aborted naming the failed rank and the step ("rank 0: rank 2 failed
  // step 3 ...; the step was rolled back"), or their collective's error.
  // A failure of this rank's own while its peers may be in the step's
  // collectives (no agreement can tell them) is made the job's error by
  // the coordinator; without a coordinator this rank aborts its
  // communicators (the DistributedState's communicator and control
  // group, which then stay unusable), so that the peers fail at once.
  absl::Status Step();

  // One step ordered on the caller's stream `stream` (a cudaStream_t of the
  // parameters' device, e.g. torch.cuda.current_stream().cuda_stream;
  // nullptr = the legacy default stream): the step reads the gradients
  // after the work enqueued on `stream` so far, and work enqueued on it
  // after the call sees the updated parameters. Returns once the step has
  // finished on the device (its status is known). The momentum pass,
  // finite check and snapshot run on `stream` itself; the exchanges and
  // Newton-Schulz on the optimizer's own streams (StepExecutor). The
  // host waits for `stream` once per step before the finite check's
  // agreement (check_finite) and on a rollback (transactional_step).
  // Errors: InvalidArgument (a non-null stream with CPU parameters); then
  // as Step.
  absl::Status StepOnStream(void* stream);

  // The trainer's own checks of this step's inputs failed on this rank
  // (`reason`, e.g. a gradient of another dtype than at Create, found by
  // the Python front before calling Step): takes this rank's part in the
  // step's agreement as a refusal, so that every other rank's Step fails
  // at once naming this rank ("rank R refused step S's inputs") with
  // nothing modified anywhere, instead of waiting in a collective. Nothing
  // is modified here either. Under overlap_backward no agreement precedes
  // the step's collectives: the refusal is this rank's own failure, sent to
  // the coordinator, which makes it the job error on every rank (a world
  // of one just returns it); during a step begun by MarkReady it is
  // refused (FailedPrecondition): Step finishes that step. Returns
  // FailedPrecondition with `reason` (or the agreement's error).
  absl::Status RefuseStep(absl::string_view reason);

  // Test-only fault injection (MuonOptions::transactional_step's tests):
  // `fault`, when set, runs on this rank after the executor has updated the
  // parameters and before the commit agreement; a non-OK status counts as
  // this rank's step failing there (e.g. a local apply error after the last
  // data collective), in a step begun by MarkReady as in any other.
  // Argument: the step being taken (step_count() + 1).
  void SetPostUpdateFaultForTesting(
      std::function<absl::Status(int64_t step)> fault) {
    pipeline_->SetPostUpdateFaultForTesting(std::move(fault));
  }

  // Re-binds parameter `index`'s gradient (same dtype, shape and strides as
  // given at Create; nullptr = no gradient). For trainers whose gradient
  // tensor moves between steps (torch's zero_grad(set_to_none=True)).
  // Errors: OutOfRange for a bad index.
  absl::Status SetGrad(int index, const void* grad);

  // Sets parameter `index`'s learning rate, weight decay and momentum
  // from the next Step on (torch's param groups: each group's current
  // "lr", "weight_decay" and "momentum", e.g. as OneCycleLR or CyclicLR
  // set them; torch.optim.Muon reads them at every step). Unset parameters
  // use MuonOptions' values.
  // Errors: OutOfRange for a bad index; InvalidArgument for a negative or
  // NaN value (torch's messages), FailedPrecondition during a step begun
  // by MarkReady, with nothing changed.
  absl::Status SetParamHyperparameters(int index, double lr,
                                       double weight_decay, double momentum);

  // QK-clip after a step (MuonOptions::qk_clip; client/qk_clip.h):
  // `max_logits` holds this rank's largest pre-softmax logit per query head
  // from the step's forward pass, the layers' heads one after another
  // (qk_clip.total_heads() values; -inf, or any value <= the threshold,
  // for a head this rank did not compute). The ranks' values are reduced
  // with MAX (an all-gather of total_heads() + 1 floats per rank on the
  // host control group: ranks with other data, other heads under TP, or
  // other stages under PP all contribute), then every rank scales the rows
  // of its own shards that belong to a clipped group. Collective: every
  // rank calls it (after Step), with the same options. The same bits on
  // every layout as on one device.
  // Errors (every rank, before anything is scaled): FailedPrecondition
  // (qk_clip has no layers; a world without a host control group);
  // InvalidArgument naming a rank whose layers differ from rank 0's, or
  // that passed the wrong number of values, a NaN or +inf (its own message
  // on that rank); the communicator's.
  absl::Status ClipQk(const std::vector<float>& max_logits,
                      QkClipStats* stats = nullptr);
  // ClipQk with the row scaling ordered on `stream` (a cudaStream_t of the
  // parameters' device, e.g. torch.cuda.current_stream().cuda_stream;
  // nullptr = the legacy default stream), as StepOnStream orders a step:
  // the maxima's all-gather runs on the host control group before it
  // returns, the scaling is enqueued there without a host wait. For CPU
  // parameters `stream` must be nullptr and this is ClipQk. Create and
  // SetQkClip refuse qk_clip layers on CUDA parameters in this version.
  // Errors: as ClipQk; InvalidArgument (a stream with CPU parameters);
  // FailedPrecondition (during a step begun by MarkReady); the CUDA error.
  // A rank refused for its own reason still joins the collective, so that
  // every rank fails.
  absl::Status ClipQkOnStream(const std::vector<float>& max_logits,
                              void* stream, QkClipStats* stats = nullptr);

  // Starting the step during backward (DistributedConfig::execution.
  // overlap_backward: the plan orders buckets from the last matrix to the
  // first). Marks parameter `index`'s gradient final for the coming step:
  // its momentum is computed at once on the calling thread for CPU
  // parameters (enqueued on the legacy default stream for CUDA ones; see
  // MarkReadyOnStream) (Nesterov's U is formed from the gradient at its
  // bucket's gather), and every bucket
  // whose parameters on this rank are all ready
  // now (a prefix of the plan's bucket order) is handed to the executor's
  // streams, which exchange and orthogonalize it while the caller goes on
  // (a rank that is ahead waits for the others inside the collective, on
  // the communication stream's thread). Step then marks the rest and
  // finishes. The first MarkReady of a step begins it (a re-plan boundary
  // switches plans there). With gradient accumulation, mark a parameter
  // only in the last micro-batch's backward. Results are bitwise those of
  // the same job without overlap. The gradient must not change after its
  // parameter is marked until Step returns (the step reads it at MarkReady
  // and again at its bucket's gather); in the debug
  // (sequential) mode Step checks that and returns FailedPrecondition
  // naming the parameter. Every rank must mark every parameter it holds
  // (or leave it to Step) in each step. With check_finite set true, a
  // gradient holding NaN or Inf on any rank makes Step return
  // FailedPrecondition on every rank (MuonOptions::check_finite's
  // messages, naming each rank's first bad gradient in optimizer order,
  // not in marking order), with parameters, momentum and step count as
  // before the step's first MarkReady.
  // Errors: OutOfRange (bad index); FailedPrecondition (overlap_backward
  // off; marked twice in one step; no gradient); the executor's enqueue
  // errors. Create refuses overlap_backward with transactional_step on, or
  // CUDA parameters (InvalidArgument).
  absl::Status MarkReady(int index);
  // MarkReady ordered on `stream`, the cudaStream_t that produced the
  // gradient (a post-accumulate-grad hook's torch.cuda.current_stream();
  // nullptr = the legacy default stream), as StepOnStream orders a step:
  // the gradient's finite scan and momentum pass are enqueued there, and
  // the executor's streams wait for them on an event recorded there; the
  // caller goes on without a host wait (the first MarkReady of a step
  // with check_finite waits once for its snapshot). For CPU parameters
  // `stream` must be nullptr (InvalidArgument otherwise) and this is
  // MarkReady. With CUDA parameters, a gradient changed after its mark is
  // not detected (the debug mode's check reads host memory). The step
  // reads the parameters after the streams its gradients were marked on
  // (the snapshot after the first's): work that writes parameters on
  // another stream (ClipQkOnStream's scaling, a trainer's own writes)
  // must be ordered before them by the caller, as a torch stream's user
  // orders work across streams (wait_stream).
  // Errors: as MarkReady; InvalidArgument (a stream with CPU parameters);
  // the CUDA error.
  absl::Status MarkReadyOnStream(int index, void* stream);

  // Replaces MuonOptions::qk_clip (the C ABI and Python configure it after
  // construction). Local: no collective. All or nothing.
  // Errors: InvalidArgument as Create's qk_clip checks.
  absl::Status SetQkClip(const QkClipOptions& qk_clip);

  // Clears every gradient to zero (keeps sizes). Bound Parameters only;
  // trainers zero their own gradients.
  void ZeroGrad();

  // This rank's state (torch's optimizer.state_dict()): a copy of the step
  // count and of each parameter's momentum shard with its layout.
  OptimizerStateDict state_dict() const;
  // state_dict() without the values (no device copies; empty momentum
  // buffers and row states): names, global shapes and boxes, for a caller
  // to fill and hand to load_state_dict (as Load does).
  OptimizerStateDict StateLayout() const;

  // Restores a state_dict() taken on the same layout (same parameter names,
  // global shapes and boxes on this rank; torch's load_state_dict). Every
  // check comes before any write: on a checking error the optimizer is
  // untouched. A device error while copying into CUDA buffers (after the
  // checks) leaves the parameters before the failing one loaded.
  // Errors: InvalidArgument naming the parameter and expected vs actual
  // (missing or extra parameter, other global shape, other box, wrong
  // buffer size; a step outside [0, kMaxCheckpointStep]);
  // FailedPrecondition during a step begun by MarkReady; the device's
  // error naming the parameter.
  absl::Status load_state_dict(const OptimizerStateDict& state);

  // Writes this rank's state to DIR/rank_<rank>.safetensors (safetensors
  // format, one tensor "<param>.momentum_buffer" per parameter) and, on
  // rank 0, DIR/metadata.json (mesh, placements, plan hash, step, format
  // version); see checkpoint/checkpoint.h. Every rank calls it (no collective
  // runs: the caller synchronizes before reading the directory).
  // Errors: those of WriteCheckpointShard (I/O, naming the path), with the
  // rank; FailedPrecondition during a step begun by MarkReady.
  absl::Status Save(const std::string& dir) const;

  // Reads the state of every parameter from a checkpoint written by Save in
  // any layout and world size (FSDP over 4 -> over 2, FSDP -> TP x FSDP,
  // DDP -> FSDP, ...): each rank reads exactly the regions of the saved
  // shards its own shard covers (as torch.distributed.checkpoint does). All
  // or nothing: on error the optimizer is untouched.
  // Errors: those of CheckpointReader::Open / ReadRegion, naming the file,
  // the parameter and expected vs actual (NotFound for a missing
  // parameter, InvalidArgument for another global shape, DataLoss for a
  // truncated or corrupted file or a region the checkpoint does not cover,
  // FailedPrecondition for an unknown format version, during a step begun
  // by MarkReady, or for a variant's row state this optimizer does not
  // keep).
  absl::Status Load(const std::string& dir);

  // The parameters as the optimizer sees them, in order.
  const std::vector<ParamView>& params() const { return params_; }
  // The plan (owners, buckets, loads, hash) this optimizer runs.
  const v1::Plan& plan() const { return pipeline_->plan(); }
  // rank -> indices of the matrices that rank orthogonalizes, as the plan
  // says. Indices are parameter indices when every parameter is 2-D; with
  // expert stacks, positions in matrices().
  // Matrices of parameters other ranks hold (other pipeline stages) are not
  // listed.
  std::map<int, std::vector<int>> assignments() const;
  // This rank's matrices in order: a 2-D parameter is one, a stack one per
  // expert slice (what an assign_fn sees).
  const std::vector<MatrixInfo>& matrices() const { return matrices_; }
  int current_rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Counters and timings of the last Step on this rank.
  const StepStats& last_step_stats() const { return pipeline_->stats(); }
  // This rank's optimizer memory on the parameters' device (counted from
  // Create on; exact at any time).
  OptimizerMemory memory() const;
  // The last step as the report a rank sends its coordinator: counters and
  // the per-operation timings (CUDA: the device times of CUDA events
  // around each operation; the host: the host clock around its work),
  // seconds since the Unix epoch. job_id and incarnation are left unset.
  void FillStepReport(v1::StepReport* report) const;
  int64_t step_count() const { return pipeline_->step_count(); }
  // True from the first MarkReady of a step to the Step that finishes it:
  // the executor's threads then read and write the parameters, momentum
  // buffers and row state: load_state_dict, Save and Load are refused
  // (FailedPrecondition), and state_dict, momentum_buffer and row_state
  // would race (the C ABI refuses its calls that read them).
  bool in_overlapped_step() const { return pipeline_->in_overlapped_step(); }
  // FailedPrecondition naming the rank and `what` (e.g. "Save") during a
  // step begun by MarkReady (in_overlapped_step()); OK otherwise. The C
  // ABI refuses its state reads with it.
  absl::Status RefuseInOverlappedStep(absl::string_view what) const;
  // A host copy of parameter i's momentum buffer (local shard, fp32,
  // row-major; zeros before the first step), copied from the parameters'
  // device. Empty when that copy fails (a CUDA error; Save reports it).
  std::vector<float> momentum_buffer(int i) const;
  // A host copy of parameter i's row state of the owner transform
  // (NorMuon's; fp32, one per local row: [local experts, local rows] for a
  // stack); empty without a variant or when the copy fails.
  std::vector<float> row_state(int i) const;
  // The row state's key in state_dict and checkpoints (NorMuon:
  // "variance_neuron"); empty without a variant.
  std::string row_state_name() const;
  // The parameters' device (all of them share it).
  const device::Device& device() const { return device_; }
  const MuonOptions& options() const { return options_; }
  // The agent when a coordinator is configured, else nullptr.
  Agent* agent() { return agent_.get(); }

 private:
  Muon() = default;
  // Create's stages: the plan (from the coordinator, or local), then the
  // communicator, Newton-Schulz engine and step executor. `manifest_of(r)`
  // is rank r's manifest as this rank derives it: a coordinator gets only
  // this rank's (O(parameters)); a local plan needs every rank's.
  using ManifestOf = std::function<absl::StatusOr<v1::RankManifest>(int)>;
  // Create's first stage: the parameters' device and runtime, the options
  // resolved against them (ResolveOptions), the counting allocators, and
  // the job's shape from `config.state`. Errors: InvalidArgument (the
  // parameters on two devices, an option that does not fit), the runtime's
  // own when the device cannot be used.
  absl::Status Bind(std::vector<ParamView> params, const MuonOptions& options,
                    const DistributedConfig& config);
  // Create's last stage, once the plan is in `run.plan`: the update rule,
  // the data path (MakeDataPath), the optimizer state and the step pipeline.
  absl::Status MakePipeline(const DistributedConfig& config,
                            std::vector<MatrixGeometry> geometry,
                            StepPipelineRun run);
  absl::Status JoinOrPlan(const DistributedConfig& config,
                          const ManifestOf& manifest_of, bool uses_sub_mesh,
                          v1::Plan* plan);
  // The step's communicators: `comm` the data path's (a world of one when
  // the config has none; staged through host memory for CUDA parameters
  // over a host group), `control` the host group for the control values or
  // null. Errors: InvalidArgument naming the group or option that does not
  // fit (CheckDeviceSupport).
  absl::Status ChooseCommunicators(const DistributedState& state,
                                   Communicator** comm, Communicator** control);
  // The executor's options from the resolved options and the parameters.
  ExecutorOptions MakeExecutorOptions(
      const v1::ExecutionOptions& execution) const;
  // The executor over `run->plan` and the ranks' flag exchange into *run.
  absl::Status MakeDataPath(const DistributedConfig& config,
                            std::vector<MatrixGeometry> geometry,
                            StepPipelineRun* run);
  // Checks that checkpoint `reader` holds no row state of a variant this
  // optimizer does not run for parameter `name` (NorMuon's
  // "variance_neuron" into a plain Muon, which would drop it silently):
  // FailedPrecondition naming the tensor.
  absl::Status RefuseUnkeptRowState(const CheckpointReader& reader,
                                    const std::string& name) const;
  // What of parameter i's entry `got` in a loaded state_dict differs from
  // this optimizer's layout `want` (name, global shape, shard box, momentum
  // buffer or row state size), as load_state_dict names it; empty when
  // nothing does.
  std::string StateMismatch(size_t i, const ParamState& want,
                            const ParamState& got) const;
  // The optimizer's state on the parameters' device (OptimizerState), at
  // Create, with a snapshot of parameters and state when `snapshot`; its
  // row state bound to `executor`.
  absl::Status AllocateState(StepExecutor* executor, bool snapshot);
  // What the step pipeline works on (this optimizer's members).
  StepPipelineParts PipelineParts();
  // QkClipper's view of this rank (its parameters, placements, mesh and
  // control group, once the pipeline exists).
  QkClipRank QkClipView() const;
  // Whether this rank's Newton-Schulz is the CPU one (OpenBLAS): CPU
  // parameters orthogonalized on the host, not on a GPU.
  bool RunsCpuNewtonSchulz() const;

  std::vector<ParamView> params_;           // views; the memory is not owned
  Mesh mesh_;                               // the job's device mesh
  std::vector<ParamPlacement> placements_;  // per parameter
  std::vector<Parameter*> bound_;           // Not owned; empty unless bound
  MuonOptions options_;
  UpdateRule rule_;
  int rank_ = 0;
  int world_size_ = 1;
  // A world of one, or the staging over a host group for CUDA parameters.
  std::unique_ptr<Communicator> owned_comm_;
  Communicator* comm_ = nullptr;  // the step's communicator; Not owned
  // The parameters' device, its runtime (not owned) and this optimizer's
  // elementwise kernels there (momentum, finite check, snapshot copies).
  device::Device device_;
  device::Runtime* runtime_ = nullptr;
  // Counting allocators over runtime_'s: the whole, and under it the
  // state, the snapshot and the executor's buffers (OptimizerMemory).
  // Declared before every buffer, so they outlive them.
  struct MemoryCounters {
    explicit MemoryCounters(device::Allocator* base)
        : total(base), state(&total), snapshot(&total), buffers(&total) {}
    device::CountingAllocator total, state, snapshot, buffers;
  };
  std::unique_ptr<MemoryCounters> memory_;
  std::unique_ptr<Agent> agent_;
  // Momentum buffers, row state, finite-check results and snapshot on
  // the parameters' device (U and O live in the executor's bucket slots).
  // Declared before pipeline_: an executor that finishes a step in flight
  // when it is destroyed (MarkReady without Step) still reads them.
  std::unique_ptr<OptimizerState> state_;
  // The step: its phases, the plan, the executor (which owns the step's
  // kernels and Newton-Schulz engine), the step count and stats.
  std::unique_ptr<StepPipeline> pipeline_;
  // The variant run on each owner after Newton-Schulz (NorMuon; null:
  // none); its row state is in state_.
  std::shared_ptr<const OwnerTransform> owner_transform_;
  // QK-clip over this rank's shards (no layers: off).
  QkClipper qk_clipper_;
  bool uses_sub_mesh_ = false;  // some parameter lives on a sub-mesh
  std::vector<MatrixInfo> matrices_;
};

}  // namespace muon

#endif  // MUON_CLIENT_MUON_H_
