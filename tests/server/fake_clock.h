// A clock tests move by hand (CoordinatorService::Options::now).
#ifndef MUON_TESTS_SERVER_FAKE_CLOCK_H_
#define MUON_TESTS_SERVER_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muon {
namespace testing {

class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_SERVER_FAKE_CLOCK_H_
