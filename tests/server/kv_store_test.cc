// Tests of server/kv_store.h.
#include "server/kv_store.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_matchers.h"

namespace muon {
namespace {

using ::testing::HasSubstr;

TEST(KeyValueStoreTest, Set_SameValueAgainOk_OtherValueAlreadyExists) {
  KeyValueStore store;
  ASSERT_THAT(store.Set("gloo/0", "addr0"), IsOk());
  absl::StatusOr<std::string> v = store.Get("gloo/0", absl::ZeroDuration());
  ASSERT_THAT(v, IsOk());
  EXPECT_EQ(*v, "addr0");
  EXPECT_THAT(store.Set("gloo/0", "addr0"), IsOk());  // idempotent retry
  // A second job cannot overwrite the running job's rendezvous.
  EXPECT_THAT(
      store.Set("gloo/0", "addr1"),
      StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("\"gloo/0\"")));
  EXPECT_EQ(*store.Get("gloo/0", absl::ZeroDuration()), "addr0");
  EXPECT_EQ(store.size(), 1u);
}

TEST(KeyValueStoreTest, Set_OverSizeOrTotalLimits_RejectedNothingStored) {
  KeyValueStore::Limits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_total_bytes = 40;
  KeyValueStore store(limits);
  EXPECT_THAT(store.Set("123456789", "v"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("key of 9 bytes")));
  EXPECT_THAT(store.Set("k", std::string(17, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("value of 17 bytes")));
  EXPECT_THAT(store.Set("", "v"),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  ASSERT_THAT(store.Set("a", std::string(16, 'x')), IsOk());  // 17 bytes
  ASSERT_THAT(store.Set("b", std::string(16, 'x')), IsOk());  // 34 bytes
  EXPECT_THAT(
      store.Set("c", std::string(16, 'x')),
      StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("limit is 40")));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.bytes(), 34);
  store.Clear();
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0);
  EXPECT_THAT(store.Set("c", std::string(16, 'x')), IsOk());
}

TEST(KeyValueStoreTest, GetAsync_ManyWaiters_HoldNoThreadAndAllComplete) {
  KeyValueStore::Limits limits;
  limits.max_waiting = 300;
  KeyValueStore store(limits);
  std::atomic<int> got{0};
  for (int i = 0; i < 300; ++i) {
    store.GetAsync("k", absl::Seconds(30),
                   [&got](absl::StatusOr<std::string> v) {
                     if (v.ok() && *v == "v") got.fetch_add(1);
                   });
  }
  EXPECT_EQ(store.waiting(), 300u);
  absl::StatusOr<std::string> over = absl::UnknownError("not run");
  store.GetAsync("k", absl::Seconds(30),
                 [&over](absl::StatusOr<std::string> v) { over = v; });
  EXPECT_THAT(over, StatusIs(absl::StatusCode::kResourceExhausted,
                             HasSubstr("limit is 300")));
  ASSERT_THAT(store.Set("k", "v"), IsOk());  // completes every waiter inline
  EXPECT_EQ(got.load(), 300);
  EXPECT_EQ(store.waiting(), 0u);
}

TEST(KeyValueStoreTest, Get_SetLater_WaitsThenReturnsValue) {
  KeyValueStore store;
  std::thread setter([&store] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_THAT(store.Set("nccl/id", std::string("\0\1\2", 3)), IsOk());
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
