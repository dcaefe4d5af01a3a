// The blocking form of CoordinatorService::HostJoinAsync, for the tests.
#ifndef MUON_TESTS_SERVER_HOST_JOIN_H_
#define MUON_TESTS_SERVER_HOST_JOIN_H_

#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "server/coordinator_service.h"

namespace muon {
namespace testing {

// Waits for `request`'s answer (the service bounds it by the entries'
// join timeouts).
inline absl::StatusOr<v1::JoinResponse> HostJoin(
    CoordinatorService& service, const v1::HostJoinRequest& request) {
  absl::Notification finished;
  absl::StatusOr<v1::JoinResponse> result;
  service.HostJoinAsync(request, [&](absl::StatusOr<v1::JoinResponse> r) {
    result = std::move(r);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_SERVER_HOST_JOIN_H_
