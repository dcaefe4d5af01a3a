// Muon's state_dict / load_state_dict and its checkpoints (Save / Load):
// the rank-symmetric momentum shards (and NorMuon's row state), in the
// safetensors-based format of checkpoint/checkpoint.h.
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "client/muon.h"
#include "client/normuon.h"
#include "common/status_macros.h"
#include "kernels/blas_tiles.h"

namespace muon {
namespace {

std::string Join(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

std::string BoxString(const std::vector<Range>& box) {
  std::vector<std::string> parts;
  for (const Range& r : box) parts.push_back(absl::StrCat(r.begin, ":", r.end));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

// Name of parameter `param`'s momentum buffer in a checkpoint.
std::string MomentumKey(const std::string& param) {
  return absl::StrCat(param, ".momentum_buffer");
}

// Name of parameter `param`'s row state `state` (an OwnerTransform's
// RowStateSpec::name: NorMuon's is dion's "variance_neuron") in a
// checkpoint.
std::string RowStateKey(const std::string& param, const std::string& state) {
  return absl::StrCat(param, ".", state);
}

// The owner transform's row state of a parameter as a checkpoint tensor: the
// parameter's shape with the last dim 1 ([..., rows, 1], as dion's
// param[..., 0:1]), held where the parameter's rows are: a mesh dim that
// shards the last dim replicates it. A rank holding none of the parameter
// holds none of it.
ShardTensorView RowStateTensor(const ParamState& ps,
                               const std::vector<Placement>& placements,
                               const std::string& state) {
  ShardTensorView t;
  t.name = RowStateKey(ps.name, state);
  t.global_shape = ps.global_shape;
  t.global_shape.back() = 1;
  const int last = static_cast<int>(ps.global_shape.size()) - 1;
  for (const Placement& p : placements) {
    t.placements.push_back(p.is_shard() && p.dim == last
                               ? Placement::Replicate().ToString()
                               : p.ToString());
  }
  bool empty = false;
  for (const Range& r : ps.box) empty |= r.size() == 0;
  t.box = ps.box;
  if (!t.box.empty()) t.box.back() = empty ? Range{0, 0} : Range{0, 1};
  return t;
}

// A job resumed on another CPU kernel set keeps going, but its CPU
// Newton-Schulz bits are no longer those of the job that wrote `dir`: say
// so on stderr, naming both (rank 0 only).
void WarnIfOtherBlasCore(int rank, const std::string& dir,
                         const std::string& saved) {
  if (rank != 0 || saved.empty()) return;
  const std::string here = kernels::BlasCoreName();
  if (saved == here) return;
  std::cerr << "muon: warning: checkpoint " << dir
            << " was written with CPU kernels " << saved
            << "; this process runs " << here
            << ": CPU Newton-Schulz results will not be bitwise those of "
               "the writing job\n";
}

}  // namespace

OptimizerStateDict Muon::StateLayout() const {
  OptimizerStateDict sd;
  sd.step = pipeline_->step_count();
  sd.mesh = mesh_;
  sd.plan_hash = pipeline_->plan().hash();
  const std::vector<int> coord = mesh_.Coord(rank_);
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamState ps;
    ps.name = params_[i].name;
    ps.global_shape = params_[i].shape();
    for (const Placement& p : placements_[i].placements) {
      ps.placements.push_back(p.ToString());
    }
    // Checked at Create: the ranges exist for every parameter of this rank.
    absl::StatusOr<std::vector<Range>> box =
        LocalRanges(ps.global_shape, placements_[i].placements, mesh_, coord,
                    placements_[i].sub_mesh);
    if (box.ok()) ps.box = *std::move(box);
    sd.params.push_back(std::move(ps));
  }
  return sd;
}

OptimizerStateDict Muon::state_dict() const {
  OptimizerStateDict sd = StateLayout();
  for (size_t i = 0; i < sd.params.size(); ++i) {
    sd.params[i].momentum_buffer = momentum_buffer(static_cast<int>(i));
    if (owner_transform_ != nullptr) {
      sd.params[i].row_state = row_state(static_cast<int>(i));
    }
  }
  return sd;
}

std::string Muon::StateMismatch(size_t i, const ParamState& want,
                                const ParamState& got) const {
  std::string what;
  if (got.name != want.name) {
    what =
        absl::StrCat("name \"", got.name, "\" (expected \"", want.name, "\")");
  } else if (got.global_shape != want.global_shape) {
    what = absl::StrCat("global shape ", Join(got.global_shape), " (expected ",
                        Join(want.global_shape), ")");
  } else if (!(got.box == want.box)) {
    what = absl::StrCat("shard box ", BoxString(got.box), " (expected ",
                        BoxString(want.box),
                        "; load a checkpoint with Load to reshard)");
  } else if (static_cast<int64_t>(got.momentum_buffer.size()) !=
             state_->momentum(i).size()) {
    what = absl::StrCat("momentum buffer of ", got.momentum_buffer.size(),
                        " values (expected ", state_->momentum(i).size(), ")");
  } else if (static_cast<int64_t>(got.row_state.size()) !=
             state_->row_state(i).size()) {
    what = absl::StrCat(
        owner_transform_ != nullptr ? row_state_name() : "row state", " of ",
        got.row_state.size(), " values (expected ", state_->row_state(i).size(),
        owner_transform_ != nullptr
            ? absl::StrCat(": ", owner_transform_->name(),
                           " keeps one per local row)")
            : ": this optimizer runs without a variant such as normuon)");
  }
  return what;
}

absl::Status Muon::RefuseInOverlappedStep(absl::string_view what) const {
  if (!in_overlapped_step()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank_, ": ", what,
      " during a step begun by MarkReady (the executor is reading and "
      "writing the momentum buffers): call it after Step"));
}

absl::Status Muon::RefuseUnkeptRowState(const CheckpointReader& reader,
                                        const std::string& name) const {
  // Every variant's row state (one today).
  for (const char* state : {kNorMuonRowState}) {
    if (owner_transform_ != nullptr &&
        owner_transform_->row_state().name == state) {
      continue;
    }
    const std::string key = RowStateKey(name, state);
    if (reader.FindTensor(key) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, ": loading \"", name, "\": the checkpoint holds \"",
          key, "\", a row state this optimizer does not keep",
          owner_transform_ == nullptr
              ? " (it runs without a variant such as normuon)"
              : absl::StrCat(" (it runs ", owner_transform_->name(), ")"),
          ": create it with the variant that saved the checkpoint"));
    }
  }
  return absl::OkStatus();
}

absl::Status Muon::load_state_dict(const OptimizerStateDict& state) {
  MUON_RETURN_IF_ERROR(RefuseInOverlappedStep("load_state_dict"));
  const OptimizerStateDict mine = StateLayout();
  if (state.params.size() != mine.params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": load_state_dict: the state holds ",
                     state.params.size(), " parameters but the optimizer has ",
                     mine.params.size()));
  }
  if (state.step < 0 || state.step > kMaxCheckpointStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": load_state_dict: step ", state.step,
                     " is outside [0, ", kMaxCheckpointStep, "]"));
  }
  for (size_t i = 0; i < mine.params.size(); ++i) {
    const ParamState& want = mine.params[i];
    const std::string what = StateMismatch(i, want, state.params[i]);
    if (!what.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, ": load_state_dict: parameter ", i,
                       " (\"", want.name, "\") has ", what));
    }
  }
  for (int i = 0; i < state_->size(); ++i) {
    absl::Status s =
        state_->WriteMomentum(i, state.params[i].momentum_buffer.data());
    if (s.ok()) s = state_->WriteRowState(i, state.params[i].row_state.data());
    if (!s.ok()) {
      // Only a device error gets here: the buffers before i are loaded.
      return absl::Status(
          s.code(),
          absl::StrCat("rank ", rank_, ": load_state_dict: copying ",
                       "the momentum of \"", state.params[i].name, "\" to ",
                       device_.ToString(), ": ", s.message()));
    }
  }
  pipeline_->set_step_count(state.step);
  return absl::OkStatus();
}

bool Muon::RunsCpuNewtonSchulz() const {
  return device_.is_host() && options_.device == device::DeviceKind::kHost;
}

absl::Status Muon::Save(const std::string& dir) const {
  MUON_RETURN_IF_ERROR(RefuseInOverlappedStep("Save"));
  const OptimizerStateDict sd = state_dict();
  CheckpointMetadata meta;
  meta.world_size = world_size_;
  meta.mesh = mesh_;
  meta.plan_hash = pipeline_->plan().hash();
  meta.step = pipeline_->step_count();
  // Only the CPU Newton-Schulz's bits depend on the OpenBLAS kernel set.
  if (RunsCpuNewtonSchulz()) meta.blas_core = kernels::BlasCoreName();
  std::vector<ShardTensorView> tensors;
  for (size_t i = 0; i < sd.params.size(); ++i) {
    const ParamState& ps = sd.params[i];
    if (static_cast<int64_t>(ps.momentum_buffer.size()) !=
        state_->momentum(i).size()) {
      return absl::InternalError(
          absl::StrCat("rank ", rank_, ": Save: the momentum of \"", ps.name,
                       "\" could not be copied from ", device_.ToString()));
    }
    ShardTensorView t;
    t.name = MomentumKey(ps.name);
    t.global_shape = ps.global_shape;
    t.placements = ps.placements;
    t.box = ps.box;
    t.data = ps.momentum_buffer.data();
    tensors.push_back(std::move(t));
    if (owner_transform_ == nullptr) continue;
    if (static_cast<int64_t>(ps.row_state.size()) !=
        state_->row_state(i).size()) {
      return absl::InternalError(
          absl::StrCat("rank ", rank_, ": Save: the row state of \"", ps.name,
                       "\" could not be copied from ", device_.ToString()));
    }
    ShardTensorView v = RowStateTensor(ps, placements_[i].placements,
                                       owner_transform_->row_state().name);
    v.data = ps.row_state.data();
    tensors.push_back(std::move(v));
  }
  absl::Status s = WriteCheckpointShard(dir, rank_, meta, tensors);
  if (s.ok() && rank_ == 0) s = WriteCheckpointMetadata(dir, meta, tensors);
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("rank ", rank_, ": Save: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status Muon::Load(const std::string& dir) {
  MUON_RETURN_IF_ERROR(RefuseInOverlappedStep("Load"));
  MUON_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                        CheckpointReader::Open(dir));
  OptimizerStateDict sd = StateLayout();
  for (size_t i = 0; i < sd.params.size(); ++i) {
    ParamState& ps = sd.params[i];
    MUON_RETURN_IF_ERROR(RefuseUnkeptRowState(*reader, ps.name));
    // ReadRegion fills exactly this many floats.
    ps.momentum_buffer.assign(state_->momentum(i).size(), 0.0f);
    absl::Status s = reader->ReadRegion(MomentumKey(ps.name), ps.global_shape,
                                        ps.box, ps.momentum_buffer.data());
    if (s.ok() && owner_transform_ != nullptr) {
      // Zeros where this rank holds rows of no matrix (an empty box).
      ps.row_state.assign(state_->row_state(i).size(), 0.0f);
      const ShardTensorView v = RowStateTensor(
          ps, placements_[i].placements, owner_transform_->row_state().name);
      s = reader->ReadRegion(v.name, v.global_shape, v.box,
                             ps.row_state.data());
    }
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rank ", rank_, ": loading \"",
                                                 ps.name, "\": ", s.message()));
    }
  }
  sd.step = reader->metadata().step;
  if (RunsCpuNewtonSchulz()) {
    WarnIfOtherBlasCore(rank_, dir, reader->metadata().blas_core);
  }
  return load_state_dict(sd);
}

}  // namespace muon
