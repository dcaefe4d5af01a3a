#include "client/exchange_plan.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace muon {

void Exchange::Finish() {
  send_total = 0;
  recv_total = 0;
  for (int64_t c : send_counts) send_total += c;
  for (int64_t c : recv_counts) recv_total += c;
  auto words = [](const std::vector<int64_t>& counts, std::vector<int64_t>* out,
                  int64_t* total) {
    out->resize(counts.size());
    *total = 0;
    for (size_t q = 0; q < counts.size(); ++q) {
      (*out)[q] = (counts[q] + 1) / 2;
      *total += (*out)[q];
    }
  };
  words(send_counts, &send_words_bf16, &send_words_bf16_total);
  words(recv_counts, &recv_words_bf16, &recv_words_bf16_total);
}

void AddToGather(int rank, int matrix, int owner, const std::vector<Box>& boxes,
                 const Box& full, Exchange* gather, RegionData data) {
  if (boxes[owner] == full) return;  // the owner has it all
  const int world_size = static_cast<int>(boxes.size());
  // Each distinct box once, from its first holder (or the owner): a hash
  // set, so that a matrix sharded over W ranks costs O(W), not O(W^2).
  absl::flat_hash_set<Box> distinct;
  for (int r = 0; r < world_size; ++r) {
    const Box& box = boxes[r];
    if (box.empty() || !distinct.insert(box).second) continue;
    const int source = boxes[owner] == box ? owner : r;
    if (source == owner) {
      if (rank == owner) gather->self.push_back({matrix, box, data});
    } else if (rank == source) {
      gather->send[owner].push_back({matrix, box, data});
      gather->send_counts[owner] += box.numel();
    } else if (rank == owner) {
      gather->recv[source].push_back({matrix, box, data});
      gather->recv_counts[source] += box.numel();
    }
  }
}

void AddToRedistribute(int rank, int matrix, int owner,
                       const std::vector<Box>& boxes, const Box& full,
                       Exchange* redistribute, RegionData data) {
  const bool owner_full = boxes[owner] == full;
  const int world_size = static_cast<int>(boxes.size());
  for (int h = 0; h < world_size; ++h) {
    const Box& box = boxes[h];
    if (box.empty()) continue;
    if (h == owner) {
      if (rank == owner && !owner_full) {
        redistribute->self.push_back({matrix, box, data});
      }
    } else if (rank == owner) {
      redistribute->send[h].push_back({matrix, box, data});
      redistribute->send_counts[h] += box.numel();
    } else if (rank == h) {
      redistribute->recv[owner].push_back({matrix, box, data});
      redistribute->recv_counts[owner] += box.numel();
    }
  }
}

Box RowStateBox(const Box& box) {
  if (box.empty()) return Box{};
  return Box{box.rows, Range{0, 1}};
}

std::vector<Box> RowStateBoxes(const std::vector<Box>& boxes) {
  std::vector<Box> out;
  out.reserve(boxes.size());
  for (const Box& b : boxes) out.push_back(RowStateBox(b));
  return out;
}

}  // namespace muon
