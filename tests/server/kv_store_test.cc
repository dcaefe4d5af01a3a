// Tests of server/kv_store.h.
#include "server/kv_store.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

TEST(KeyValueStoreTest, Get_AfterSet_ReturnsValue) {
  KeyValueStore store;
  store.Set("gloo/0", "addr0");
  absl::StatusOr<std::string> v = store.Get("gloo/0", absl::ZeroDuration());
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, "addr0");
  store.Set("gloo/0", "addr1");  // overwrite
  EXPECT_EQ(*store.Get("gloo/0", absl::ZeroDuration()), "addr1");
  EXPECT_EQ(store.size(), 1u);
}

TEST(KeyValueStoreTest, Get_SetLater_WaitsThenReturnsValue) {
  KeyValueStore store;
  std::thread setter([&store] {
    absl::SleepFor(absl::Milliseconds(50));
    store.Set("nccl/id", std::string("\0\1\2", 3));
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = store.Get("nccl/id", absl::Seconds(5));
  setter.join();
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, std::string("\0\1\2", 3));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
}

TEST(KeyValueStoreTest, Get_NeverSet_ReturnsDeadlineExceededNamingKey) {
  KeyValueStore store;
  const absl::Time start = absl::Now();
  EXPECT_THAT(
      store.Get("missing", absl::Milliseconds(100)),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("\"missing\"")));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
}

TEST(KeyValueStoreTest, Get_ZeroTimeout_ReturnsImmediately) {
  KeyValueStore store;
  EXPECT_THAT(store.Get("k", absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("k")));
}

TEST(KeyValueStoreTest, Get_Shutdown_ReturnsUnavailable) {
  KeyValueStore store;
  std::thread stopper([&store] {
    absl::SleepFor(absl::Milliseconds(50));
    store.Shutdown();
  });
  EXPECT_THAT(store.Get("k", absl::Seconds(5)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("\"k\"")));
  stopper.join();
}

}  // namespace
}  // namespace muon
