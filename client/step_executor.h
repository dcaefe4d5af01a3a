// Executes the distributed part of one Muon step for one rank, following the
// stream schedule of the coordinator's plan (plan/schedule.h): per bucket,
// gather shards of the update U to their owners, orthogonalize on the owner
// (Newton-Schulz), redistribute O back to every holder, apply.
//
// The operations run on device streams (device/stream.h), ordered by
// events, as torchtitan's FlexShard runtime and c10d order collectives and
// compute with CUDA events:
//   Sequential (debug): every operation on one "main" stream, each waiting
//     for the previous one; owners orthogonalize in rank order (rank i runs
//     its Newton-Schulz between the i-th and (i+1)-th barrier of the
//     bucket), so timings are exact per operation.
//   Async: gathers, redistributes and applies on a "comm" stream,
//     Newton-Schulz on a "compute" stream. Per bucket slot, one event says
//     "gathered" (comm -> compute) and one "orthogonalized" (compute ->
//     comm); up to prefetch_count buckets are gathered ahead into
//     (prefetch_count + 1) preallocated bucket slots, and a slot is gathered
//     into again only after the comm stream has applied its previous
//     bucket (the slot holds that bucket's local O until then).
// Both modes compute the same numbers in the same order per matrix: the
// results are bitwise identical. Host streams (this executor's streams
// today) run each stream's work on a thread of its own.
//
// Built once from the plan and the layout: construction precomputes, per
// bucket, the exact all-to-all(v) split sizes and region copies of both
// exchanges, and preallocates every buffer, so a step allocates nothing.
// The same executor serves a world of one (single device: every copy is
// local and no collective runs) and any world size. Every rank issues
// exactly one AllToAllV per bucket each way (or, with custom gather_fn /
// redistribute_fn, one call per matrix) in the schedule's order, the same
// on every rank.
//
// Lifecycle: Create -> Run* -> destroy (drains and joins the streams).
// Thread-compatible: one thread calls Run at a time; the communicator is
// used only by the stream running the exchanges, inside Run.
#ifndef MUON_CLIENT_STEP_EXECUTOR_H_
#define MUON_CLIENT_STEP_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/bucket_layout.h"
#include "client/distributed_config.h"
#include "client/exchange_plan.h"
#include "client/op_timer.h"
#include "client/owner_transform.h"
#include "client/stream_ops.h"
#include "client/tensor_view.h"
#include "client/update_rule.h"
#include "comm/communicator.h"
#include "common/layout.h"
#include "device/memory.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "kernels/step_kernels.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Per-step counters of one rank (summed over the world they equal the
// single-device figures: zero redundancy).
struct StepStats {
  int matrices_orthogonalized = 0;
  double ns_flops = 0;     // Newton-Schulz FLOPs (NewtonSchulzFlops)
  int64_t bytes_sent = 0;  // fp32 payload sent to other ranks
  int64_t bytes_received = 0;
  double step_time_s = 0;
  std::vector<OpRecord> ops;  // per bucket and operation, by start time
  // Preallocated buffers of the step executor (bucket slots: this rank's
  // U and O of the bucket's matrices, the owned matrices' full U and O;
  // and the exchange buffers), in bytes, and their bound:
  // (prefetch_count + 1) slots of the largest bucket plus the exchange
  // buffers.
  int64_t buffer_bytes = 0;
  int64_t buffer_bound_bytes = 0;
};

// Where this rank's shard of a parameter's update U comes from, in the
// executor's device memory, with the parameter's local layout (element i
// of the shard at index i; expert slices one after another):
//   grad == nullptr: U is `momentum` (fp32 read in place; bf16 widened
//     into the bucket's slot);
//   grad != nullptr: Nesterov, U = lerp(grad, momentum, rule.MomentumOf(param))
//     (torch's grad.lerp(buf, momentum)), formed in fp32 in the bucket's
//     slot just before the bucket's gather (kernels::StepKernels::
//     FormUpdate), so no buffer of U outlives its bucket.
struct UpdateSource {
  const void* momentum = nullptr;
  kernels::ParamDType momentum_dtype = kernels::ParamDType::kFloat32;
  const void* grad = nullptr;
  kernels::ParamDType grad_dtype = kernels::ParamDType::kFloat32;
  // Whether the executor forms U in a slot (not read in place).
  bool formed() const {
    return grad != nullptr || momentum_dtype != kernels::ParamDType::kFloat32;
  }
};

// Where an executor runs: its streams, buffers and kernels.
struct ExecutorOptions {
  // The host (OpenBLAS, Gloo or local exchanges) or a CUDA device (cuBLAS
  // Newton-Schulz, NCCL exchanges; every buffer in that device's memory).
  device::Device device = device::Device::Host();
  // Arithmetic of Newton-Schulz on CUDA (bf16 with fp32 accumulation by
  // default, as torch.optim.Muon's bfloat16 iteration). Unused on the host.
  kernels::GpuPrecision precision = kernels::GpuPrecision::kBf16;
  // On CUDA: how long Finish waits for a step's streams before it aborts
  // the communicator (a peer that hangs without an error). Host streams
  // are bounded by the communicator's own timeout.
  absl::Duration step_timeout = absl::Minutes(30);
  // The gather and the redistribute carry bf16 (half the bytes; as
  // torchtitan, microsoft/dion and Megatron-LM exchange): Newton-Schulz
  // (fp32) sees U rounded to bf16 (to nearest even), the parts sent and the
  // owner's own alike, and the owner rounds O to bf16 before every holder,
  // itself included, applies it. So the result does not depend on the
  // layout or on which rank owns a matrix, and replicas stay equal.
  // false: fp32, the single device's bits.
  bool bf16_exchange = false;
  // A variant run on the owner after Newton-Schulz (NorMuon,
  // client/normuon.h; null: none): each matrix's row state (BindRowState)
  // travels with the gather to the owner, which transforms O with it, and
  // back with the redistribute to every holder of those rows. Host only;
  // fp32 exchange and the built-in exchange only (ResolveOptions refuses
  // the rest).
  std::shared_ptr<const OwnerTransform> owner_transform;
  // The allocator of every buffer (not owned; outlives the executor; of
  // `device`); nullptr = the device runtime's.
  device::Allocator* allocator = nullptr;
  // The steps pass UpdateSources that are formed (Nesterov, or a bf16
  // momentum buffer): each bucket slot gets room for the bucket's local U
  // (this rank's shard elements of the bucket's matrices, fp32). Run
  // refuses formed sources without it.
  bool form_update = false;
  // The Newton-Schulz the steps will run (the rule's): Create reserves its
  // scratch for it (on CUDA the Gram iteration needs two more m x m
  // buffers), so that no step allocates. Only the method, the iteration
  // count and the restart are read.
  kernels::NewtonSchulzOptions ns;
};

class StepExecutor {
 public:
  // `ns_engine` orthogonalizes on the host (shared with the executors
  // ForPlan makes; null on CUDA, where the executor's own CUDA kernels
  // run Newton-Schulz). The executor owns the step's kernels (kernels()).
  // `matrices` are the matrices of this rank's parameters; the plan may
  // hold more (other pipeline stages), which this rank skips with zero
  // split sizes while still joining every bucket's collectives. The plan
  // must carry its schedule (Plan.schedule). `comm` may be nullptr only
  // when world_size == 1. gather_fn / redistribute_fn may be empty (packed
  // all-to-all(v)).
  // Errors: InvalidArgument when the plan does not cover every local matrix
  // exactly once, disagrees on a shape, names an owner that holds no shard,
  // or has no schedule for this rank (names the matrix and parameter); on
  // a CUDA device, custom gather/redistribute functions (they take host
  // memory). The device's errors (Unimplemented: CUDA in a build without
  // it; FailedPrecondition: no such device).
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(
      int rank, int world_size, const v1::Plan& plan,
      std::vector<MatrixGeometry> matrices, Communicator* comm,
      GatherFn gather_fn, RedistributeFn redistribute_fn,
      std::shared_ptr<kernels::NsEngine> ns_engine,
      const ExecutorOptions& options = ExecutorOptions());

  // An executor for `plan` (a re-plan of the same job) with this one's
  // rank, matrices, communicator, gather/redistribute functions and
  // Newton-Schulz engine. Errors: those of Create.
  absl::StatusOr<std::unique_ptr<StepExecutor>> ForPlan(
      const v1::Plan& plan) const;

  ~StepExecutor();

  // The owner transform's state: `row_state[i]` is parameter i's row state on
  // this rank (float32, memory of device(): one float per local row of each of
  // its matrices, [local experts, local rows] for a stack; nullptr for a
  // parameter with no local rows), read and updated by every Run; not
  // owned, must stay valid while steps run. Carried over by ForPlan.
  void BindRowState(std::vector<float*> row_state) {
    row_state_ = std::move(row_state);
  }

  // Runs gather -> orthogonalize -> redistribute -> apply for every bucket.
  // `updates[i]` says where this rank's shard of U for parameter i comes
  // from (UpdateSource: local shape, row-major, read only); `params[i]` views
  // its local shard of W (3-D stacks: [local experts, rows, cols]; float32 or
  // bfloat16, contiguous; `updates` and the parameters are memory of device(),
  // checked by the caller), updated in place:
  // W *= (1 - lr*wd); W -= AdjustLR(lr, global shape) * O (bf16: each op
  // computed in fp32 and rounded to nearest even, kernels::ApplyUpdate).
  // Errors: whatever the communicator or a custom function returns; on an
  // error some parameters may already be updated (a failed collective
  // leaves the world inconsistent; the job must restart from a checkpoint,
  // unless MuonOptions::transactional_step has Muon restore them).
  // `caller` (optional): as Enqueue's; Run is Enqueue then Finish.
  absl::Status Run(const std::vector<UpdateSource>& updates,
                   const std::vector<ParamView>& params, const UpdateRule& rule,
                   StepStats* stats, device::Stream* caller = nullptr);
  // Run with U given: updates[i] is parameter i's local U (fp32, read in
  // place). Allocates the sources once per call (tests and tools).
  absl::Status Run(const std::vector<const float*>& updates,
                   const std::vector<ParamView>& params, const UpdateRule& rule,
                   StepStats* stats, device::Stream* caller = nullptr);

  // Run in two halves, for a step ordered on the caller's stream with no
  // host wait (c10d's Work; torch's current stream). Enqueue puts the
  // step's work on this executor's streams after the work enqueued on
  // `caller` so far, and makes the work the caller enqueues afterwards
  // wait for the step; it returns at once. `caller` is a stream of this
  // executor's device, or nullptr (no ordering: the step starts now).
  // `updates`, `params` and `rule` must stay valid until Finish returns.
  // Finish blocks until the step has finished on this executor's streams
  // and returns its status and stats (as Run). Each Enqueue needs its
  // Finish before the next Enqueue.
  // On CUDA, Finish polls the communicator's asynchronous errors while it
  // waits and aborts the communicator on one (a failed NCCL peer never
  // completes the stream), so it returns once the streams have drained.
  // After an Enqueue error the caller's stream is still ordered after what
  // was enqueued. Destroying the executor finishes a step in flight.
  // Errors: FailedPrecondition (a step is in flight); InvalidArgument
  // (`caller` on another device); the streams' errors; then as Run.
  absl::Status Enqueue(const std::vector<UpdateSource>& updates,
                       const std::vector<ParamView>& params,
                       const UpdateRule& rule, device::Stream* caller);
  // Enqueue with U given (as Run's overload).
  absl::Status Enqueue(const std::vector<const float*>& updates,
                       const std::vector<ParamView>& params,
                       const UpdateRule& rule, device::Stream* caller);
  absl::Status Finish(StepStats* stats);

  // Enqueue in pieces, for a step that starts during backward
  // (ExecutionOptions.overlap_backward): Begin takes Enqueue's arguments
  // and enqueues nothing; EnqueueReady(k) enqueues, in the schedule's
  // order, every operation of the first k buckets (positions in the plan's
  // bucket order) not enqueued yet, stopping at the first operation of a
  // later bucket, so every rank still issues the same collectives in the
  // same order; Finish enqueues the rest, then waits. Enqueue is Begin,
  // then the whole schedule. The updates of a bucket's parameters must be
  // final before EnqueueReady lets it run (its gather reads them on the
  // executor's streams, while the caller goes on).
  // Errors: FailedPrecondition (a step in flight, or EnqueueReady outside
  // one); InvalidArgument (a formed source without
  // ExecutorOptions::form_update; the wrong number of sources); the first
  // enqueue error, again on every later call; as Enqueue.
  absl::Status Begin(const std::vector<UpdateSource>& updates,
                     const std::vector<ParamView>& params,
                     const UpdateRule& rule, device::Stream* caller);
  absl::Status EnqueueReady(int ready_buckets);
  // During a step begun by Begin: the work this executor's streams are
  // given from now on (by EnqueueReady and Finish) starts once the work
  // enqueued on `producer` so far has finished (cudaEventRecord on
  // `producer`, cudaStreamWaitEvent on each stream): a gradient's momentum
  // pass enqueued during backward on the stream that produced the
  // gradient. Any number of producer streams, each with an event of its
  // own (a host event is recorded from one stream at a time); nullptr is
  // a no-op (work done on the calling thread is ordered already).
  // Errors: FailedPrecondition (outside a step, or after its enqueue
  // ended); InvalidArgument (`producer` on another device); the runtime's,
  // which also fail the step (nothing more is enqueued, Finish returns it).
  absl::Status OrderAfter(device::Stream* producer);
  // How many buckets, from the first in the plan's order, have every
  // matrix of this rank in a parameter i with param_ready[i] set (a bucket
  // with none of this rank's matrices is ready).
  int ReadyBuckets(const std::vector<char>& param_ready) const;

  const device::Device& device() const { return options_.device; }

  // The step's kernels on this executor's device, for every pass of the
  // step (the momentum, the finite check and the snapshot run them on the
  // caller's stream; Newton-Schulz on the executor's).
  kernels::StepKernels& kernels() const { return *kernels_; }
  // Bytes of the executor's device memory its kernels hold as scratch
  // (StepKernels::ScratchBytes: Newton-Schulz's, and NorMuon's row sums;
  // 0 on the host).
  int64_t kernel_scratch_bytes() const { return kernels_->ScratchBytes(); }

  bool async() const { return ops_.async; }
  int prefetch_count() const { return ops_.prefetch_count; }

  // The event waits of the async schedule. For tests that prove a missing
  // dependency is caught (by ThreadSanitizer or a wrong result): a dropped
  // wait lets the two streams touch a bucket slot at the same time.
  enum class EventWait {
    kNone,
    kGatheredBeforeOrthogonalize,       // compute waits for the slot's gather
    kOrthogonalizedBeforeRedistribute,  // comm waits for Newton-Schulz
  };
  void DropEventWaitForTesting(EventWait wait) { dropped_wait_ = wait; }

 private:
  // OrderAfter's event record and waits, with the event of `key` (made at
  // its first use).
  absl::Status OrderAfterProducer(device::Stream* producer, const void* key);

  // Arguments of the step in flight (set by Run, read by the streams).
  struct StepArgs {
    const std::vector<UpdateSource>* updates = nullptr;
    const std::vector<ParamView>* params = nullptr;
    const UpdateRule* rule = nullptr;
  };

  StepExecutor(int rank, int world_size, Communicator* comm,
               std::vector<MatrixGeometry> matrices, BucketLayout layout,
               StreamOps ops, GatherFn gather_fn,
               RedistributeFn redistribute_fn, const ExecutorOptions& options);
  // The U-given overloads' sources (given_updates_). Errors:
  // FailedPrecondition (a step in flight).
  absl::Status GiveUpdates(const std::vector<const float*>& updates);
  // Begin's check: a source and a parameter for every local matrix, and
  // room for formed sources. Errors: InvalidArgument.
  absl::Status CheckUpdateSources(const std::vector<UpdateSource>& updates,
                                  const std::vector<ParamView>& params) const;
  // The streams and the kernels on options_.device.
  absl::Status CreateStreamsAndKernels();
  // Waits for a stream; on CUDA polls the communicator's asynchronous
  // errors meanwhile and aborts it on the first one.
  absl::Status WaitForStream(device::Stream* stream);
  // The preallocated buffers (exchange buffers, bucket slots, records)
  // and the events of the schedule.
  absl::Status AllocateBuffers();
  // Element `offset` of local matrix m's bucket slot (device memory).
  float* InSlot(int m, int64_t offset);
  float* FullU(int m);
  float* FullO(int m);
  // This rank's box of O of local matrix m, in its bucket's slot.
  float* LocalO(int m);
  // This rank's box of U of local matrix m: formed in its bucket's slot,
  // or the source's fp32 momentum in place.
  const float* LocalU(int m, const std::vector<UpdateSource>& updates);
  // Forms the local U of bucket b's matrices whose sources are formed.
  absl::Status FormUpdates(const LocalBucket& bs, const StepArgs& args,
                           device::Stream* stream);
  // One exchange of the step (the gather when to_owner, else the
  // redistribute) on `stream`: local copies, then the all-to-all(v) with
  // the other ranks; adds the fp32 payload bytes to the counters given.
  absl::Status RunExchange(const Exchange& ex, bool to_owner,
                           const std::vector<UpdateSource>& updates,
                           device::Stream* stream, int64_t* bytes_sent,
                           int64_t* bytes_received);
  // Where region `c`'s data (local matrix c.matrix's values or row state)
  // comes from and goes to in an exchange (the gather when to_owner, else
  // the redistribute), and the box held there.
  const float* ExchangeSource(const RegionCopy& c, bool to_owner,
                              const std::vector<UpdateSource>& updates,
                              Box* holds);
  float* ExchangeDestination(const RegionCopy& c, bool to_owner, Box* holds);
  // NorMuon: this rank's rows of local matrix m's row state, and the full
  // row state of an owned matrix (in its bucket's slot, or this rank's own
  // when it holds every row).
  float* LocalRowState(int m);
  float* FullRowState(int m);
  // The owner transform on an owned batch's O (`o`, batch.count matrices
  // one after another), each with its full row state.
  absl::Status TransformBatch(const NsBatch& batch, float* o,
                              device::Stream* stream);
  // The bf16 exchange's owner side of a gather: every owned matrix's full U
  // in its slot rounded to bf16 (copied there first when this rank holds
  // it whole), so that Newton-Schulz sees the same input whoever owns it.
  absl::Status RoundOwnedUpdates(const LocalBucket& bs,
                                 const std::vector<UpdateSource>& updates,
                                 device::Stream* stream);
  // RunExchange's all-to-all(v) with the other ranks: packed fp32, or bf16
  // two values per word (ExecutorOptions::bf16_exchange).
  absl::Status SendRecvFp32(const Exchange& ex, bool to_owner,
                            const std::vector<UpdateSource>& updates,
                            device::Stream* stream);
  absl::Status SendRecvBf16(const Exchange& ex, bool to_owner,
                            const std::vector<UpdateSource>& updates,
                            device::Stream* stream);
  // Runs operation `kind` of bucket position b with the step in flight's
  // arguments, in `stream`'s order (called from inside its Launch), timed:
  // appends its OpRecord, labelled `stream_kind`, to *rec on success (none
  // on an error, when the step's counters may be partly updated).
  absl::Status RunOp(v1::OpKind kind, int b, device::Stream* stream,
                     std::vector<OpRecord>* rec, v1::StreamKind stream_kind);
  // RunOp's work for each kind; each sets the bytes it sent or the FLOPs it
  // ran in *r.
  absl::Status Gather(const LocalBucket& bs, const StepArgs& args,
                      device::Stream* stream, OpRecord* r);
  absl::Status Orthogonalize(const LocalBucket& bs, const StepArgs& args,
                             device::Stream* stream, OpRecord* r);
  absl::Status Redistribute(const LocalBucket& bs, const StepArgs& args,
                            device::Stream* stream, OpRecord* r);
  absl::Status Apply(const LocalBucket& bs, const StepArgs& args,
                     device::Stream* stream, OpRecord* r);
  // Sequential mode: bucket b's gather, then its Newton-Schulz in rank
  // order (rank i between the bucket's i-th and (i+1)-th barrier, so that
  // owners never orthogonalize at the same time and timings are exact).
  absl::Status GatherThenOrthogonalize(int b);
  // Enqueue the step's operations of buckets [0, ready) not enqueued yet
  // (from enqueue_'s cursors) on the streams; EndEnqueue enqueues the rest
  // and orders the caller's stream after the step.
  absl::Status EnqueueSequential(int ready);
  absl::Status EnqueueAsync(int ready);
  absl::Status EndEnqueue();
  absl::Status EnqueueCommOp(const StreamOp& op);
  absl::Status EnqueueCompute(const StreamOp& op);

  const int rank_;
  const int world_size_;
  Communicator* comm_;                    // Not owned.
  std::vector<MatrixGeometry> geometry_;  // local matrices
  GatherFn gather_fn_;
  RedistributeFn redistribute_fn_;
  // The buckets' exchanges, Newton-Schulz batches and slot offsets, and
  // this rank's operations per stream, compiled from the plan.
  const BucketLayout layout_;
  const StreamOps ops_;
  // Per compute op (async mode): the index in ops_.comm of its bucket's
  // gather. The op is enqueued once that gather is, so that a bucket's
  // Newton-Schulz waits for its own gather only, not for later buckets
  // being ready (nor for their producers' streams).
  const std::vector<size_t> compute_gather_at_;
  // Bucket slots: ops_.slots x layout_.slot_elems() floats holding the
  // bucket's local U and O and the owned matrices' full U and O; each
  // matrix has fixed offsets inside its bucket's slot (BucketLayout).
  device::DeviceBuffer<float> arena_;
  std::vector<float*> row_state_;  // per parameter (BindRowState)
  // Exchange buffers, used only by the stream running the exchanges.
  device::DeviceBuffer<float> send_buf_;
  device::DeviceBuffer<float> recv_buf_;
  std::shared_ptr<kernels::NsEngine> ns_engine_;  // Host Newton-Schulz.
  // Per-stream timing records, preallocated: main_records_ is written by
  // the main (sequential) or compute (async) stream, comm_records_ by the
  // comm stream; read by Run after the streams are synchronized.
  std::vector<OpRecord> main_records_;
  std::vector<OpRecord> comm_records_;
  // CUDA only (no events on the host): two timing events per record of a
  // step (records of operations enqueued past the pool keep their enqueue
  // times).
  OpTimer timer_;
  // The step's counters (reset by Begin): bytes are written by the
  // stream running the exchanges, the Newton-Schulz figures by the one
  // running Newton-Schulz.
  struct StepCounts {
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    int ns_matrices = 0;
    double ns_flops = 0;
  };
  StepCounts counts_;
  int64_t buffer_bytes_ = 0;
  int64_t buffer_bound_bytes_ = 0;

  const ExecutorOptions options_;
  device::Runtime* runtime_ = nullptr;  // Not owned; options_.device's.
  // Members are destroyed in reverse order: the kernels first (the CUDA
  // Newton-Schulz context is bound to a stream), then the streams (which
  // drain), then the events and buffers their work refers to.
  //
  // Async mode, per bucket slot: recorded on comm after the slot's gather,
  // and on compute after its Newton-Schulz.
  std::vector<std::unique_ptr<device::Event>> gathered_;
  std::vector<std::unique_ptr<device::Event>> orthogonalized_;
  // Caller-stream ordering (Enqueue): recorded on the caller's stream, and
  // on each of this executor's streams at the end of the step.
  std::unique_ptr<device::Event> caller_ready_;
  std::vector<std::unique_ptr<device::Event>> step_done_;
  // OrderAfter's events, one per producer stream seen (its native handle,
  // or the host stream itself; few: the streams backward runs on), kept
  // across steps.
  std::vector<std::pair<const void*, std::unique_ptr<device::Event>>>
      producer_ready_;
  EventWait dropped_wait_ = EventWait::kNone;
  StepArgs step_args_;  // the step in flight (see Run)
  // The sources of the U-given overloads (Run/Enqueue with float
  // pointers), valid until Finish.
  std::vector<UpdateSource> given_updates_;
  bool in_flight_ = false;  // between Enqueue and Finish
  // The step in flight's enqueue state (reset by Begin).
  struct EnqueueState {
    // The next operation of each of ops_'s lists.
    size_t next_main = 0;
    size_t next_comm = 0;
    size_t next_compute = 0;
    // Redistributes of owned buckets enqueued so far.
    size_t next_owned_redistribute = 0;
    bool ended = true;                 // EndEnqueue ran
    absl::Status status;               // the first enqueue error
    device::Stream* caller = nullptr;  // Begin's `caller`
  };
  EnqueueState enqueue_;
  // Streams of options_.device (host streams each have a thread): "main"
  // in sequential mode; "comm" and "compute" in async mode. "comm" (the
  // memory-bound gathers, applies and collectives) is of high priority,
  // so that its kernels take multiprocessors as the compute-bound
  // Newton-Schulz GEMMs free them instead of queueing behind them.
  std::unique_ptr<device::Stream> main_stream_;
  std::unique_ptr<device::Stream> comm_stream_;
  std::unique_ptr<device::Stream> compute_stream_;
  std::vector<device::Stream*> streams_;  // the above that exist
  // The step's kernels on this executor's device (host: over ns_engine_).
  std::unique_ptr<kernels::StepKernels> kernels_;
};

}  // namespace muon

#endif  // MUON_CLIENT_STEP_EXECUTOR_H_
