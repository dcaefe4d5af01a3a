#include "comm/local_communicator.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace muon {
namespace communicator_internal {
namespace {

std::string Where(absl::string_view backend, absl::string_view op, int rank) {
  return absl::StrCat(backend, " ", op, " on rank ", rank, ": ");
}

// Checks one count vector; on success stores its total in `*total`.
absl::Status CheckCounts(absl::string_view where, absl::string_view name,
                         const std::vector<int64_t>& counts, int world_size,
                         int64_t* total) {
  if (counts.size() != static_cast<size_t>(world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, name, " has ", counts.size(),
                     " entries; want world_size ", world_size));
  }
  // The total's bytes must fit int64 (backends compute them).
  constexpr int64_t kMaxTotal =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(float));
  int64_t sum = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, name, "[", p, "] is ", counts[p], "; want >= 0"));
    }
    if (counts[p] > kMaxTotal - sum) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, name, " sum past ", name, "[", p, "] = ", counts[p],
          " exceeds ", kMaxTotal, " elements (int64 bytes)"));
    }
    sum += counts[p];
  }
  *total = sum;
  return absl::OkStatus();
}

absl::Status CheckBuffer(absl::string_view where, absl::string_view name,
                         const float* buffer, int64_t total) {
  if (buffer == nullptr && total > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, name, " is null but ", total, " elements are to be moved"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckAllToAllV(absl::string_view backend, int rank, int world_size,
                            const float* send,
                            const std::vector<int64_t>& send_counts,
                            const float* recv,
                            const std::vector<int64_t>& recv_counts) {
  const std::string where = Where(backend, "AllToAllV", rank);
  int64_t send_total = 0;
  int64_t recv_total = 0;
  MUON_RETURN_IF_ERROR(
      CheckCounts(where, "send_counts", send_counts, world_size, &send_total));
  MUON_RETURN_IF_ERROR(
      CheckCounts(where, "recv_counts", recv_counts, world_size, &recv_total));
  if (send_counts[rank] != recv_counts[rank]) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "send_counts[", rank, "] is ", send_counts[rank],
                     " but recv_counts[", rank, "] is ", recv_counts[rank],
                     "; a rank's share to itself must match"));
  }
  MUON_RETURN_IF_ERROR(CheckBuffer(where, "send", send, send_total));
  MUON_RETURN_IF_ERROR(CheckBuffer(where, "recv", recv, recv_total));
  return absl::OkStatus();
}

absl::Status CheckAllGatherV(absl::string_view backend, int rank,
                             int world_size, const float* send,
                             int64_t send_count, const float* recv,
                             const std::vector<int64_t>& recv_counts) {
  const std::string where = Where(backend, "AllGatherV", rank);
  int64_t recv_total = 0;
  MUON_RETURN_IF_ERROR(
      CheckCounts(where, "recv_counts", recv_counts, world_size, &recv_total));
  if (send_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "send_count is ", send_count, "; want >= 0"));
  }
  if (recv_counts[rank] != send_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "recv_counts[", rank, "] is ", recv_counts[rank],
                     " but send_count is ", send_count));
  }
  MUON_RETURN_IF_ERROR(CheckBuffer(where, "send", send, send_count));
  MUON_RETURN_IF_ERROR(CheckBuffer(where, "recv", recv, recv_total));
  return absl::OkStatus();
}

absl::Status CheckBroadcast(absl::string_view backend, int rank, int world_size,
                            const float* data, int64_t count, int root) {
  const std::string where = Where(backend, "Broadcast", rank);
  if (root < 0 || root >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "root is ", root, "; want 0 <= root < world_size ", world_size));
  }
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "count is ", count, "; want >= 0"));
  }
  return CheckBuffer(where, "data", data, count);
}

absl::Status CheckSplit(absl::string_view backend, int rank, int world_size,
                        const std::vector<int>& ranks) {
  const std::string where = Where(backend, "Split", rank);
  if (ranks.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "ranks is empty"));
  }
  bool has_self = false;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "ranks[", i, "] is ", ranks[i],
                       "; want 0 <= rank < world_size ", world_size));
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "ranks [", absl::StrJoin(ranks, ","),
                       "] are not strictly ascending"));
    }
    has_self = has_self || ranks[i] == rank;
  }
  if (!has_self) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "ranks [", absl::StrJoin(ranks, ","),
                     "] do not contain this rank ", rank));
  }
  return absl::OkStatus();
}

}  // namespace communicator_internal

std::unique_ptr<Communicator> LocalCommunicator::Create() {
  return std::unique_ptr<Communicator>(new LocalCommunicator());
}

absl::Status LocalCommunicator::CheckNotAborted(absl::string_view op) const {
  if (aborted_.load()) {
    return absl::AbortedError(
        absl::StrCat("local ", op, " on rank 0: communicator was aborted"));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllToAllV(
    const float* send, const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  MUON_RETURN_IF_ERROR(CheckNotAborted("AllToAllV"));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllToAllV(
      backend(), 0, 1, send, send_counts, recv, recv_counts));
  if (send_counts[0] > 0) {
    std::memmove(recv, send, send_counts[0] * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::AllGatherV(
    const float* send, int64_t send_count, float* recv,
    const std::vector<int64_t>& recv_counts) {
  MUON_RETURN_IF_ERROR(CheckNotAborted("AllGatherV"));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllGatherV(
      backend(), 0, 1, send, send_count, recv, recv_counts));
  if (send_count > 0) {
    std::memmove(recv, send, send_count * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status LocalCommunicator::Broadcast(float* data, int64_t count,
                                          int root) {
  MUON_RETURN_IF_ERROR(CheckNotAborted("Broadcast"));
  return communicator_internal::CheckBroadcast(backend(), 0, 1, data, count,
                                               root);
}

absl::Status LocalCommunicator::Barrier() { return CheckNotAborted("Barrier"); }

absl::StatusOr<std::unique_ptr<Communicator>> LocalCommunicator::Split(
    const std::vector<int>& ranks) {
  MUON_RETURN_IF_ERROR(CheckNotAborted("Split"));
  MUON_RETURN_IF_ERROR(
      communicator_internal::CheckSplit(backend(), 0, 1, ranks));
  return Create();
}

void LocalCommunicator::Abort() { aborted_.store(true); }

}  // namespace muon
