#include "server/kv_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {

void KeyValueStore::Set(const std::string& key, std::string value) {
  absl::MutexLock lock(&mu_);
  values_[key] = std::move(value);
}

absl::StatusOr<std::string> KeyValueStore::Get(const std::string& key,
                                               absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, &key]() {
    mu_.AssertReaderHeld();
    return shutdown_ || values_.contains(key);
  };
  if (!ready() && timeout > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  if (shutdown_) {
    return absl::UnavailableError(absl::StrCat(
        "key-value store is shutting down; key \"", key, "\" not read"));
  }
  auto it = values_.find(key);
  if (it == values_.end()) {
    return absl::DeadlineExceededError(
        absl::StrCat("key \"", key, "\" was not set within ",
                     absl::FormatDuration(timeout)));
  }
  return it->second;
}

size_t KeyValueStore::size() const {
  absl::MutexLock lock(&mu_);
  return values_.size();
}

void KeyValueStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

}  // namespace muon
