// Timing of a step's operations. On the host an operation is timed by the
// host clock around its work (the host stream runs it). On CUDA the host
// only enqueues the work, so each operation is bracketed by a pair of
// timing events on its stream (cudaEventRecord), and after the step the
// events' device times are placed on the host clock (as torch.cuda.Event's
// elapsed_time measures, anchored by one more event recorded on an idle
// stream), so that a trace shows the real GPU timeline.
#ifndef MUON_CLIENT_OP_TIMER_H_
#define MUON_CLIENT_OP_TIMER_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "device/runtime.h"
#include "device/stream.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// Timing of one operation (no allocation on the step path).
struct OpRecord {
  v1::OpKind op = v1::OP_KIND_UNSPECIFIED;
  v1::StreamKind stream = v1::STREAM_KIND_UNSPECIFIED;
  int bucket = 0;
  double start_s = 0;  // seconds since the Unix epoch
  double end_s = 0;
  int64_t bytes = 0;  // fp32 payload this rank sent
  double flops = 0;   // Newton-Schulz FLOPs
  // CUDA: the OpTimer pair of timing events bracketing the operation's
  // device work; -1 on the host, whose start_s / end_s time the work
  // itself.
  int timing = -1;
};

// A preallocated pool of timing-event pairs, handed out in order during a
// step. Thread-compatible: Start is called by the thread that enqueues
// (CUDA streams run the operations' enqueue code on it).
class OpTimer {
 public:
  // No events: every Start hands out -1 (the host).
  OpTimer() = default;
  OpTimer(OpTimer&&) = default;
  OpTimer& operator=(OpTimer&&) = default;

  // The current time in seconds since the Unix epoch (OpRecord's clock).
  static double NowSeconds();

  // Creates `pairs` pairs of timing events and the anchor on `rt` (a CUDA
  // runtime; names them after `rank`). Errors: the runtime's.
  absl::Status CreateEvents(device::Runtime* rt, int rank, size_t pairs);
  // Starts a step: every pair is free again.
  void Reset() { next_ = 0; }
  // Records the next free pair's first event on `stream` and sets *pair to
  // its index; -1 (nothing recorded) when none is left. Errors: the
  // event's.
  absl::Status Start(device::Stream* stream, int* pair);
  // Records pair's second event on `stream` (no-op for -1).
  absl::Status End(device::Stream* stream, int pair);
  // After the streams are synchronized: replaces the start_s / end_s of
  // every record with a pair by the device times of its events, placed on
  // the host clock by the anchor, recorded on `idle` (an idle stream of
  // the same device). Keeps the enqueue times when the events cannot be
  // read, or the anchor does not complete within 10 s.
  void ResolveDeviceTimes(
      device::Stream* idle,
      std::initializer_list<std::vector<OpRecord>*> records);

 private:
  std::vector<std::unique_ptr<device::Event>> events_;  // 2 per pair
  std::unique_ptr<device::Event> anchor_;
  int next_ = 0;  // pairs handed out this step
};

}  // namespace muon

#endif  // MUON_CLIENT_OP_TIMER_H_
