// A thread-safe key-value store for rendezvous (Gloo's store, NCCL unique
// ids, plan hashes): ranks Set a key once and others Get it, waiting until
// it appears. Waiting Gets hold no thread: GetAsync registers a callback that
// Set, the store's deadline timer or Shutdown completes (gRPC's callback API
// finishes the RPC from there).
//
// Bounds (Limits): key and value sizes, the total bytes held and the number
// of waiting Gets; requests past them get an error naming the limit, before
// anything is stored. A key is set once: setting it again with the same
// value is a no-op, with another value AlreadyExists (a second job cannot
// overwrite the running job's rendezvous). Clear() empties the store (the
// coordinator calls it when a job generation ends).
//
// Lifecycle: construct -> Set/Get from any threads -> Shutdown (completes
// every waiting Get with Unavailable) -> destroy once no call is in flight.
// Thread-safety: every method may be called concurrently; callbacks run
// without the store's lock held.
#ifndef MUON_SERVER_KV_STORE_H_
#define MUON_SERVER_KV_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/deadline_timer.h"

namespace muon {

class KeyValueStore {
 public:
  struct Limits {
    size_t max_key_bytes = 1024;
    size_t max_value_bytes = 1 << 20;  // 1 MiB
    // Sum over keys of key bytes + value bytes.
    int64_t max_total_bytes = int64_t{64} << 20;  // 64 MiB
    // Gets waiting for a key at once (each holds a small record, no thread).
    size_t max_waiting = 1 << 17;
    // Longest wait a Get may ask for; longer requests wait this long.
    absl::Duration max_wait = absl::Minutes(10);
  };
  // Receives the value, or the Get's error; called exactly once.
  using GetCallback = std::function<void(absl::StatusOr<std::string>)>;

  KeyValueStore() : KeyValueStore(Limits()) {}
  explicit KeyValueStore(Limits limits);
  KeyValueStore(const KeyValueStore&) = delete;
  KeyValueStore& operator=(const KeyValueStore&) = delete;
  ~KeyValueStore();

  // Sets `key` and completes the Gets waiting for it.
  // Errors:
  //   InvalidArgument: empty key, key or value over its size limit (names
  //     the sizes and the limit).
  //   AlreadyExists: the key holds another value (names the key).
  //   ResourceExhausted: the store would exceed max_total_bytes.
  //   Unavailable: the store was shut down.
  absl::Status Set(const std::string& key, std::string value);

  // Calls `done` with the value of `key` once it is set, waiting up to
  // `timeout` (<= 0: no wait; capped at max_wait). `done` may run before
  // GetAsync returns (value present, or an error).
  // Errors passed to `done`:
  //   DeadlineExceeded: not set in time (names the key and the timeout).
  //   InvalidArgument: empty key or key over max_key_bytes.
  //   ResourceExhausted: max_waiting Gets are already waiting.
  //   Unavailable: the store was shut down.
  void GetAsync(const std::string& key, absl::Duration timeout,
                GetCallback done);

  // GetAsync, blocking the calling thread until `done` would run.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout);

  // Removes every key (waiting Gets keep waiting).
  void Clear();

  // Number of keys set; bytes held (keys + values); Gets waiting.
  size_t size() const;
  int64_t bytes() const;
  size_t waiting() const;

  // Completes every waiting Get with Unavailable and makes later calls fail
  // the same way. Idempotent.
  void Shutdown();

 private:
  struct Waiter {
    std::string key;
    absl::Duration timeout;
    GetCallback done;
  };

  // Completes waiter `id` with DeadlineExceeded if it still waits.
  void Expire(uint64_t id);

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // Waiter ids per key, in arrival order.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiting_for_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  DeadlineTimer timer_;  // last: destroyed (joined) first
};

}  // namespace muon

#endif  // MUON_SERVER_KV_STORE_H_
