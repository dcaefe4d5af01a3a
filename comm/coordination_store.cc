#include "comm/coordination_store.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

// After a KeyGet that said "not yet" sooner than asked (an implementation
// that does not block), wait this long before asking again.
constexpr absl::Duration kMinRetryDelay = absl::Milliseconds(5);
// Between attempts while the coordinator answers Unavailable.
constexpr absl::Duration kUnavailableRetryDelay = absl::Milliseconds(50);

absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

CoordinationStoreError::CoordinationStoreError(absl::Status status)
    : gloo::IoException(status.ToString()), status_(std::move(status)) {}

CoordinationStore::CoordinationStore(CoordinationClient* client,
                                     CoordinationStoreOptions options)
    : client_(client), options_(options) {}

CoordinationStore::~CoordinationStore() = default;

void CoordinationStore::Cancel() { cancelled_.store(true); }

absl::Status CoordinationStore::Set(const std::string& key,
                                    const std::string& value) {
  const absl::Time give_up = absl::Now() + options_.unavailable_grace;
  absl::Duration delay = absl::Milliseconds(10);
  while (true) {
    if (cancelled_.load()) {
      return absl::AbortedError(absl::StrCat(
          "CoordinationStore: cancelled before setting key '", key, "'"));
    }
    absl::Status status = client_->KeySet(key, value);
    if (status.ok()) return status;
    const absl::Time now = absl::Now();
    if (status.code() != absl::StatusCode::kUnavailable || now >= give_up) {
      return Annotate(status,
                      absl::StrCat("CoordinationStore: KeySet '", key, "': "));
    }
    absl::SleepFor(std::min(delay, give_up - now));
    delay = std::min(delay * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<std::string> CoordinationStore::GetUntil(
    const std::string& key, absl::Time deadline, absl::Duration timeout) {
  // Bounded: every iteration either returns or waits for a positive slice
  // of the time left before `deadline`, and stops once it has passed.
  // Unavailable is retried until it has lasted options_.unavailable_grace.
  std::optional<absl::Time> unavailable_since;
  while (true) {
    if (cancelled_.load()) {
      return absl::AbortedError(absl::StrCat(
          "CoordinationStore: cancelled while waiting for key '", key, "'"));
    }
    const absl::Time start = absl::Now();
    const absl::Duration slice =
        std::max(absl::ZeroDuration(),
                 std::min(options_.poll_interval, deadline - start));
    absl::StatusOr<std::string> value = client_->KeyGet(key, slice);
    if (value.ok()) return value;
    const absl::StatusCode code = value.status().code();
    if (code == absl::StatusCode::kUnavailable) {
      if (!unavailable_since.has_value()) unavailable_since = start;
    } else {
      unavailable_since.reset();
    }
    const bool transient =
        unavailable_since.has_value() &&
        absl::Now() - *unavailable_since < options_.unavailable_grace;
    if (code != absl::StatusCode::kDeadlineExceeded &&
        code != absl::StatusCode::kNotFound && !transient) {
      return Annotate(value.status(),
                      absl::StrCat("CoordinationStore: KeyGet '", key, "': "));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      if (transient) {  // the coordinator never answered in the meantime
        return Annotate(
            value.status(),
            absl::StrCat("CoordinationStore: KeyGet '", key,
                         "' (unavailable until the ",
                         absl::FormatDuration(timeout), " deadline): "));
      }
      return absl::DeadlineExceededError(
          absl::StrCat("CoordinationStore: key '", key, "' not set within ",
                       absl::FormatDuration(timeout)));
    }
    if (transient) {
      absl::SleepFor(std::min(kUnavailableRetryDelay, deadline - now));
    } else if (now - start < slice) {
      absl::SleepFor(std::min(kMinRetryDelay, deadline - now));
    }
  }
}

absl::StatusOr<std::string> CoordinationStore::Get(const std::string& key,
                                                   absl::Duration timeout) {
  return GetUntil(key, absl::Now() + timeout, timeout);
}

absl::StatusOr<bool> CoordinationStore::Has(const std::string& key) {
  if (cancelled_.load()) {
    return absl::AbortedError(absl::StrCat(
        "CoordinationStore: cancelled before reading key '", key, "'"));
  }
  absl::StatusOr<std::string> value =
      client_->KeyGet(key, absl::ZeroDuration());
  if (value.ok()) return true;
  const absl::StatusCode code = value.status().code();
  if (code == absl::StatusCode::kNotFound ||
      code == absl::StatusCode::kDeadlineExceeded) {
    return false;
  }
  return Annotate(value.status(),
                  absl::StrCat("CoordinationStore: KeyGet '", key, "': "));
}

absl::Status CoordinationStore::Wait(const std::vector<std::string>& keys,
                                     absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = GetUntil(key, deadline, timeout);
    if (!value.ok()) return value.status();
  }
  return absl::OkStatus();
}

void CoordinationStore::set(const std::string& key,
                            const std::vector<char>& data) {
  absl::Status status = Set(key, std::string(data.begin(), data.end()));
  if (!status.ok()) throw CoordinationStoreError(std::move(status));
}

std::vector<char> CoordinationStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = Get(key, options_.timeout);
  if (!value.ok()) throw CoordinationStoreError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void CoordinationStore::wait(const std::vector<std::string>& keys) {
  absl::Status status = Wait(keys, options_.timeout);
  if (!status.ok()) throw CoordinationStoreError(std::move(status));
}

void CoordinationStore::wait(const std::vector<std::string>& keys,
                             const std::chrono::milliseconds& timeout) {
  const absl::Duration bound =
      timeout.count() > 0 ? absl::FromChrono(timeout) : options_.timeout;
  absl::Status status = Wait(keys, bound);
  if (!status.ok()) throw CoordinationStoreError(std::move(status));
}

}  // namespace muon
