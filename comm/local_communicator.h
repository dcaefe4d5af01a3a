// LocalCommunicator: the in-process Communicator for a world of one rank
// (a single-process job, tests, tools). Collectives are local copies, the
// barrier returns at once, Split({0}) gives another world of one.
//
// Also home of the argument checks every backend shares
// (communicator_internal::Check*), so all backends reject the same calls
// with the same InvalidArgument messages.
#ifndef MUON_COMM_LOCAL_COMMUNICATOR_H_
#define MUON_COMM_LOCAL_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/communicator.h"

namespace muon {

namespace communicator_internal {

// Checks of one collective's arguments on one rank, before any
// communication. Each returns InvalidArgument with a message
// "<backend> <Op> on rank <rank>: <parameter> ..." naming the values, or OK.

// AllToAllV: both count vectors have `world_size` entries, counts are >= 0,
// send_counts[rank] == recv_counts[rank] (the local share), and a buffer is
// null only when its total is zero.
absl::Status CheckAllToAllV(absl::string_view backend, int rank, int world_size,
                            const float* send,
                            const std::vector<int64_t>& send_counts,
                            const float* recv,
                            const std::vector<int64_t>& recv_counts);

// AllGatherV: recv_counts has `world_size` entries >= 0,
// recv_counts[rank] == send_count, buffers null only for zero totals.
absl::Status CheckAllGatherV(absl::string_view backend, int rank,
                             int world_size, const float* send,
                             int64_t send_count, const float* recv,
                             const std::vector<int64_t>& recv_counts);

// Broadcast: 0 <= root < world_size, count >= 0, data non-null if count > 0.
absl::Status CheckBroadcast(absl::string_view backend, int rank, int world_size,
                            const float* data, int64_t count, int root);

// Split: `ranks` non-empty, strictly ascending, within [0, world_size) and
// containing `rank`.
absl::Status CheckSplit(absl::string_view backend, int rank, int world_size,
                        const std::vector<int>& ranks);

}  // namespace communicator_internal

// Lifecycle: Create -> collectives -> destroy. Abort() makes every later
// call return Aborted.
// Thread-safety: all methods may be called from any thread; calls are
// independent local copies (two concurrent calls must not write the same
// buffers, as with any backend).
class LocalCommunicator : public Communicator {
 public:
  // Never fails.
  static std::unique_ptr<Communicator> Create();

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "local"; }

  // Copies send_counts[0] elements from `send` to `recv` (they may overlap).
  // Errors: InvalidArgument (see CheckAllToAllV), Aborted (after Abort).
  absl::Status AllToAllV(const float* send,
                         const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;

  // Copies `send_count` elements from `send` to `recv`.
  // Errors: InvalidArgument (see CheckAllGatherV), Aborted.
  absl::Status AllGatherV(const float* send, int64_t send_count, float* recv,
                          const std::vector<int64_t>& recv_counts) override;

  // No data moves (the root's buffer already holds the data).
  // Errors: InvalidArgument (root != 0, count < 0), Aborted.
  absl::Status Broadcast(float* data, int64_t count, int root) override;

  // Returns at once. Errors: Aborted.
  absl::Status Barrier() override;

  // Split({0}) returns a new LocalCommunicator.
  // Errors: InvalidArgument (any other list), Aborted.
  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>& ranks) override;

  void Abort() override;

 private:
  LocalCommunicator() = default;

  absl::Status CheckNotAborted(absl::string_view op) const;

  std::atomic<bool> aborted_{false};
};

}  // namespace muon

#endif  // MUON_COMM_LOCAL_COMMUNICATOR_H_
