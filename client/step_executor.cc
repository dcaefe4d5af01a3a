#include "client/step_executor.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace muon {
namespace {

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

Box FullBox(const MatrixGeometry& g) {
  return Box{Range{0, g.rows}, Range{0, g.cols}};
}

v1::OpTiming MakeOp(const char* op, int bucket, double start, double end,
                    int64_t bytes, double flops) {
  v1::OpTiming t;
  t.set_op(op);
  t.set_bucket(bucket);
  t.set_start_s(start);
  t.set_end_s(end);
  t.set_bytes(bytes);
  t.set_flops(flops);
  return t;
}

}  // namespace

StepExecutor::StepExecutor(int rank, int world_size, Communicator* comm,
                           std::vector<MatrixGeometry> geometry,
                           GatherFn gather_fn, RedistributeFn redistribute_fn)
    : rank_(rank),
      world_size_(world_size),
      comm_(comm),
      geometry_(std::move(geometry)),
      gather_fn_(std::move(gather_fn)),
      redistribute_fn_(std::move(redistribute_fn)) {}

bool StepExecutor::HoldsFull(int m) const {
  const MatrixGeometry& g = geometry_[m];
  return g.boxes[rank_] == FullBox(g);
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    int rank, int world_size, const v1::Plan& plan,
    std::vector<MatrixGeometry> geometry, Communicator* comm,
    GatherFn gather_fn, RedistributeFn redistribute_fn) {
  if (comm == nullptr && world_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": a world of ", world_size, " ranks needs a communicator"));
  }
  const int num_matrices = static_cast<int>(geometry.size());
  std::map<std::pair<std::string, int>, int> local_id;
  for (int m = 0; m < num_matrices; ++m) {
    if (static_cast<int>(geometry[m].boxes.size()) != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": matrix \"", geometry[m].param, "\" has ",
          geometry[m].boxes.size(), " shard boxes for a world of ", world_size));
    }
    local_id[{geometry[m].param, geometry[m].slice}] = m;
  }
  std::unique_ptr<StepExecutor> ex(
      new StepExecutor(rank, world_size, comm, std::move(geometry),
                       std::move(gather_fn), std::move(redistribute_fn)));
  const auto& geo = ex->geometry_;
  ex->full_u_.resize(num_matrices);
  ex->full_o_.resize(num_matrices);
  ex->local_o_.resize(num_matrices);
  for (int m = 0; m < num_matrices; ++m) {
    ex->local_o_[m].resize(geo[m].boxes[rank].numel());
  }
  std::vector<int> seen(num_matrices, 0);
  int64_t max_send = 0, max_recv = 0;
  int64_t max_rows = 1, max_cols = 1;
  for (const v1::Bucket& bp : plan.buckets()) {
    BucketSchedule b;
    b.index = bp.index();
    for (Exchange* x : {&b.gather, &b.redistribute}) {
      x->send_counts.assign(world_size, 0);
      x->recv_counts.assign(world_size, 0);
      x->send.resize(world_size);
      x->recv.resize(world_size);
    }
    for (int mi : bp.matrices()) {
      if (mi < 0 || mi >= plan.matrices_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan bucket ", bp.index(), " names matrix ", mi, " of ",
            plan.matrices_size()));
      }
      const v1::MatrixPlan& mp = plan.matrices(mi);
      auto it = local_id.find({mp.param(), mp.slice()});
      // A matrix of parameters this rank does not have (another pipeline
      // stage): zero split sizes, but the bucket's collectives still run.
      if (it == local_id.end()) continue;
      const int m = it->second;
      const int owner = mp.owner();
      if (owner < 0 || owner >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
            "): owner ", owner, " out of range for world size ", world_size));
      }
      if (mp.rows() != geo[m].rows || mp.cols() != geo[m].cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
            ") is [", mp.rows(), ", ", mp.cols(), "] but rank ", rank,
            " has it as [", geo[m].rows, ", ", geo[m].cols, "]"));
      }
      if (geo[m].boxes[owner].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
            "): owner rank ", owner, " holds no shard of it"));
      }
      ++seen[m];
      b.matrices.push_back(m);
      b.owners.push_back(owner);
      max_rows = std::max(max_rows, geo[m].rows);
      max_cols = std::max(max_cols, geo[m].cols);
      const Box full = FullBox(geo[m]);
      const bool owner_full = geo[m].boxes[owner] == full;
      if (owner == rank) {
        b.owned.push_back(m);
        // A custom gather_fn always writes a full buffer.
        if (!owner_full || ex->gather_fn_) ex->full_u_[m].resize(full.numel());
        if (!owner_full) ex->full_o_[m].resize(full.numel());
      }
      // Gather: one source per distinct box (the owner itself when it holds
      // that box, else the lowest rank holding it).
      if (!owner_full) {
        std::vector<Box> distinct;
        for (int r = 0; r < world_size; ++r) {
          const Box& box = geo[m].boxes[r];
          if (box.empty()) continue;
          if (std::find(distinct.begin(), distinct.end(), box) !=
              distinct.end()) {
            continue;
          }
          distinct.push_back(box);
          int source = r;
          if (geo[m].boxes[owner] == box) source = owner;
          if (source == owner) {
            if (rank == owner) b.gather.self.push_back({m, box});
          } else if (rank == source) {
            b.gather.send[owner].push_back({m, box});
            b.gather.send_counts[owner] += box.numel();
          } else if (rank == owner) {
            b.gather.recv[source].push_back({m, box});
            b.gather.recv_counts[source] += box.numel();
          }
        }
      }
      // Redistribute: the owner sends every other holder its box of O.
      for (int h = 0; h < world_size; ++h) {
        const Box& box = geo[m].boxes[h];
        if (box.empty()) continue;
        if (h == owner) {
          if (rank == owner && !owner_full) {
            b.redistribute.self.push_back({m, box});
          }
        } else if (rank == owner) {
          b.redistribute.send[h].push_back({m, box});
          b.redistribute.send_counts[h] += box.numel();
        } else if (rank == h) {
          b.redistribute.recv[owner].push_back({m, box});
          b.redistribute.recv_counts[owner] += box.numel();
        }
      }
    }
    for (Exchange* x : {&b.gather, &b.redistribute}) {
      for (int q = 0; q < world_size; ++q) {
        x->send_total += x->send_counts[q];
        x->recv_total += x->recv_counts[q];
      }
      max_send = std::max(max_send, x->send_total);
      max_recv = std::max(max_recv, x->recv_total);
    }
    ex->buckets_.push_back(std::move(b));
  }
  for (int m = 0; m < num_matrices; ++m) {
    if (seen[m] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": the plan covers matrix \"", geo[m].param,
          "\" slice ", geo[m].slice, " ", seen[m],
          " times; every matrix must be in exactly one bucket"));
    }
  }
  ex->send_buf_.resize(max_send);
  ex->recv_buf_.resize(max_recv);
  ex->ns_workspace_.Reserve(max_rows, max_cols);
  return ex;
}

absl::Status StepExecutor::RunExchange(const Exchange& x, bool to_owner,
                                       const std::vector<const float*>& updates,
                                       StepStats* stats) {
  // Source and destination of parameter p's data on this rank.
  auto src_of = [&](int m, Box* holds) -> const float* {
    const MatrixGeometry& g = geometry_[m];
    if (to_owner) {
      *holds = g.boxes[rank_];
      return updates[g.param_index] + g.offset;
    }
    *holds = FullBox(g);
    return HoldsFull(m) ? local_o_[m].data() : full_o_[m].data();
  };
  auto dst_of = [&](int m, Box* holds) -> float* {
    const MatrixGeometry& g = geometry_[m];
    if (to_owner) {
      *holds = FullBox(g);
      return full_u_[m].data();
    }
    *holds = g.boxes[rank_];
    return local_o_[m].data();
  };
  Box src_holds, dst_holds;
  for (const RegionCopy& c : x.self) {
    const float* src = src_of(c.matrix, &src_holds);
    float* dst = dst_of(c.matrix, &dst_holds);
    CopyRegion(src, src_holds, dst, dst_holds, c.region);
  }
  if (world_size_ == 1) return absl::OkStatus();
  int64_t off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.send[q]) {
      const float* src = src_of(c.matrix, &src_holds);
      CopyRegion(src, src_holds, send_buf_.data() + off, c.region, c.region);
      off += c.region.numel();
    }
  }
  MUON_RETURN_IF_ERROR(comm_->AllToAllV(send_buf_.data(), x.send_counts,
                                        recv_buf_.data(), x.recv_counts));
  off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.recv[q]) {
      float* dst = dst_of(c.matrix, &dst_holds);
      CopyRegion(recv_buf_.data() + off, c.region, dst, dst_holds, c.region);
      off += c.region.numel();
    }
  }
  stats->bytes_sent += x.send_total * static_cast<int64_t>(sizeof(float));
  stats->bytes_received += x.recv_total * static_cast<int64_t>(sizeof(float));
  return absl::OkStatus();
}

absl::Status StepExecutor::RunBucket(const BucketSchedule& b,
                                     const std::vector<const float*>& updates,
                                     const std::vector<float*>& params,
                                     const UpdateRule& rule, StepStats* stats) {
  // 1. Gather U to owners.
  double t0 = NowSeconds();
  if (gather_fn_) {
    for (size_t i = 0; i < b.matrices.size(); ++i) {
      const int m = b.matrices[i];
      const MatrixGeometry& g = geometry_[m];
      float* full = b.owners[i] == rank_ ? full_u_[m].data() : nullptr;
      MUON_RETURN_IF_ERROR(gather_fn_(g.param_index, g.slice, b.owners[i],
                                      updates[g.param_index] + g.offset, full));
    }
  } else {
    MUON_RETURN_IF_ERROR(RunExchange(b.gather, /*to_owner=*/true, updates, stats));
  }
  double t1 = NowSeconds();
  stats->ops.push_back(MakeOp("gather", b.index, t0, t1,
                              b.gather.send_total * 4, 0));
  // 2. Orthogonalize the matrices this rank owns.
  double flops = 0;
  for (int m : b.owned) {
    const MatrixGeometry& g = geometry_[m];
    const float* u = HoldsFull(m) && !gather_fn_
                         ? updates[g.param_index] + g.offset
                         : full_u_[m].data();
    float* o = HoldsFull(m) ? local_o_[m].data() : full_o_[m].data();
    MUON_RETURN_IF_ERROR(
        kernels::NewtonSchulz(u, g.rows, g.cols, rule.ns, o, &ns_workspace_));
    const double f = kernels::NewtonSchulzFlops(g.rows, g.cols, rule.ns.steps);
    flops += f;
    stats->ns_flops += f;
    ++stats->matrices_orthogonalized;
  }
  double t2 = NowSeconds();
  stats->ops.push_back(MakeOp("orthogonalize", b.index, t1, t2, 0, flops));
  // 3. Redistribute O to every holder.
  if (redistribute_fn_) {
    for (size_t i = 0; i < b.matrices.size(); ++i) {
      const int m = b.matrices[i];
      const MatrixGeometry& g = geometry_[m];
      const float* full = nullptr;
      if (b.owners[i] == rank_) {
        full = HoldsFull(m) ? local_o_[m].data() : full_o_[m].data();
      }
      MUON_RETURN_IF_ERROR(redistribute_fn_(g.param_index, g.slice, b.owners[i],
                                            full, local_o_[m].data()));
    }
  } else {
    MUON_RETURN_IF_ERROR(
        RunExchange(b.redistribute, /*to_owner=*/false, updates, stats));
  }
  double t3 = NowSeconds();
  stats->ops.push_back(MakeOp("redistribute", b.index, t2, t3,
                              b.redistribute.send_total * 4, 0));
  // 4. Apply: decoupled weight decay and the AdjustLR-scaled update, on the
  // local shard, with AdjustLR from the matrix's GLOBAL shape.
  for (int m : b.matrices) {
    const MatrixGeometry& g = geometry_[m];
    const int64_t n = static_cast<int64_t>(local_o_[m].size());
    if (n == 0) continue;
    const double adjusted =
        kernels::AdjustLr(rule.lr, rule.adjust_lr_fn, g.rows, g.cols);
    kernels::ApplyUpdate(params[g.param_index] + g.offset, local_o_[m].data(),
                         n, rule.lr, rule.weight_decay, adjusted);
  }
  double t4 = NowSeconds();
  stats->ops.push_back(MakeOp("apply", b.index, t3, t4, 0, 0));
  return absl::OkStatus();
}

absl::Status StepExecutor::Run(const std::vector<const float*>& updates,
                               const std::vector<float*>& params,
                               const UpdateRule& rule, StepStats* stats) {
  for (const BucketSchedule& b : buckets_) {
    MUON_RETURN_IF_ERROR(RunBucket(b, updates, params, rule, stats));
  }
  return absl::OkStatus();
}

}  // namespace muon
