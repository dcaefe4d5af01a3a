#include "client/bucket_layout.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace muon {

Box FullBox(const MatrixGeometry& g) {
  return Box{Range{0, g.rows}, Range{0, g.cols}};
}

bool HoldsWhole(const MatrixGeometry& g, int rank) {
  return g.boxes[rank] == FullBox(g);
}

bool HoldsAllRows(const MatrixGeometry& g, int rank) {
  return RowStateBox(g.boxes[rank]) == RowStateBox(FullBox(g));
}

absl::StatusOr<BucketLayout> BucketLayout::Compile(
    int rank, int world_size, const v1::Plan& plan,
    const std::vector<MatrixGeometry>& geometry,
    const BucketLayoutOptions& options) {
  BucketLayout layout(rank, world_size, options);
  const int num_matrices = static_cast<int>(geometry.size());
  std::map<std::pair<std::string, int>, int> local_id;
  for (int m = 0; m < num_matrices; ++m) {
    local_id[{geometry[m].param, geometry[m].slice}] = m;
  }
  for (auto* offsets :
       {&layout.local_o_offset_, &layout.local_u_offset_, &layout.u_offset_,
        &layout.o_offset_, &layout.v_offset_}) {
    offsets->assign(num_matrices, -1);
  }
  layout.bucket_of_.assign(num_matrices, -1);
  std::vector<int> seen(num_matrices, 0);
  for (const v1::Bucket& bp : plan.buckets()) {
    MUON_RETURN_IF_ERROR(
        layout.CompileBucket(plan, bp, geometry, local_id, &seen));
  }
  for (int m = 0; m < num_matrices; ++m) {
    if (seen[m] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": the plan covers matrix \"", geometry[m].param,
          "\" slice ", geometry[m].slice, " ", seen[m],
          " times; every matrix must be in exactly one bucket"));
    }
  }
  return layout;
}

absl::Status BucketLayout::CompileBucket(
    const v1::Plan& plan, const v1::Bucket& bp,
    const std::vector<MatrixGeometry>& geometry,
    const std::map<std::pair<std::string, int>, int>& local_id,
    std::vector<int>* seen) {
  // The schedule names buckets by index, which the executor uses as the
  // position in buckets(): they must agree (ValidatePlan checks it too).
  if (bp.index() != static_cast<int>(buckets_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan bucket ", buckets_.size(), " has index ", bp.index(),
                     " (rank ", rank_, ")"));
  }
  LocalBucket b;
  b.index = bp.index();
  b.gather = Exchange(world_size_);
  b.redistribute = Exchange(world_size_);
  for (int mi : bp.matrices()) {
    if (mi < 0 || mi >= plan.matrices_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan bucket ", bp.index(), " names matrix ", mi, " of ",
                       plan.matrices_size()));
    }
    const v1::MatrixPlan& mp = plan.matrices(mi);
    auto it = local_id.find({mp.param(), mp.slice()});
    // A matrix of parameters this rank does not have (another pipeline
    // stage): zero split sizes, but the bucket's collectives still run.
    if (it == local_id.end()) continue;
    MUON_RETURN_IF_ERROR(CheckPlanMatrix(plan, mi, geometry[it->second]));
    ++(*seen)[it->second];
    AddToBucket(geometry, it->second, mp.owner(), &b);
  }
  const int64_t bucket_elems = PlaceInSlot(geometry, &b);
  for (Exchange* x : {&b.gather, &b.redistribute}) {
    x->Finish();
    const bool bf16 = options_.bf16_exchange;
    sizes_.max_send = std::max(sizes_.max_send,
                               bf16 ? x->send_words_bf16_total : x->send_total);
    sizes_.max_recv = std::max(sizes_.max_recv,
                               bf16 ? x->recv_words_bf16_total : x->recv_total);
  }
  sizes_.max_bucket_elems = std::max(sizes_.max_bucket_elems, bucket_elems);
  buckets_.push_back(std::move(b));
  return absl::OkStatus();
}

absl::Status BucketLayout::CheckPlanMatrix(const v1::Plan& plan, int mi,
                                           const MatrixGeometry& g) const {
  const v1::MatrixPlan& mp = plan.matrices(mi);
  const int owner = mp.owner();
  if (owner < 0 || owner >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
        "): owner ", owner, " out of range for world size ", world_size_));
  }
  if (mp.rows() != g.rows || mp.cols() != g.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
        ") is [", mp.rows(), ", ", mp.cols(), "] but rank ", rank_,
        " has it as [", g.rows, ", ", g.cols, "]"));
  }
  if (g.boxes[owner].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan matrix ", mi, " (\"", mp.param(), "\" slice ", mp.slice(),
        "): owner rank ", owner, " holds no shard of it"));
  }
  return absl::OkStatus();
}

void BucketLayout::AddToBucket(const std::vector<MatrixGeometry>& geometry,
                               int m, int owner, LocalBucket* b) {
  const MatrixGeometry& g = geometry[m];
  bucket_of_[m] = static_cast<int>(buckets_.size());
  b->matrices.push_back(m);
  b->owners.push_back(owner);
  if (owner == rank_) b->owned.push_back(m);
  AddToGather(rank_, m, owner, g.boxes, FullBox(g), &b->gather);
  AddToRedistribute(rank_, m, owner, g.boxes, FullBox(g), &b->redistribute);
  if (options_.row_state) {
    // The row state travels with the matrix: to the owner and back.
    const std::vector<Box> rows = RowStateBoxes(g.boxes);
    const Box all_rows = RowStateBox(FullBox(g));
    AddToGather(rank_, m, owner, rows, all_rows, &b->gather,
                RegionData::kRowState);
    AddToRedistribute(rank_, m, owner, rows, all_rows, &b->redistribute,
                      RegionData::kRowState);
  }
}

int64_t BucketLayout::PlaceLocalBoxes(
    const std::vector<MatrixGeometry>& geometry, const LocalBucket& b) {
  int64_t elems = 0;
  for (int m : b.matrices) {
    const int64_t n = geometry[m].boxes[rank_].numel();
    // An empty box still gets a valid (zero-length) place: custom
    // redistribute functions are handed LocalO of every matrix.
    local_o_offset_[m] = local_u_offset_[m] = elems;
    if (n == 0) continue;
    if (options_.form_update) {
      local_u_offset_[m] = elems;
      elems += n;
    }
    local_o_offset_[m] = elems;
    elems += n;
  }
  return elems;
}

std::vector<std::vector<int>> BucketLayout::GroupOwnedByShape(
    const std::vector<MatrixGeometry>& geometry, LocalBucket* b,
    int64_t* elems) {
  std::vector<std::vector<int>> groups;
  std::map<std::pair<int64_t, int64_t>, size_t> group_of;
  for (int m : b->owned) {
    const MatrixGeometry& g = geometry[m];
    if (HoldsWhole(g, rank_)) {
      // Its own buffers; a custom gather_fn still writes a full U here, and
      // the bf16 exchange its rounded copy of U.
      if (options_.custom_gather || options_.bf16_exchange) {
        u_offset_[m] = *elems;
        *elems += FullBox(g).numel();
      }
      b->ns_batches.push_back(NsBatch{m, 1, false, {m}});
      int64_t& batch = sizes_.owned_shapes[{g.rows, g.cols}];
      batch = std::max<int64_t>(batch, 1);
      continue;
    }
    auto [it, added] = group_of.insert({{g.rows, g.cols}, groups.size()});
    if (added) groups.emplace_back();
    groups[it->second].push_back(m);
  }
  return groups;
}

int64_t BucketLayout::PlaceInSlot(const std::vector<MatrixGeometry>& geometry,
                                  LocalBucket* b) {
  // This rank's boxes of the bucket's matrices: O (redistributed here and
  // applied from here) and, when formed, U.
  int64_t elems = PlaceLocalBoxes(geometry, *b);
  // Owned matrices this rank does not hold whole get full U and O in the
  // slot, grouped by shape (first appearance order): the group's U one
  // after another, then its O.
  for (const std::vector<int>& group : GroupOwnedByShape(geometry, b, &elems)) {
    for (int m : group) {
      u_offset_[m] = elems;
      elems += FullBox(geometry[m]).numel();
    }
    for (int m : group) {
      o_offset_[m] = elems;
      elems += FullBox(geometry[m]).numel();
    }
    for (int m : group) {
      if (!options_.row_state || HoldsAllRows(geometry[m], rank_)) continue;
      v_offset_[m] = elems;
      elems += geometry[m].rows;
    }
    const MatrixGeometry& g = geometry[group[0]];
    int count = static_cast<int>(group.size());
    if (options_.batch_same_shape) {
      b->ns_batches.push_back(NsBatch{group[0], count, true, group});
    } else {
      for (int m : group) b->ns_batches.push_back(NsBatch{m, 1, true, {m}});
      count = 1;
    }
    int64_t& batch = sizes_.owned_shapes[{g.rows, g.cols}];
    batch = std::max<int64_t>(batch, count);
  }
  return elems;
}

}  // namespace muon
