// InMemoryStoreClient: a CoordinationClient fake for tests whose key-value
// rendezvous (KeySet/KeyGet) is an in-process map, so several ranks run as
// threads of one test process need no coordinator. Every other method
// returns Unimplemented.
//
// Thread-safety: all methods may be called concurrently. Built on std::mutex
// (not absl::Mutex, whose waits Debian's uninstrumented Abseil hides from
// ThreadSanitizer) so that the communicator tests run under --config=tsan.
#ifndef MUON_TESTS_COMM_IN_MEMORY_STORE_CLIENT_H_
#define MUON_TESTS_COMM_IN_MEMORY_STORE_CLIENT_H_

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordination/coordination_client.h"

namespace muon {
namespace testing {

class InMemoryStoreClient : public CoordinationClient {
 public:
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest&) override {
    return absl::UnimplementedError("InMemoryStoreClient: Join");
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest&) override {
    return absl::UnimplementedError("InMemoryStoreClient: Heartbeat");
  }
  absl::Status ReportStep(const v1::StepReport&) override {
    return absl::UnimplementedError("InMemoryStoreClient: ReportStep");
  }
  absl::StatusOr<v1::JobInfo> GetJob() override {
    return absl::UnimplementedError("InMemoryStoreClient: GetJob");
  }
  absl::StatusOr<v1::Plan> GetPlan() override {
    return absl::UnimplementedError("InMemoryStoreClient: GetPlan");
  }
  absl::StatusOr<v1::GetAssignmentsResponse> GetAssignments() override {
    return absl::UnimplementedError("InMemoryStoreClient: GetAssignments");
  }
  absl::StatusOr<v1::ListRanksResponse> ListRanks() override {
    return absl::UnimplementedError("InMemoryStoreClient: ListRanks");
  }

  absl::Status KeySet(const std::string& key,
                      const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    set_keys_.push_back(key);
    cv_.notify_all();
    return absl::OkStatus();
  }

  // Waits up to `timeout` (on a condition, no polling) for `key`.
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++key_gets_;
    const auto bound = timeout == absl::InfiniteDuration()
                           ? std::chrono::nanoseconds(std::chrono::hours(1))
                           : absl::ToChronoNanoseconds(timeout);
    if (!cv_.wait_for(lock, bound,
                      [this, &key] { return values_.count(key) > 0; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("InMemoryStoreClient: key '", key, "' not set within ",
                       absl::FormatDuration(timeout)));
    }
    return values_[key];
  }

  // Keys in the order they were first or again set.
  std::vector<std::string> set_keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_keys_;
  }
  int key_gets() const {
    std::lock_guard<std::mutex> lock(mu_);
    return key_gets_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;                 // signalled by KeySet
  std::map<std::string, std::string> values_;  // guarded by mu_
  std::vector<std::string> set_keys_;          // guarded by mu_
  int key_gets_ = 0;                           // guarded by mu_
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_COMM_IN_MEMORY_STORE_CLIENT_H_
