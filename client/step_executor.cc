#include "client/step_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace muon {
namespace {

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

Box FullBox(const ParamGeometry& g) {
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
                           std::vector<ParamGeometry> geometry,
                           GatherFn gather_fn, RedistributeFn redistribute_fn)
    : rank_(rank),
      world_size_(world_size),
      comm_(comm),
      geometry_(std::move(geometry)),
      gather_fn_(std::move(gather_fn)),
      redistribute_fn_(std::move(redistribute_fn)) {}

bool StepExecutor::HoldsFull(int param) const {
  const ParamGeometry& g = geometry_[param];
  return g.boxes[rank_] == FullBox(g);
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    int rank, int world_size, const v1::Plan& plan,
    std::vector<ParamGeometry> geometry, Communicator* comm,
    GatherFn gather_fn, RedistributeFn redistribute_fn) {
  if (comm == nullptr && world_size != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": a world of ", world_size, " ranks needs a communicator"));
  }
  const int num_params = static_cast<int>(geometry.size());
  for (int p = 0; p < num_params; ++p) {
    if (static_cast<int>(geometry[p].boxes.size()) != world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": parameter ", p, " has ", geometry[p].boxes.size(),
          " shard boxes for a world of ", world_size));
    }
  }
  std::unique_ptr<StepExecutor> ex(
      new StepExecutor(rank, world_size, comm, std::move(geometry),
                       std::move(gather_fn), std::move(redistribute_fn)));
  const auto& geo = ex->geometry_;
  ex->full_u_.resize(num_params);
  ex->full_o_.resize(num_params);
  ex->local_o_.resize(num_params);
  for (int p = 0; p < num_params; ++p) {
    ex->local_o_[p].resize(geo[p].boxes[rank].numel());
  }
  std::vector<int> seen(num_params, 0);
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
      const v1::MatrixPlan& m = plan.matrices(mi);
      const int p = m.param_index();
      const int owner = m.owner();
      if (p < 0 || p >= num_params || owner < 0 || owner >= world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", m.param(), "\"): parameter index ", p,
            " or owner ", owner, " out of range (", num_params,
            " parameters, world size ", world_size, ")"));
      }
      if (m.rows() != geo[p].rows || m.cols() != geo[p].cols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", m.param(), "\") is [", m.rows(), ", ",
            m.cols(), "] but parameter ", p, " is [", geo[p].rows, ", ",
            geo[p].cols, "]"));
      }
      if (geo[p].boxes[owner].empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "plan matrix ", mi, " (\"", m.param(), "\"): owner rank ", owner,
            " holds no shard of it"));
      }
      ++seen[p];
      b.params.push_back(p);
      b.owners.push_back(owner);
      max_rows = std::max(max_rows, geo[p].rows);
      max_cols = std::max(max_cols, geo[p].cols);
      const Box full = FullBox(geo[p]);
      const bool owner_full = geo[p].boxes[owner] == full;
      if (owner == rank) {
        b.owned.push_back(p);
        // A custom gather_fn always writes a full buffer.
        if (!owner_full || ex->gather_fn_) ex->full_u_[p].resize(full.numel());
        if (!owner_full) ex->full_o_[p].resize(full.numel());
      }
      // Gather: one source per distinct box (the owner itself when it holds
      // that box, else the lowest rank holding it).
      if (!owner_full) {
        std::vector<Box> distinct;
        for (int r = 0; r < world_size; ++r) {
          const Box& box = geo[p].boxes[r];
          if (box.empty()) continue;
          if (std::find(distinct.begin(), distinct.end(), box) !=
              distinct.end()) {
            continue;
          }
          distinct.push_back(box);
          int source = r;
          if (geo[p].boxes[owner] == box) source = owner;
          if (source == owner) {
            if (rank == owner) b.gather.self.push_back({p, box});
          } else if (rank == source) {
            b.gather.send[owner].push_back({p, box});
            b.gather.send_counts[owner] += box.numel();
          } else if (rank == owner) {
            b.gather.recv[source].push_back({p, box});
            b.gather.recv_counts[source] += box.numel();
          }
        }
      }
      // Redistribute: the owner sends every other holder its box of O.
      for (int h = 0; h < world_size; ++h) {
        const Box& box = geo[p].boxes[h];
        if (box.empty()) continue;
        if (h == owner) {
          if (rank == owner && !owner_full) {
            b.redistribute.self.push_back({p, box});
          }
        } else if (rank == owner) {
          b.redistribute.send[h].push_back({p, box});
          b.redistribute.send_counts[h] += box.numel();
        } else if (rank == h) {
          b.redistribute.recv[owner].push_back({p, box});
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
  for (int p = 0; p < num_params; ++p) {
    if (seen[p] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan covers parameter ", p, " ", seen[p],
          " times; every parameter must be in exactly one bucket"));
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
  auto src_of = [&](int p, Box* holds) -> const float* {
    const ParamGeometry& g = geometry_[p];
    if (to_owner) {
      *holds = g.boxes[rank_];
      return updates[p];
    }
    *holds = FullBox(g);
    return HoldsFull(p) ? local_o_[p].data() : full_o_[p].data();
  };
  auto dst_of = [&](int p, Box* holds) -> float* {
    const ParamGeometry& g = geometry_[p];
    if (to_owner) {
      *holds = FullBox(g);
      return full_u_[p].data();
    }
    *holds = g.boxes[rank_];
    return local_o_[p].data();
  };
  Box src_holds, dst_holds;
  for (const RegionCopy& c : x.self) {
    const float* src = src_of(c.param, &src_holds);
    float* dst = dst_of(c.param, &dst_holds);
    CopyRegion(src, src_holds, dst, dst_holds, c.region);
  }
  if (world_size_ == 1) return absl::OkStatus();
  int64_t off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.send[q]) {
      const float* src = src_of(c.param, &src_holds);
      CopyRegion(src, src_holds, send_buf_.data() + off, c.region, c.region);
      off += c.region.numel();
    }
  }
  MUON_RETURN_IF_ERROR(comm_->AllToAllV(send_buf_.data(), x.send_counts,
                                        recv_buf_.data(), x.recv_counts));
  off = 0;
  for (int q = 0; q < world_size_; ++q) {
    for (const RegionCopy& c : x.recv[q]) {
      float* dst = dst_of(c.param, &dst_holds);
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
    for (size_t i = 0; i < b.params.size(); ++i) {
      const int p = b.params[i];
      const bool mine = b.owners[i] == rank_;
      float* full = mine ? full_u_[p].data() : nullptr;
      MUON_RETURN_IF_ERROR(gather_fn_(p, b.owners[i], updates[p], full));
    }
  } else {
    MUON_RETURN_IF_ERROR(RunExchange(b.gather, /*to_owner=*/true, updates, stats));
  }
  double t1 = NowSeconds();
  stats->ops.push_back(MakeOp("gather", b.index, t0, t1,
                              b.gather.send_total * 4, 0));
  // 2. Orthogonalize the matrices this rank owns.
  double flops = 0;
  for (int p : b.owned) {
    const ParamGeometry& g = geometry_[p];
    const float* u =
        HoldsFull(p) && !gather_fn_ ? updates[p] : full_u_[p].data();
    float* o = HoldsFull(p) ? local_o_[p].data() : full_o_[p].data();
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
    for (size_t i = 0; i < b.params.size(); ++i) {
      const int p = b.params[i];
      const bool mine = b.owners[i] == rank_;
      const float* full = nullptr;
      if (mine) full = HoldsFull(p) ? local_o_[p].data() : full_o_[p].data();
      MUON_RETURN_IF_ERROR(
          redistribute_fn_(p, b.owners[i], full, local_o_[p].data()));
    }
  } else {
    MUON_RETURN_IF_ERROR(
        RunExchange(b.redistribute, /*to_owner=*/false, updates, stats));
  }
  double t3 = NowSeconds();
  stats->ops.push_back(MakeOp("redistribute", b.index, t2, t3,
                              b.redistribute.send_total * 4, 0));
  // 4. Apply: decoupled weight decay and the AdjustLR-scaled update, on the
  // local shard, with AdjustLR from the GLOBAL shape.
  for (int p : b.params) {
    const ParamGeometry& g = geometry_[p];
    const int64_t n = static_cast<int64_t>(local_o_[p].size());
    if (n == 0) continue;
    const double adjusted =
        kernels::AdjustLr(rule.lr, rule.adjust_lr_fn, g.rows, g.cols);
    kernels::ApplyUpdate(params[p], local_o_[p].data(), n, rule.lr,
                         rule.weight_decay, adjusted);
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
