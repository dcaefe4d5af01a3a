// gMock matchers for absl::Status / absl::StatusOr (Abseil 20220623 ships
// none): EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
// HasSubstr("rank 2"))).
#ifndef MUON_TESTS_STATUS_MATCHERS_H_
#define MUON_TESTS_STATUS_MATCHERS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace muon {
namespace testing_internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace testing_internal

// Matches a Status or StatusOr whose code is `code` and whose message
// matches `message_matcher`.
MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = testing_internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code &&
         ::testing::Matches(message_matcher)(std::string(s.message()));
}

// Matches an OK Status or StatusOr.
MATCHER(IsOk, "is OK") {
  const absl::Status& s = testing_internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

}  // namespace muon

#endif  // MUON_TESTS_STATUS_MATCHERS_H_
