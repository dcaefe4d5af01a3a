#include "client/rank_flags.h"

namespace muon {

RankFlags::RankFlags(int rank, int world_size, Communicator* control)
    : rank_(rank),
      control_(control),
      flags_(world_size, 0.0f),
      ones_(world_size, 1) {}

bool RankFlags::collective() const {
  return flags_.size() > 1 && control_ != nullptr;
}

absl::Status RankFlags::Gather(float flag) {
  flags_[rank_] = flag;
  if (!collective()) return absl::OkStatus();
  return control_->AllGatherV(&flag, 1, flags_.data(), ones_);
}

int RankFlags::FirstRaised() const {
  for (size_t r = 0; r < flags_.size(); ++r) {
    if (flags_[r] != 0.0f) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace muon
