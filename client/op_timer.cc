#include "client/op_timer.h"

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace muon {

double OpTimer::NowSeconds() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

absl::Status OpTimer::CreateEvents(device::Runtime* rt, int rank,
                                   size_t pairs) {
  MUON_ASSIGN_OR_RETURN(anchor_, rt->CreateTimingEvent(absl::StrCat(
                                     "rank ", rank, " timing anchor")));
  events_.reserve(2 * pairs);
  for (size_t i = 0; i < 2 * pairs; ++i) {
    MUON_ASSIGN_OR_RETURN(
        std::unique_ptr<device::Event> e,
        rt->CreateTimingEvent(absl::StrCat("rank ", rank, " op timing ", i)));
    events_.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status OpTimer::Start(device::Stream* stream, int* pair) {
  *pair = -1;
  if (2 * static_cast<size_t>(next_) + 1 >= events_.size()) {
    return absl::OkStatus();
  }
  MUON_RETURN_IF_ERROR(events_[2 * next_]->Record(stream));
  *pair = next_++;
  return absl::OkStatus();
}

absl::Status OpTimer::End(device::Stream* stream, int pair) {
  if (pair < 0) return absl::OkStatus();
  return events_[2 * pair + 1]->Record(stream);
}

void OpTimer::ResolveDeviceTimes(
    device::Stream* idle,
    std::initializer_list<std::vector<OpRecord>*> records) {
  if (anchor_ == nullptr || next_ == 0 || idle == nullptr) return;
  // The streams are idle: the anchor completes as soon as it is recorded,
  // so the host clock read right after its completion is its device time.
  // Spin on Query (no sleep, which would make the reading late), at most
  // 10 s.
  if (!anchor_->Record(idle).ok()) return;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!anchor_->Query()) {
    if (absl::Now() > give_up) return;
  }
  const double anchor_s = NowSeconds();
  for (std::vector<OpRecord>* list : records) {
    for (OpRecord& r : *list) {
      if (r.timing < 0) continue;
      absl::StatusOr<double> to_start =
          anchor_->SecondsSince(events_[2 * r.timing].get());
      absl::StatusOr<double> to_end =
          anchor_->SecondsSince(events_[2 * r.timing + 1].get());
      if (!to_start.ok() || !to_end.ok()) continue;
      r.start_s = anchor_s - *to_start;
      r.end_s = anchor_s - *to_end;
    }
  }
}

}  // namespace muon
