#include "server/kv_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace muon {
namespace {

absl::Status ShutDownError(const std::string& key) {
  return absl::UnavailableError(absl::StrCat(
      "key-value store is shutting down; key \"", key, "\" not read"));
}

}  // namespace

KeyValueStore::KeyValueStore(Limits limits) : limits_(limits) {}

KeyValueStore::~KeyValueStore() { Shutdown(); }

absl::Status KeyValueStore::Set(const std::string& key, std::string value) {
  if (key.empty())
    return absl::InvalidArgumentError("KeySet: the key is empty");
  if (key.size() > limits_.max_key_bytes ||
      value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KeySet: key of ", key.size(), " bytes and value of ", value.size(),
        " bytes; the limits are ", limits_.max_key_bytes, " and ",
        limits_.max_value_bytes, " bytes"));
  }
  std::vector<std::pair<GetCallback, std::string>> ready;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) {
      return absl::UnavailableError(absl::StrCat(
          "key-value store is shutting down; key \"", key, "\" not set"));
    }
    auto it = values_.find(key);
    if (it != values_.end()) {
      if (it->second == value) return absl::OkStatus();
      return absl::AlreadyExistsError(absl::StrCat(
          "KeySet: key \"", key,
          "\" is already set to another value (keys are set once per job)"));
    }
    const int64_t added = static_cast<int64_t>(key.size() + value.size());
    if (bytes_ + added > limits_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KeySet: key \"", key, "\" would bring the store to ", bytes_ + added,
          " bytes; the limit is ", limits_.max_total_bytes));
    }
    bytes_ += added;
    auto waiting = waiting_for_.find(key);
    if (waiting != waiting_for_.end()) {
      for (uint64_t id : waiting->second) {
        auto w = waiters_.find(id);
        if (w == waiters_.end()) continue;
        ready.emplace_back(std::move(w->second.done), value);
        waiters_.erase(w);
      }
      waiting_for_.erase(waiting);
    }
    values_.emplace(key, std::move(value));
  }
  for (auto& [done, v] : ready) done(std::move(v));
  return absl::OkStatus();
}

void KeyValueStore::GetAsync(const std::string& key, absl::Duration timeout,
                             GetCallback done) {
  if (key.empty() || key.size() > limits_.max_key_bytes) {
    done(absl::InvalidArgumentError(absl::StrCat("KeyGet: key of ", key.size(),
                                                 " bytes; must be 1..",
                                                 limits_.max_key_bytes)));
    return;
  }
  timeout = std::min(std::max(timeout, absl::ZeroDuration()), limits_.max_wait);
  absl::StatusOr<std::string> now_result;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (shutdown_) {
      now_result = ShutDownError(key);
    } else if (it != values_.end()) {
      now_result = it->second;
    } else if (timeout <= absl::ZeroDuration()) {
      now_result = absl::DeadlineExceededError(
          absl::StrCat("key \"", key, "\" is not set"));
    } else if (waiters_.size() >= limits_.max_waiting) {
      now_result = absl::ResourceExhaustedError(
          absl::StrCat("KeyGet: ", waiters_.size(),
                       " calls already wait for keys; the "
                       "limit is ",
                       limits_.max_waiting));
    } else {
      const uint64_t id = next_waiter_++;
      waiters_.emplace(id, Waiter{key, timeout, std::move(done)});
      waiting_for_[key].push_back(id);
      timer_.Schedule(absl::Now() + timeout, [this, id] { Expire(id); });
      return;
    }
  }
  done(std::move(now_result));
}

void KeyValueStore::Expire(uint64_t id) {
  GetCallback done;
  std::string key;
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    auto w = waiters_.find(id);
    if (w == waiters_.end()) return;  // completed already
    done = std::move(w->second.done);
    key = w->second.key;
    timeout = w->second.timeout;
    waiters_.erase(w);
    auto waiting = waiting_for_.find(key);
    if (waiting != waiting_for_.end()) {
      auto& ids = waiting->second;
      ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
      if (ids.empty()) waiting_for_.erase(waiting);
    }
  }
  done(absl::DeadlineExceededError(absl::StrCat(
      "key \"", key, "\" was not set within ", absl::FormatDuration(timeout))));
}

absl::StatusOr<std::string> KeyValueStore::Get(const std::string& key,
                                               absl::Duration timeout) {
  absl::Notification finished;
  absl::StatusOr<std::string> result;
  GetAsync(key, timeout, [&](absl::StatusOr<std::string> r) {
    result = std::move(r);
    finished.Notify();
  });
  finished.WaitForNotification();
  return result;
}

void KeyValueStore::Clear() {
  absl::MutexLock lock(&mu_);
  values_.clear();
  bytes_ = 0;
}

size_t KeyValueStore::size() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

int64_t KeyValueStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

size_t KeyValueStore::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

void KeyValueStore::Shutdown() {
  std::vector<std::pair<GetCallback, std::string>> stopped;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    for (auto& [id, w] : waiters_) {
      stopped.emplace_back(std::move(w.done), w.key);
    }
    waiters_.clear();
    waiting_for_.clear();
  }
  timer_.Shutdown();
  for (auto& [done, key] : stopped) done(ShutDownError(key));
}

}  // namespace muon
