// Gives a test process one job secret in its environment (MUON_JOB_SECRET,
// kept when already set) before any test runs, so the muon-coordinator
// daemons, ranks and muonctl processes it starts all share it, as muonrun
// and the launcher arrange for real jobs. Include it once per test binary
// that starts a daemon or ranks against one; TestJobSecret() is the value.
#ifndef MUON_TESTS_JOB_SECRET_ENV_H_
#define MUON_TESTS_JOB_SECRET_ENV_H_

#include <cstdlib>
#include <string>

namespace muon {
namespace testing {

inline const std::string& TestJobSecret() {
  static const std::string* secret = [] {
    setenv("MUON_JOB_SECRET", "muon-test-job-secret-5f2c9a", /*overwrite=*/0);
    return new std::string(std::getenv("MUON_JOB_SECRET"));
  }();
  return *secret;
}

// Sets the variable at static-initialization time, before main.
inline const bool kTestJobSecretSet = !TestJobSecret().empty();

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_JOB_SECRET_ENV_H_
