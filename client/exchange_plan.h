// The exchanges of one bucket as one rank sees them: which regions of which
// matrices it packs for each peer, unpacks from each peer, and copies
// locally, with the exact all-to-all(v) split sizes. Pure layout math (no
// communication, no allocation beyond the lists), compiled once by the step
// executor (client/step_executor.h) and table-tested on its own.
//
// Gather (shards of U -> the owner's full U): every distinct shard box of a
// matrix travels once, from the owner itself when it holds that box, else
// from the lowest rank holding it; an owner holding the whole matrix
// receives nothing. Redistribute (the owner's full O -> every holder's
// shard): the owner sends each other holder (replicas included) its box.
#ifndef MUON_CLIENT_EXCHANGE_PLAN_H_
#define MUON_CLIENT_EXCHANGE_PLAN_H_

#include <cstdint>
#include <vector>

#include "common/layout.h"

namespace muon {

// What a region copies: the matrix's values (U to the owner, O back), or
// its per-row optimizer state (NorMuon's second moment, one float per row
// of the matrix: a [rows, 1] column, see RowStateBoxes).
enum class RegionData { kMatrix, kRowState };

// A region (global coordinates) of local matrix `matrix`.
struct RegionCopy {
  int matrix = 0;
  Box region;
  RegionData data = RegionData::kMatrix;
  friend bool operator==(const RegionCopy& a, const RegionCopy& b) {
    return a.matrix == b.matrix && a.region == b.region && a.data == b.data;
  }
};

// One all-to-all(v) from one rank's side.
struct Exchange {
  Exchange() = default;
  explicit Exchange(int world_size)
      : send_counts(world_size, 0),
        recv_counts(world_size, 0),
        send(world_size),
        recv(world_size) {}

  std::vector<int64_t> send_counts;  // per peer, elements (fp32)
  std::vector<int64_t> recv_counts;
  std::vector<std::vector<RegionCopy>> send;  // per peer, packing order
  std::vector<std::vector<RegionCopy>> recv;  // per peer, unpacking order
  std::vector<RegionCopy> self;               // local copies
  int64_t send_total = 0;  // sums of the counts, set by Finish
  int64_t recv_total = 0;
  // The bf16 exchange's split sizes (set by Finish): per peer, the fp32
  // words that carry its bf16 values two by two, ceil(count / 2) (a
  // peer's part starts on a word boundary), and their sums.
  std::vector<int64_t> send_words_bf16;
  std::vector<int64_t> recv_words_bf16;
  int64_t send_words_bf16_total = 0;
  int64_t recv_words_bf16_total = 0;

  // Sums the split sizes into send_total / recv_total and derives the bf16
  // exchange's words.
  void Finish();
};

// Adds local matrix `matrix` (global box `full`, rank r holding boxes[r];
// owner `owner`) to the gather exchange of `rank`; its regions copy
// `data`. Requires boxes.size() == the exchange's world size,
// 0 <= owner, rank < it.
void AddToGather(int rank, int matrix, int owner, const std::vector<Box>& boxes,
                 const Box& full, Exchange* gather,
                 RegionData data = RegionData::kMatrix);

// Adds local matrix `matrix` to the redistribute exchange of `rank` (same
// arguments as AddToGather).
void AddToRedistribute(int rank, int matrix, int owner,
                       const std::vector<Box>& boxes, const Box& full,
                       Exchange* redistribute,
                       RegionData data = RegionData::kMatrix);

// The per-row state of a matrix seen as a [rows, 1] column: the box of it a
// holder of `box` keeps (box's rows, column 0; empty when `box` is), as
// dion's variance_neuron (param[..., 0:1]) is sharded with the rows.
Box RowStateBox(const Box& box);
// RowStateBox of every rank's box.
std::vector<Box> RowStateBoxes(const std::vector<Box>& boxes);

}  // namespace muon

#endif  // MUON_CLIENT_EXCHANGE_PLAN_H_
