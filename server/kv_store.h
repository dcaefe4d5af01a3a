// A thread-safe key-value store for rendezvous (Gloo's store, NCCL unique
// ids): ranks Set a key once and others Get it, waiting until it appears.
//
// Lifecycle: construct -> Set/Get from any threads -> Shutdown (wakes every
// waiting Get with Unavailable) -> destroy once no call is in flight.
// Thread-safety: every method may be called concurrently.
#ifndef MUON_SERVER_KV_STORE_H_
#define MUON_SERVER_KV_STORE_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muon {

class KeyValueStore {
 public:
  KeyValueStore() = default;
  KeyValueStore(const KeyValueStore&) = delete;
  KeyValueStore& operator=(const KeyValueStore&) = delete;

  // Sets (or overwrites) `key` and wakes the Gets waiting for it.
  void Set(const std::string& key, std::string value);

  // Returns the value of `key`, waiting up to `timeout` for it to be set
  // (timeout <= 0: no wait).
  // Errors:
  //   DeadlineExceeded: the key was not set in time (names the key and the
  //     timeout).
  //   Unavailable: the store was shut down.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout);

  // Number of keys set.
  size_t size() const;

  // Makes every waiting and later Get return Unavailable. Idempotent.
  void Shutdown();

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace muon

#endif  // MUON_SERVER_KV_STORE_H_
