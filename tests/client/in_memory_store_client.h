// InMemoryStoreClient: a CoordinationClient fake for tests whose key-value
// rendezvous (KeySet/KeyGet) is an in-process map, so several ranks run as
// threads of one test process need no coordinator. Every other method
// returns Unimplemented.
//
// Thread-safety: all methods may be called concurrently.
#ifndef MUON_TESTS_CLIENT_IN_MEMORY_STORE_CLIENT_H_
#define MUON_TESTS_CLIENT_IN_MEMORY_STORE_CLIENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    set_keys_.push_back(key);
    return absl::OkStatus();
  }

  // Waits up to `timeout` (on a condition, no polling) for `key`.
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    ++key_gets_;
    auto has_key = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return values_.count(key) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&has_key), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("InMemoryStoreClient: key '", key, "' not set within ",
                       absl::FormatDuration(timeout)));
    }
    return values_[key];
  }

  // Keys in the order they were first or again set.
  std::vector<std::string> set_keys() const {
    absl::MutexLock lock(&mu_);
    return set_keys_;
  }
  int key_gets() const {
    absl::MutexLock lock(&mu_);
    return key_gets_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> set_keys_ ABSL_GUARDED_BY(mu_);
  int key_gets_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_IN_MEMORY_STORE_CLIENT_H_
