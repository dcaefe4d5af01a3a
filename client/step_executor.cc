#include "client/step_executor.h"

#include <algorithm>
#include <cassert>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "device/runtime.h"

namespace muon {

namespace {

// Per compute op of `ops`, the index in ops.comm of its bucket's gather
// (ops.comm.size() when there is none: enqueued with its redistribute).
// O(buckets + ops): it runs at every executor creation, re-plans included.
std::vector<size_t> GatherIndexOfComputeOps(const StreamOps& ops) {
  std::unordered_map<int, size_t> first_gather;
  for (size_t i = 0; i < ops.comm.size(); ++i) {
    if (ops.comm[i].kind == v1::OP_KIND_GATHER) {
      first_gather.emplace(ops.comm[i].bucket, i);
    }
  }
  std::vector<size_t> out;
  out.reserve(ops.compute.size());
  for (const StreamOp& c : ops.compute) {
    const auto it = first_gather.find(c.bucket);
    out.push_back(it == first_gather.end() ? ops.comm.size() : it->second);
  }
  return out;
}

}  // namespace

StepExecutor::StepExecutor(int rank, int world_size, Communicator* comm,
                           std::vector<MatrixGeometry> geometry,
                           BucketLayout layout, StreamOps ops,
                           GatherFn gather_fn, RedistributeFn redistribute_fn,
                           const ExecutorOptions& options)
    : rank_(rank),
      world_size_(world_size),
      comm_(comm),
      geometry_(std::move(geometry)),
      gather_fn_(std::move(gather_fn)),
      redistribute_fn_(std::move(redistribute_fn)),
      layout_(std::move(layout)),
      ops_(std::move(ops)),
      compute_gather_at_(GatherIndexOfComputeOps(ops_)),
      options_(options) {}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    int rank, int world_size, const v1::Plan& plan,
    std::vector<MatrixGeometry> geometry, Communicator* comm,
    GatherFn gather_fn, RedistributeFn redistribute_fn,
    std::shared_ptr<kernels::NsEngine> ns_engine,
    const ExecutorOptions& options) {
  // ResolveOptions (client/muon_options.h) refuses these combinations by
  // name before any executor exists.
  assert(!(options.device.is_cuda() && (gather_fn || redistribute_fn)));
  assert(!(options.owner_transform != nullptr &&
           (gather_fn || redistribute_fn || options.bf16_exchange)));
  if (ns_engine == nullptr && options.device.is_host()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": no Newton-Schulz engine"));
  }
  if (comm == nullptr && world_size != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": a world of ", world_size,
                     " ranks needs a communicator"));
  }
  for (const MatrixGeometry& g : geometry) {
    if (static_cast<int>(g.boxes.size()) != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": matrix \"", g.param, "\" has ", g.boxes.size(),
          " shard boxes for a world of ", world_size));
    }
  }
  MUON_ASSIGN_OR_RETURN(device::Runtime * runtime,
                        device::GetRuntime(options.device));
  BucketLayoutOptions layout_options;
  layout_options.form_update = options.form_update;
  layout_options.custom_gather = static_cast<bool>(gather_fn);
  layout_options.bf16_exchange = options.bf16_exchange;
  layout_options.row_state = options.owner_transform != nullptr;
  layout_options.batch_same_shape =
      !(options.device.is_cuda() &&
        options.precision == kernels::GpuPrecision::kFp32);
  MUON_ASSIGN_OR_RETURN(
      BucketLayout layout,
      BucketLayout::Compile(rank, world_size, plan, geometry, layout_options));
  MUON_ASSIGN_OR_RETURN(StreamOps ops,
                        CompileStreamOps(rank, plan, layout.buckets()));
  std::unique_ptr<StepExecutor> ex(
      new StepExecutor(rank, world_size, comm, std::move(geometry),
                       std::move(layout), std::move(ops), std::move(gather_fn),
                       std::move(redistribute_fn), options));
  ex->ns_engine_ = std::move(ns_engine);
  ex->runtime_ = runtime;
  MUON_RETURN_IF_ERROR(ex->CreateStreamsAndKernels());
  for (const auto& [shape, batch] : ex->layout_.sizes().owned_shapes) {
    MUON_RETURN_IF_ERROR(
        ex->kernels_->Reserve(batch, shape.first, shape.second, options.ns));
  }
  MUON_RETURN_IF_ERROR(ex->AllocateBuffers());
  return ex;
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::ForPlan(
    const v1::Plan& plan) const {
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<StepExecutor> ex,
      Create(rank_, world_size_, plan, geometry_, comm_, gather_fn_,
             redistribute_fn_, ns_engine_, options_));
  ex->BindRowState(row_state_);
  return ex;
}

absl::Status StepExecutor::AllocateBuffers() {
  const BufferSizes& sizes = layout_.sizes();
  const int slots = ops_.slots;
  // Every buffer in the executor's device memory.
  device::Allocator* alloc = options_.allocator != nullptr
                                 ? options_.allocator
                                 : runtime_->allocator();
  MUON_ASSIGN_OR_RETURN(
      send_buf_, device::DeviceBuffer<float>::Allocate(alloc, sizes.max_send));
  MUON_ASSIGN_OR_RETURN(
      recv_buf_, device::DeviceBuffer<float>::Allocate(alloc, sizes.max_recv));
  MUON_ASSIGN_OR_RETURN(arena_, device::DeviceBuffer<float>::Allocate(
                                    alloc, slots * sizes.max_bucket_elems));
  const int64_t exchange_bytes =
      (sizes.max_send + sizes.max_recv) * static_cast<int64_t>(sizeof(float));
  buffer_bytes_ = arena_.bytes() + exchange_bytes;
  buffer_bound_bytes_ = (ops_.prefetch_count + 1) * sizes.max_bucket_elems *
                            static_cast<int64_t>(sizeof(float)) +
                        exchange_bytes;
  const size_t records = 4 * layout_.buckets().size() + 4;
  main_records_.reserve(records);
  comm_records_.reserve(records);
  device::Runtime* rt = runtime_;
  if (!options_.device.is_host()) {
    MUON_RETURN_IF_ERROR(timer_.CreateEvents(rt, rank_, records));
  }
  MUON_ASSIGN_OR_RETURN(caller_ready_, rt->CreateEvent(absl::StrCat(
                                           "rank ", rank_, " caller ready")));
  for (size_t i = 0; i < streams_.size(); ++i) {
    MUON_ASSIGN_OR_RETURN(
        std::unique_ptr<device::Event> done,
        rt->CreateEvent(absl::StrCat("rank ", rank_, " step done ", i)));
    step_done_.push_back(std::move(done));
  }
  if (ops_.async) {
    for (int s = 0; s < slots; ++s) {
      MUON_ASSIGN_OR_RETURN(std::unique_ptr<device::Event> g,
                            rt->CreateEvent(absl::StrCat(
                                "rank ", rank_, " slot ", s, " gathered")));
      MUON_ASSIGN_OR_RETURN(
          std::unique_ptr<device::Event> o,
          rt->CreateEvent(
              absl::StrCat("rank ", rank_, " slot ", s, " orthogonalized")));
      gathered_.push_back(std::move(g));
      orthogonalized_.push_back(std::move(o));
    }
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::CreateStreamsAndKernels() {
  device::Runtime* rt = runtime_;
  if (ops_.async) {
    MUON_ASSIGN_OR_RETURN(
        comm_stream_,
        rt->CreateHighPriorityStream(absl::StrCat("rank ", rank_, " comm")));
    MUON_ASSIGN_OR_RETURN(compute_stream_, rt->CreateStream(absl::StrCat(
                                               "rank ", rank_, " compute")));
  } else {
    MUON_ASSIGN_OR_RETURN(
        main_stream_, rt->CreateStream(absl::StrCat("rank ", rank_, " main")));
  }
  if (ops_.async) {
    streams_ = {compute_stream_.get(), comm_stream_.get()};
  } else {
    streams_ = {main_stream_.get()};
  }
  if (options_.device.is_host()) {
    kernels_ = kernels::MakeHostStepKernels(ns_engine_.get());
    return absl::OkStatus();
  }
  // CUDA Newton-Schulz is bound to the stream it runs on.
  device::Stream* ns_stream =
      ops_.async ? compute_stream_.get() : main_stream_.get();
  MUON_ASSIGN_OR_RETURN(
      kernels_, kernels::MakeCudaStepKernels(options_.device.ordinal, ns_stream,
                                             options_.precision));
  return absl::OkStatus();
}

StepExecutor::~StepExecutor() {
  if (in_flight_) {
    StepStats discarded;
    (void)Finish(&discarded);
  }
}

float* StepExecutor::InSlot(int m, int64_t offset) {
  return arena_.data() +
         ops_.slot_of_bucket[layout_.bucket_of(m)] * layout_.slot_elems() +
         offset;
}

float* StepExecutor::FullU(int m) {
  return InSlot(m, layout_.full_u_offset(m));
}

float* StepExecutor::LocalO(int m) {
  return InSlot(m, layout_.local_o_offset(m));
}

const float* StepExecutor::LocalU(int m,
                                  const std::vector<UpdateSource>& updates) {
  const MatrixGeometry& g = geometry_[m];
  const UpdateSource& src = updates[g.param_index];
  if (src.formed()) {
    return InSlot(m, layout_.local_u_offset(m));
  }
  return static_cast<const float*>(src.momentum) + g.offset;
}

absl::Status StepExecutor::FormUpdates(const LocalBucket& bs,
                                       const StepArgs& args,
                                       device::Stream* stream) {
  for (int m : bs.matrices) {
    const MatrixGeometry& g = geometry_[m];
    const UpdateSource& src = (*args.updates)[g.param_index];
    const int64_t n = g.boxes[rank_].numel();
    if (n == 0 || !src.formed()) continue;
    const auto* momentum =
        static_cast<const char*>(src.momentum) +
        g.offset * kernels::ParamDTypeSize(src.momentum_dtype);
    const char* grad =
        src.grad == nullptr
            ? nullptr
            : static_cast<const char*>(src.grad) +
                  g.offset * kernels::ParamDTypeSize(src.grad_dtype);
    MUON_RETURN_IF_ERROR(kernels_->FormUpdate(
        stream, momentum, src.momentum_dtype, grad, src.grad_dtype, n,
        args.rule->MomentumOf(g.param_index), grad != nullptr,
        const_cast<float*>(LocalU(m, *args.updates))));
  }
  return absl::OkStatus();
}

float* StepExecutor::FullO(int m) {
  return InSlot(m, layout_.full_o_offset(m));
}

float* StepExecutor::LocalRowState(int m) {
  const MatrixGeometry& g = geometry_[m];
  return row_state_[g.param_index] + g.row_offset;
}

float* StepExecutor::FullRowState(int m) {
  if (HoldsAllRows(geometry_[m], rank_)) return LocalRowState(m);
  return InSlot(m, layout_.row_state_offset(m));
}

const float* StepExecutor::ExchangeSource(
    const RegionCopy& c, bool to_owner,
    const std::vector<UpdateSource>& updates, Box* holds) {
  const int m = c.matrix;
  const MatrixGeometry& g = geometry_[m];
  if (c.data == RegionData::kRowState) {
    *holds = RowStateBox(to_owner ? g.boxes[rank_] : FullBox(g));
    return to_owner ? LocalRowState(m) : FullRowState(m);
  }
  if (to_owner) {
    *holds = g.boxes[rank_];
    return LocalU(m, updates);
  }
  *holds = FullBox(g);
  return HoldsWhole(geometry_[m], rank_) ? LocalO(m) : FullO(m);
}

float* StepExecutor::ExchangeDestination(const RegionCopy& c, bool to_owner,
                                         Box* holds) {
  const int m = c.matrix;
  const MatrixGeometry& g = geometry_[m];
  if (c.data == RegionData::kRowState) {
    *holds = RowStateBox(to_owner ? FullBox(g) : g.boxes[rank_]);
    return to_owner ? FullRowState(m) : LocalRowState(m);
  }
  if (to_owner) {
    *holds = FullBox(g);
    return FullU(m);
  }
  *holds = g.boxes[rank_];
  return LocalO(m);
}

absl::Status StepExecutor::SendRecvFp32(
    const Exchange& x, bool to_owner, const std::vector<UpdateSource>& updates,
    device::Stream* stream) {
  Box holds;
  int64_t off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.send[q]) {
      const float* src = ExchangeSource(c, to_owner, updates, &holds);
      MUON_RETURN_IF_ERROR(kernels_->CopyRegion(
          stream, src, holds, send_buf_.data() + off, c.region, c.region));
      off += c.region.numel();
    }
  }
  MUON_RETURN_IF_ERROR(comm_->AllToAllVOnStream(stream, send_buf_.data(),
                                                x.send_counts, recv_buf_.data(),
                                                x.recv_counts));
  off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.recv[q]) {
      float* dst = ExchangeDestination(c, to_owner, &holds);
      MUON_RETURN_IF_ERROR(kernels_->CopyRegion(
          stream, recv_buf_.data() + off, c.region, dst, holds, c.region));
      off += c.region.numel();
    }
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::SendRecvBf16(
    const Exchange& x, bool to_owner, const std::vector<UpdateSource>& updates,
    device::Stream* stream) {
  // The float buffers hold bf16 values two per word; each peer's part
  // starts on a word (x.send_words_bf16[q] words).
  auto* send = reinterpret_cast<kernels::bf16_t*>(send_buf_.data());
  auto* recv = reinterpret_cast<kernels::bf16_t*>(recv_buf_.data());
  Box holds;
  int64_t word = 0;
  for (int q = 0; q < world_size_; ++q) {
    kernels::bf16_t* out = send + 2 * word;
    for (const RegionCopy& c : x.send[q]) {
      const float* src = ExchangeSource(c, to_owner, updates, &holds);
      MUON_RETURN_IF_ERROR(
          kernels_->PackRegionBf16(stream, src, holds, out, c.region));
      out += c.region.numel();
    }
    word += x.send_words_bf16[q];
  }
  MUON_RETURN_IF_ERROR(
      comm_->AllToAllVOnStream(stream, send_buf_.data(), x.send_words_bf16,
                               recv_buf_.data(), x.recv_words_bf16));
  word = 0;
  for (int q = 0; q < world_size_; ++q) {
    const kernels::bf16_t* in = recv + 2 * word;
    for (const RegionCopy& c : x.recv[q]) {
      float* dst = ExchangeDestination(c, to_owner, &holds);
      MUON_RETURN_IF_ERROR(
          kernels_->UnpackRegionBf16(stream, in, c.region, dst, holds));
      in += c.region.numel();
    }
    word += x.recv_words_bf16[q];
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::RunExchange(const Exchange& x, bool to_owner,
                                       const std::vector<UpdateSource>& updates,
                                       device::Stream* stream,
                                       int64_t* bytes_sent,
                                       int64_t* bytes_received) {
  Box src_holds, dst_holds;
  for (const RegionCopy& c : x.self) {
    const float* src = ExchangeSource(c, to_owner, updates, &src_holds);
    float* dst = ExchangeDestination(c, to_owner, &dst_holds);
    MUON_RETURN_IF_ERROR(
        kernels_->CopyRegion(stream, src, src_holds, dst, dst_holds, c.region));
  }
  if (world_size_ == 1) return absl::OkStatus();
  constexpr int64_t kWord = sizeof(float);
  if (options_.bf16_exchange) {
    MUON_RETURN_IF_ERROR(SendRecvBf16(x, to_owner, updates, stream));
    *bytes_sent += x.send_words_bf16_total * kWord;
    *bytes_received += x.recv_words_bf16_total * kWord;
    return absl::OkStatus();
  }
  MUON_RETURN_IF_ERROR(SendRecvFp32(x, to_owner, updates, stream));
  *bytes_sent += x.send_total * kWord;
  *bytes_received += x.recv_total * kWord;
  return absl::OkStatus();
}

absl::Status StepExecutor::RoundOwnedUpdates(
    const LocalBucket& bs, const std::vector<UpdateSource>& updates,
    device::Stream* stream) {
  for (int m : bs.owned) {
    const MatrixGeometry& g = geometry_[m];
    const Box full = FullBox(g);
    if (HoldsWhole(geometry_[m], rank_)) {
      MUON_RETURN_IF_ERROR(kernels_->CopyRegion(stream, LocalU(m, updates),
                                                full, FullU(m), full, full));
    }
    // The parts received are bf16 already (rounding them again is exact);
    // the owner's own part is rounded here.
    MUON_RETURN_IF_ERROR(kernels_->RoundToBf16(stream, FullU(m), full.numel()));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::RunOp(v1::OpKind kind, int b, device::Stream* stream,
                                 std::vector<OpRecord>* rec,
                                 v1::StreamKind stream_kind) {
  const LocalBucket& bs = layout_.buckets()[b];
  OpRecord r;
  r.op = kind;
  r.stream = stream_kind;
  r.bucket = bs.index;
  r.start_s = OpTimer::NowSeconds();
  MUON_RETURN_IF_ERROR(timer_.Start(stream, &r.timing));
  switch (kind) {
    case v1::OP_KIND_GATHER:
      MUON_RETURN_IF_ERROR(Gather(bs, step_args_, stream, &r));
      break;
    case v1::OP_KIND_ORTHOGONALIZE:
      MUON_RETURN_IF_ERROR(Orthogonalize(bs, step_args_, stream, &r));
      break;
    case v1::OP_KIND_REDISTRIBUTE:
      MUON_RETURN_IF_ERROR(Redistribute(bs, step_args_, stream, &r));
      break;
    case v1::OP_KIND_APPLY:
      MUON_RETURN_IF_ERROR(Apply(bs, step_args_, stream, &r));
      break;
    default:
      break;  // Create accepts only the four kinds
  }
  MUON_RETURN_IF_ERROR(timer_.End(stream, r.timing));
  r.end_s = OpTimer::NowSeconds();
  rec->push_back(r);
  return absl::OkStatus();
}

absl::Status StepExecutor::Gather(const LocalBucket& bs, const StepArgs& args,
                                  device::Stream* stream, OpRecord* r) {
  const int64_t sent0 = counts_.bytes_sent;
  MUON_RETURN_IF_ERROR(FormUpdates(bs, args, stream));
  if (gather_fn_) {
    for (size_t i = 0; i < bs.matrices.size(); ++i) {
      const int m = bs.matrices[i];
      const MatrixGeometry& g = geometry_[m];
      float* full = bs.owners[i] == rank_ ? FullU(m) : nullptr;
      MUON_RETURN_IF_ERROR(gather_fn_(g.param_index, g.slice, bs.owners[i],
                                      LocalU(m, *args.updates), full));
    }
  } else {
    MUON_RETURN_IF_ERROR(RunExchange(bs.gather, /*to_owner=*/true,
                                     *args.updates, stream, &counts_.bytes_sent,
                                     &counts_.bytes_received));
    if (options_.bf16_exchange) {
      MUON_RETURN_IF_ERROR(RoundOwnedUpdates(bs, *args.updates, stream));
    }
  }
  r->bytes = counts_.bytes_sent - sent0;
  return absl::OkStatus();
}

absl::Status StepExecutor::Orthogonalize(const LocalBucket& bs,
                                         const StepArgs& args,
                                         device::Stream* stream, OpRecord* r) {
  double flops = 0;
  for (const NsBatch& batch : bs.ns_batches) {
    const int m = batch.first;
    const MatrixGeometry& g = geometry_[m];
    const float* u = !batch.in_slot && !gather_fn_ && !options_.bf16_exchange
                         ? LocalU(m, *args.updates)
                         : FullU(m);
    float* o = batch.in_slot ? FullO(m) : LocalO(m);
    MUON_RETURN_IF_ERROR(kernels_->Orthogonalize(stream, u, batch.count, g.rows,
                                                 g.cols, args.rule->ns, o));
    if (options_.owner_transform != nullptr) {
      MUON_RETURN_IF_ERROR(TransformBatch(batch, o, stream));
    }
    if (options_.bf16_exchange) {
      // Every holder, the owner included, applies the same bf16 values.
      MUON_RETURN_IF_ERROR(
          kernels_->RoundToBf16(stream, o, batch.count * g.rows * g.cols));
    }
    flops += batch.count * kernels::NewtonSchulzFlops(
                               g.rows, g.cols,
                               kernels::NewtonSchulzIterations(args.rule->ns));
    counts_.ns_matrices += batch.count;
  }
  counts_.ns_flops += flops;
  r->flops = flops;
  return absl::OkStatus();
}

absl::Status StepExecutor::TransformBatch(const NsBatch& batch, float* o,
                                          device::Stream* stream) {
  for (size_t k = 0; k < batch.members.size(); ++k) {
    const int m = batch.members[k];
    const MatrixGeometry& g = geometry_[m];
    MUON_RETURN_IF_ERROR(options_.owner_transform->Apply(
        *kernels_, stream, o + static_cast<int64_t>(k) * g.rows * g.cols,
        g.rows, g.cols, FullRowState(m)));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::Redistribute(const LocalBucket& bs,
                                        const StepArgs& args,
                                        device::Stream* stream, OpRecord* r) {
  const int64_t sent0 = counts_.bytes_sent;
  if (redistribute_fn_) {
    for (size_t i = 0; i < bs.matrices.size(); ++i) {
      const int m = bs.matrices[i];
      const MatrixGeometry& g = geometry_[m];
      const float* full = nullptr;
      if (bs.owners[i] == rank_) {
        full = HoldsWhole(geometry_[m], rank_) ? LocalO(m) : FullO(m);
      }
      MUON_RETURN_IF_ERROR(redistribute_fn_(g.param_index, g.slice,
                                            bs.owners[i], full, LocalO(m)));
    }
  } else {
    MUON_RETURN_IF_ERROR(RunExchange(bs.redistribute, /*to_owner=*/false,
                                     *args.updates, stream, &counts_.bytes_sent,
                                     &counts_.bytes_received));
  }
  r->bytes = counts_.bytes_sent - sent0;
  return absl::OkStatus();
}

absl::Status StepExecutor::Apply(const LocalBucket& bs, const StepArgs& args,
                                 device::Stream* stream, OpRecord* /*r*/) {
  // Decoupled weight decay and the AdjustLR-scaled update on the local
  // shard (UpdateRule::Apply), AdjustLR from the matrix's GLOBAL shape.
  for (int m : bs.matrices) {
    const MatrixGeometry& g = geometry_[m];
    const int64_t n = g.boxes[rank_].numel();
    if (n == 0) continue;
    const ParamView& p = (*args.params)[g.param_index];
    const bool bf16 = p.dtype == DType::kBFloat16;
    void* data = static_cast<char*>(p.data) + g.offset * DTypeSize(p.dtype);
    MUON_RETURN_IF_ERROR(args.rule->Apply(
        *kernels_, stream, g.param_index, g.rows, g.cols, data,
        bf16 ? kernels::ParamDType::kBFloat16 : kernels::ParamDType::kFloat32,
        LocalO(m), n));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::GatherThenOrthogonalize(int b) {
  device::Stream* main = main_stream_.get();
  MUON_RETURN_IF_ERROR(
      RunOp(v1::OP_KIND_GATHER, b, main, &main_records_, v1::STREAM_KIND_MAIN));
  // Owners orthogonalize in rank order: rank i runs between the i-th and
  // (i+1)-th barrier of the bucket.
  const bool mine = !layout_.buckets()[b].owned.empty();
  if (world_size_ == 1) {
    return mine ? RunOp(v1::OP_KIND_ORTHOGONALIZE, b, main, &main_records_,
                        v1::STREAM_KIND_MAIN)
                : absl::OkStatus();
  }
  for (int turn = 0; turn < world_size_; ++turn) {
    if (turn == rank_ && mine) {
      MUON_RETURN_IF_ERROR(RunOp(v1::OP_KIND_ORTHOGONALIZE, b, main,
                                 &main_records_, v1::STREAM_KIND_MAIN));
    }
    MUON_RETURN_IF_ERROR(comm_->Barrier());
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::EnqueueSequential(int ready) {
  device::Stream* main = main_stream_.get();
  for (; enqueue_.next_main < ops_.main.size() &&
         ops_.main[enqueue_.next_main].bucket < ready;
       ++enqueue_.next_main) {
    const StreamOp& op = ops_.main[enqueue_.next_main];
    const int b = op.bucket;
    switch (op.kind) {
      case v1::OP_KIND_GATHER:
        MUON_RETURN_IF_ERROR(
            main->Launch([this, b] { return GatherThenOrthogonalize(b); }));
        break;
      case v1::OP_KIND_ORTHOGONALIZE:
        break;  // run in rank order right after the bucket's gather
      case v1::OP_KIND_REDISTRIBUTE:
        MUON_RETURN_IF_ERROR(main->Launch([this, b] {
          return RunOp(v1::OP_KIND_REDISTRIBUTE, b, main_stream_.get(),
                       &main_records_, v1::STREAM_KIND_MAIN);
        }));
        break;
      case v1::OP_KIND_APPLY:
        MUON_RETURN_IF_ERROR(main->Launch([this, b] {
          return RunOp(v1::OP_KIND_APPLY, b, main_stream_.get(), &main_records_,
                       v1::STREAM_KIND_MAIN);
        }));
        break;
      default:
        break;  // Create accepts only the four kinds
    }
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::EnqueueCompute(const StreamOp& op) {
  const int b = op.bucket;
  device::Event* gathered = gathered_[ops_.slot_of_bucket[b]].get();
  if (dropped_wait_ != EventWait::kGatheredBeforeOrthogonalize) {
    MUON_RETURN_IF_ERROR(compute_stream_->WaitFor(gathered));
  }
  MUON_RETURN_IF_ERROR(compute_stream_->Launch([this, b] {
    return RunOp(v1::OP_KIND_ORTHOGONALIZE, b, compute_stream_.get(),
                 &main_records_, v1::STREAM_KIND_COMPUTE);
  }));
  return orthogonalized_[ops_.slot_of_bucket[b]]->Record(compute_stream_.get());
}

absl::Status StepExecutor::EnqueueCommOp(const StreamOp& op) {
  const int b = op.bucket;
  device::Stream* comm = comm_stream_.get();
  switch (op.kind) {
    case v1::OP_KIND_GATHER:
      MUON_RETURN_IF_ERROR(comm->Launch([this, b] {
        return RunOp(v1::OP_KIND_GATHER, b, comm_stream_.get(), &comm_records_,
                     v1::STREAM_KIND_COMM);
      }));
      return gathered_[ops_.slot_of_bucket[b]]->Record(comm);
    case v1::OP_KIND_REDISTRIBUTE:
      if (!layout_.buckets()[b].owned.empty() &&
          dropped_wait_ != EventWait::kOrthogonalizedBeforeRedistribute) {
        MUON_RETURN_IF_ERROR(
            comm->WaitFor(orthogonalized_[ops_.slot_of_bucket[b]].get()));
      }
      return comm->Launch([this, b] {
        return RunOp(v1::OP_KIND_REDISTRIBUTE, b, comm_stream_.get(),
                     &comm_records_, v1::STREAM_KIND_COMM);
      });
    case v1::OP_KIND_APPLY:
      return comm->Launch([this, b] {
        return RunOp(v1::OP_KIND_APPLY, b, comm_stream_.get(), &comm_records_,
                     v1::STREAM_KIND_COMM);
      });
    case v1::OP_KIND_ORTHOGONALIZE:
    default:
      break;  // never scheduled on the comm stream
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::EnqueueAsync(int ready) {
  // The host enqueues both streams' work in one pass over the comm ops. A
  // wait binds to the event's latest record, so each bucket's Newton-Schulz
  // is enqueued after its gather's record and before the slot's next gather
  // (which the schedule puts after the bucket's redistribute): compute ops
  // are enqueued, in order, as soon as their bucket's gather is, and at the
  // latest just before redistribute(b) waits for them.
  for (; enqueue_.next_comm < ops_.comm.size() &&
         ops_.comm[enqueue_.next_comm].bucket < ready;
       ++enqueue_.next_comm) {
    const StreamOp& op = ops_.comm[enqueue_.next_comm];
    if (op.kind == v1::OP_KIND_REDISTRIBUTE &&
        !layout_.buckets()[op.bucket].owned.empty()) {
      // The compute list orthogonalizes the owned buckets in the order
      // they are redistributed (CompileStreamOps checks it): this one's is
      // compute op number next_owned_redistribute.
      const size_t mine = enqueue_.next_owned_redistribute++;
      while (enqueue_.next_compute <= mine &&
             enqueue_.next_compute < ops_.compute.size()) {
        MUON_RETURN_IF_ERROR(
            EnqueueCompute(ops_.compute[enqueue_.next_compute++]));
      }
    }
    MUON_RETURN_IF_ERROR(EnqueueCommOp(op));
    // Newton-Schulz of the buckets gathered so far, in the compute order.
    while (enqueue_.next_compute < ops_.compute.size() &&
           compute_gather_at_[enqueue_.next_compute] <= enqueue_.next_comm) {
      MUON_RETURN_IF_ERROR(
          EnqueueCompute(ops_.compute[enqueue_.next_compute++]));
    }
  }
  if (ready < static_cast<int>(layout_.buckets().size()))
    return absl::OkStatus();
  while (enqueue_.next_compute < ops_.compute.size()) {
    MUON_RETURN_IF_ERROR(EnqueueCompute(ops_.compute[enqueue_.next_compute++]));
  }
  return absl::OkStatus();
}

int StepExecutor::ReadyBuckets(const std::vector<char>& param_ready) const {
  int p = 0;
  for (; p < static_cast<int>(layout_.buckets().size()); ++p) {
    for (int m : layout_.buckets()[p].matrices) {
      const int i = geometry_[m].param_index;
      if (i >= static_cast<int>(param_ready.size()) || !param_ready[i]) {
        return p;
      }
    }
  }
  return p;
}

absl::Status StepExecutor::EnqueueReady(int ready) {
  if (!in_flight_ || enqueue_.ended) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": EnqueueReady outside a step (Begin first)"));
  }
  if (!enqueue_.status.ok()) return enqueue_.status;
  enqueue_.status = ops_.async ? EnqueueAsync(ready) : EnqueueSequential(ready);
  return enqueue_.status;
}

absl::Status StepExecutor::OrderAfter(device::Stream* producer) {
  if (!in_flight_ || enqueue_.ended) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": OrderAfter outside a step (Begin first)"));
  }
  if (producer == nullptr) return absl::OkStatus();
  if (producer->device() != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": the producer stream \"", producer->name(),
        "\" is on ", producer->device().ToString(), ", the executor on ",
        options_.device.ToString()));
  }
  // Keyed by the native stream on CUDA (a stream is wrapped anew when the
  // caller's stream changes; null is the legacy default stream), by the
  // stream itself on the host.
  const void* key = options_.device.is_host()
                        ? static_cast<const void*>(producer)
                        : producer->native_handle();
  absl::Status s = OrderAfterProducer(producer, key);
  // Sticky: nothing more is enqueued in this step, which then fails (the
  // producer's work may not be ordered before it).
  if (!s.ok() && enqueue_.status.ok()) enqueue_.status = s;
  return s;
}

absl::Status StepExecutor::OrderAfterProducer(device::Stream* producer,
                                              const void* key) {
  device::Event* ready = nullptr;
  for (auto& [stream, event] : producer_ready_) {
    if (stream == key) ready = event.get();
  }
  if (ready == nullptr) {
    MUON_ASSIGN_OR_RETURN(
        std::unique_ptr<device::Event> event,
        runtime_->CreateEvent(absl::StrCat("rank ", rank_, " producer ",
                                           producer_ready_.size(), " ready")));
    ready = event.get();
    producer_ready_.emplace_back(key, std::move(event));
  }
  MUON_RETURN_IF_ERROR(ready->Record(producer));
  for (device::Stream* stream : streams_) {
    MUON_RETURN_IF_ERROR(stream->WaitFor(ready));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::EndEnqueue() {
  absl::Status status = enqueue_.status;
  if (status.ok()) {
    const int all = static_cast<int>(layout_.buckets().size());
    status = ops_.async ? EnqueueAsync(all) : EnqueueSequential(all);
  }
  enqueue_.ended = true;
  // Also after an enqueue error: the caller's later work must not race
  // what was enqueued.
  device::Stream* caller = enqueue_.caller;
  if (caller != nullptr) {
    for (size_t i = 0; i < streams_.size(); ++i) {
      absl::Status s = step_done_[i]->Record(streams_[i]);
      if (s.ok()) s = caller->WaitFor(step_done_[i].get());
      if (status.ok()) status = s;
    }
  }
  return status;
}

absl::Status StepExecutor::Run(const std::vector<UpdateSource>& updates,
                               const std::vector<ParamView>& params,
                               const UpdateRule& rule, StepStats* stats,
                               device::Stream* caller) {
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": a step is in flight: Finish it before Run"));
  }
  const absl::Status enqueued = Enqueue(updates, params, rule, caller);
  if (!in_flight_) return enqueued;  // nothing was enqueued
  const absl::Status finished = Finish(stats);
  return enqueued.ok() ? finished : enqueued;
}

absl::Status StepExecutor::Enqueue(const std::vector<UpdateSource>& updates,
                                   const std::vector<ParamView>& params,
                                   const UpdateRule& rule,
                                   device::Stream* caller) {
  MUON_RETURN_IF_ERROR(Begin(updates, params, rule, caller));
  return EndEnqueue();
}

absl::Status StepExecutor::GiveUpdates(
    const std::vector<const float*>& updates) {
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": a step is in flight: Finish it before the next"));
  }
  given_updates_.assign(updates.size(), UpdateSource());
  for (size_t i = 0; i < updates.size(); ++i) {
    given_updates_[i].momentum = updates[i];
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::Run(const std::vector<const float*>& updates,
                               const std::vector<ParamView>& params,
                               const UpdateRule& rule, StepStats* stats,
                               device::Stream* caller) {
  MUON_RETURN_IF_ERROR(GiveUpdates(updates));
  return Run(given_updates_, params, rule, stats, caller);
}

absl::Status StepExecutor::Enqueue(const std::vector<const float*>& updates,
                                   const std::vector<ParamView>& params,
                                   const UpdateRule& rule,
                                   device::Stream* caller) {
  MUON_RETURN_IF_ERROR(GiveUpdates(updates));
  return Enqueue(given_updates_, params, rule, caller);
}

absl::Status StepExecutor::CheckUpdateSources(
    const std::vector<UpdateSource>& updates,
    const std::vector<ParamView>& params) const {
  for (const MatrixGeometry& g : geometry_) {
    if (g.param_index >= static_cast<int>(updates.size()) ||
        g.param_index >= static_cast<int>(params.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank_, ": ", updates.size(), " update sources and ",
          params.size(), " parameters; matrix \"", g.param, "\" is parameter ",
          g.param_index));
    }
    if (updates[g.param_index].formed() && !options_.form_update &&
        !g.boxes[rank_].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank_, ": the update of \"", g.param,
          "\" is formed (Nesterov or a bf16 momentum buffer) but the "
          "executor was created without ExecutorOptions::form_update"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::Begin(const std::vector<UpdateSource>& updates,
                                 const std::vector<ParamView>& params,
                                 const UpdateRule& rule,
                                 device::Stream* caller) {
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, ": a step is in flight: Finish it before the next"));
  }
  MUON_RETURN_IF_ERROR(CheckUpdateSources(updates, params));
  if (caller != nullptr && caller->device() != options_.device) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": the caller's stream \"", caller->name(),
                     "\" is on ", caller->device().ToString(),
                     ", the executor on ", options_.device.ToString()));
  }
  if (options_.owner_transform != nullptr) {
    for (const MatrixGeometry& g : geometry_) {
      if (g.boxes[rank_].empty()) continue;
      if (g.param_index >= static_cast<int>(row_state_.size()) ||
          row_state_[g.param_index] == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank_, ": ", options_.owner_transform->name(),
            " has no row state for \"", g.param, "\" (BindRowState)"));
      }
    }
  }
  main_records_.clear();
  comm_records_.clear();
  timer_.Reset();
  counts_ = StepCounts();
  // The streams' work reads the step's arguments from step_args_ (set
  // before anything is enqueued: the enqueue orders it before that work);
  // its closures capture only `this` and a bucket, so they fit in
  // std::function's inline storage and a warm step allocates nothing.
  step_args_ = StepArgs{&updates, &params, &rule};
  if (caller != nullptr) {
    MUON_RETURN_IF_ERROR(caller_ready_->Record(caller));
    for (device::Stream* stream : streams_) {
      MUON_RETURN_IF_ERROR(stream->WaitFor(caller_ready_.get()));
    }
  }
  // From here on work may be queued: Finish must wait for it, even after
  // an enqueue error.
  in_flight_ = true;
  enqueue_ = EnqueueState();
  enqueue_.ended = false;
  enqueue_.caller = caller;
  return absl::OkStatus();
}

absl::Status StepExecutor::WaitForStream(device::Stream* stream) {
  // Host streams: every operation is bounded (Gloo by its timeout).
  if (options_.device.is_host() || comm_ == nullptr) {
    return stream->Synchronize(absl::InfiniteDuration());
  }
  // CUDA: NCCL kernels of a failed peer never finish; its error shows in
  // the communicator's asynchronous error, and aborting ends the kernels.
  // A peer that hangs without an error is cut off at options_.step_timeout.
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  absl::Status async_error;
  while (true) {
    absl::Status done = stream->Synchronize(absl::Milliseconds(10));
    if (done.code() != absl::StatusCode::kDeadlineExceeded) {
      // An abort (ours, or the agent's on a job error) ends NCCL's kernels
      // and the stream drains with no CUDA error, the data half written:
      // the communicator's error is checked once more before trusting it.
      if (async_error.ok()) async_error = comm_->AsyncError();
      return async_error.ok() ? done : async_error;
    }
    if (async_error.ok()) {
      async_error = comm_->AsyncError();
      if (async_error.ok() && absl::Now() > deadline) {
        async_error = absl::DeadlineExceededError(
            absl::StrCat("rank ", rank_, ": stream \"", stream->name(),
                         "\" did not finish the step within ",
                         absl::FormatDuration(options_.step_timeout),
                         "; aborted the communicator"));
      }
      if (!async_error.ok()) comm_->Abort();
    }
  }
}

absl::Status StepExecutor::Finish(StepStats* stats) {
  if (!in_flight_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": no step in flight to finish"));
  }
  // A step begun bucket by bucket enqueues what is left first.
  absl::Status s = enqueue_.ended ? absl::OkStatus() : EndEnqueue();
  // Every operation is bounded (collectives by the communicator's timeout),
  // and the streams' work reads step_args_ and this executor: wait for all
  // of it.
  for (device::Stream* stream : streams_) {
    const absl::Status done = WaitForStream(stream);
    if (s.ok()) s = done;
  }
  in_flight_ = false;
  if (s.ok()) {
    timer_.ResolveDeviceTimes(streams_.empty() ? nullptr : streams_[0],
                              {&main_records_, &comm_records_});
  }
  stats->matrices_orthogonalized = counts_.ns_matrices;
  stats->ns_flops = counts_.ns_flops;
  stats->bytes_sent = counts_.bytes_sent;
  stats->bytes_received = counts_.bytes_received;
  stats->buffer_bytes = buffer_bytes_;
  stats->buffer_bound_bytes = buffer_bound_bytes_;
  stats->ops.clear();
  stats->ops.insert(stats->ops.end(), main_records_.begin(),
                    main_records_.end());
  stats->ops.insert(stats->ops.end(), comm_records_.begin(),
                    comm_records_.end());
  std::sort(stats->ops.begin(), stats->ops.end(),
            [](const OpRecord& a, const OpRecord& b) {
              return a.start_s < b.start_s;
            });
  return s;
}

}  // namespace muon
