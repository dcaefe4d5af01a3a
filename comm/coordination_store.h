// CoordinationStore: Gloo's rendezvous key-value store
// (gloo::rendezvous::Store) on top of the coordinator's KeySet/KeyGet, so a
// Gloo process group rendezvouses through the same coordinator that plans
// the job instead of a separate Redis or file store.
//
// Who talks to whom: gloo::rendezvous::Context::connectFullMesh (usually
// through a gloo::rendezvous::PrefixStore) -> CoordinationStore ->
// CoordinationClient (gRPC or in-process) -> the coordinator's key-value
// store.
//
// Two faces:
//   - Set/Get/Wait return absl::Status, for our own code and tests.
//   - set/get/wait implement gloo::rendezvous::Store and throw
//     CoordinationStoreError (a gloo::IoException carrying the Status), the
//     only way to report errors through Gloo's interface. GlooCommunicator
//     turns it back into the Status at its boundary.
//
// Waiting is polling: KeyGet is called with at most `poll_interval` per call
// until the key appears or the overall timeout passes, so every wait is
// bounded and Cancel() takes effect within one poll interval.
//
// Lifecycle: construct -> use -> (optionally Cancel) -> destroy. The client
// is not owned and must outlive the store.
//
// Thread-safety: all methods may be called concurrently from any thread
// (CoordinationClient is thread-safe; the store itself has no mutable state
// besides the atomic cancel flag).
#ifndef MUON_COMM_COORDINATION_STORE_H_
#define MUON_COMM_COORDINATION_STORE_H_

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordination/coordination_client.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"

namespace muon {

struct CoordinationStoreOptions {
  // Bound on Gloo's calls that carry no timeout of their own (get(key),
  // wait(keys)) and on wait(keys, timeout) when Gloo passes zero ("no
  // timeout"): waits here are never unbounded.
  absl::Duration timeout = absl::Seconds(60);
  // Longest single KeyGet call while waiting for a key; also how quickly
  // Cancel() is noticed.
  absl::Duration poll_interval = absl::Milliseconds(100);
  // How long Set and Get retry a coordinator that answers Unavailable (a
  // connection refused or reset, a server overloaded at start-up), within
  // their own timeout, before they return that error: transient failures
  // are ridden out, a coordinator that is gone is reported.
  absl::Duration unavailable_grace = absl::Seconds(5);
};

// What the gloo::rendezvous::Store methods throw: a gloo::IoException (so
// Gloo's own code treats it as an I/O failure) whose what() is the Status
// text, with the Status kept for callers that catch this type.
class CoordinationStoreError : public gloo::IoException {
 public:
  explicit CoordinationStoreError(absl::Status status);

  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class CoordinationStore : public gloo::rendezvous::Store {
 public:
  // `client` is not owned and must outlive this store; it must be non-null.
  explicit CoordinationStore(CoordinationClient* client,
                             CoordinationStoreOptions options = {});
  ~CoordinationStore() override;

  CoordinationStore(const CoordinationStore&) = delete;
  CoordinationStore& operator=(const CoordinationStore&) = delete;

  // Stores `value` under `key` (overwrites), retrying Unavailable for up to
  // options.unavailable_grace.
  // Errors: Aborted (cancelled), and KeySet's errors (Unavailable after the
  // grace), the message naming the key.
  absl::Status Set(const std::string& key, const std::string& value);

  // Waits up to `timeout` for `key` and returns its value. A timeout <= 0
  // makes a single attempt.
  // Errors:
  //   DeadlineExceeded: the key was not set within `timeout` (names the key
  //     and the timeout).
  //   Aborted: Cancel() was called.
  //   Unavailable: the coordinator answered Unavailable for longer than
  //     options.unavailable_grace (shorter bouts are retried), or until
  //     the deadline.
  //   Any other code KeyGet returns besides NotFound and DeadlineExceeded
  //     (which mean "not yet"): the coordinator failed.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout);

  // Whether `key` is set now: one KeyGet without waiting or retrying.
  // Errors: Aborted (cancelled); KeyGet's other than NotFound and
  // DeadlineExceeded (which mean false).
  absl::StatusOr<bool> Has(const std::string& key);

  // Waits until every key of `keys` is set, all within one `timeout`.
  // Errors: as Get.
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout);

  // Makes pending and future Set/Get/Wait return Aborted (and the Gloo
  // methods throw) within one poll interval. Irreversible.
  void Cancel();

  // gloo::rendezvous::Store. Each throws CoordinationStoreError with the
  // Status of the corresponding method above. get() waits up to
  // options.timeout for the key (Gloo calls it without waiting first);
  // wait(keys) uses options.timeout; wait(keys, timeout) uses `timeout`, or
  // options.timeout when it is zero or negative.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  absl::StatusOr<std::string> GetUntil(const std::string& key,
                                       absl::Time deadline,
                                       absl::Duration timeout);

  CoordinationClient* const client_;  // Not owned.
  const CoordinationStoreOptions options_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace muon

#endif  // MUON_COMM_COORDINATION_STORE_H_
