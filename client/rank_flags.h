#ifndef MUON_CLIENT_RANK_FLAGS_H_
#define MUON_CLIENT_RANK_FLAGS_H_

// The step's control values: one float per rank, all-gathered over a
// host-memory process group, so that every rank takes the same decision
// (MuonOptions::check_finite's "some rank has a non-finite gradient",
// transactional_step's "some rank failed the step"). c10d keeps a Gloo
// group beside NCCL for values of this kind; so does this.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"

namespace muon {

class RankFlags {
 public:
  // `control`: a group over the world whose buffers are host memory (not
  // owned; outlives this); nullptr = no collective (a world of one, or a
  // job without a host group, where only this rank's flag is known).
  RankFlags(int rank, int world_size, Communicator* control);

  // Whether Gather exchanges flags (world size > 1 and a control group).
  bool collective() const;

  // Sets this rank's flag to `flag` and, when collective(), all-gathers
  // every rank's (a blocking host collective every rank must call in the
  // same order). Errors: the communicator's.
  absl::Status Gather(float flag);

  // Rank r's flag from the last Gather (0 before any); r in
  // [0, world size).
  float flag(int r) const { return flags_[r]; }

  int world_size() const { return static_cast<int>(flags_.size()); }

  // The first rank in rank order whose flag is not 0, or -1.
  int FirstRaised() const;

  Communicator* control() const { return control_; }

 private:
  int rank_;
  Communicator* control_;
  std::vector<float> flags_;   // one per rank
  std::vector<int64_t> ones_;  // the all-gather's counts: 1 per rank
};

}  // namespace muon

#endif  // MUON_CLIENT_RANK_FLAGS_H_
