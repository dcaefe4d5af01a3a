#include "comm/coordination_store.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/in_memory_store_client.h"

namespace muon {
namespace {

using ::muon::testing::InMemoryStoreClient;
using ::testing::HasSubstr;

MATCHER_P(StatusIs, code, "") { return arg.code() == code; }

// A client whose coordinator is unreachable.
class UnreachableClient : public InMemoryStoreClient {
 public:
  absl::Status KeySet(const std::string&, const std::string&) override {
    return absl::UnavailableError("coordinator unreachable");
  }
  absl::StatusOr<std::string> KeyGet(const std::string&,
                                     absl::Duration) override {
    ++gets_;
    return absl::UnavailableError("coordinator unreachable");
  }
  int gets_ = 0;
};

CoordinationStoreOptions ShortOptions() {
  CoordinationStoreOptions options;
  options.timeout = absl::Milliseconds(300);
  options.poll_interval = absl::Milliseconds(50);
  return options;
}

TEST(CoordinationStoreTest, Set_ThenGet_ReturnsValue) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  ASSERT_TRUE(store.Set("k", std::string("v\0w", 3)).ok());
  absl::StatusOr<std::string> value = store.Get("k", absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("v\0w", 3));
}

TEST(CoordinationStoreTest,
     Get_MissingKey_ReturnsDeadlineExceededAfterPolling) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value =
      store.Get("missing", absl::Milliseconds(300));
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_THAT(value.status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("'missing'"));
  EXPECT_GE(elapsed, absl::Milliseconds(250));
  EXPECT_LT(elapsed, absl::Seconds(3));
  // 300 ms in 50 ms slices.
  EXPECT_GE(client.key_gets(), 3);
}

TEST(CoordinationStoreTest, Wait_KeySetLaterByAnotherThread_ReturnsOk) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  std::thread setter([&client] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(client.KeySet("b", "2").ok());
  });
  ASSERT_TRUE(client.KeySet("a", "1").ok());
  EXPECT_TRUE(store.Wait({"a", "b"}, absl::Seconds(5)).ok());
  setter.join();
}

TEST(CoordinationStoreTest,
     Wait_OneKeyMissing_ReturnsDeadlineExceededNamingKey) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  ASSERT_TRUE(client.KeySet("a", "1").ok());
  absl::Status status = store.Wait({"a", "b"}, absl::Milliseconds(200));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(status.message()), HasSubstr("'b'"));
}

TEST(CoordinationStoreTest,
     GlooWait_MissingKey_ThrowsDeadlineExceededWithinTimeout) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  gloo::rendezvous::Store& gloo_store = store;
  const absl::Time start = absl::Now();
  try {
    gloo_store.wait({"missing"}, std::chrono::milliseconds(200));
    ADD_FAILURE() << "wait did not throw";
  } catch (const CoordinationStoreError& e) {
    EXPECT_THAT(e.status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_THAT(e.what(), HasSubstr("missing"));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(CoordinationStoreTest, GlooWait_ZeroTimeout_UsesOptionsTimeout) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());  // 300 ms.
  gloo::rendezvous::Store& gloo_store = store;
  const absl::Time start = absl::Now();
  EXPECT_THROW(gloo_store.wait({"missing"}, std::chrono::milliseconds(0)),
               CoordinationStoreError);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, absl::Milliseconds(250));
  EXPECT_LT(elapsed, absl::Seconds(3));
}

TEST(CoordinationStoreTest, GlooGet_MissingKey_ThrowsIoException) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  gloo::rendezvous::Store& gloo_store = store;
  // Gloo code that catches its own IoException sees ours too.
  EXPECT_THROW(gloo_store.get("missing"), gloo::IoException);
}

TEST(CoordinationStoreTest, GlooSetGet_ThroughPrefixStore_UsesPrefixedKeys) {
  InMemoryStoreClient client;
  CoordinationStore store(&client, ShortOptions());
  gloo::rendezvous::PrefixStore prefix_store("job7", store);
  prefix_store.set("0", std::vector<char>{'x', 'y'});
  EXPECT_EQ(prefix_store.get("0"), (std::vector<char>{'x', 'y'}));
  EXPECT_THAT(client.set_keys(), ::testing::ElementsAre("job7/0"));
}

TEST(CoordinationStoreTest, Cancel_DuringWait_ReturnsAbortedPromptly) {
  InMemoryStoreClient client;
  CoordinationStoreOptions options = ShortOptions();
  options.timeout = absl::Seconds(20);
  CoordinationStore store(&client, options);
  std::thread canceller([&store] {
    absl::SleepFor(absl::Milliseconds(100));
    store.Cancel();
  });
  const absl::Time start = absl::Now();
  absl::Status status = store.Wait({"missing"}, absl::Seconds(20));
  canceller.join();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kAborted));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(store.Set("k", "v"), StatusIs(absl::StatusCode::kAborted));
}

// With no grace, Unavailable is returned at once: one KeyGet, one KeySet.
TEST(CoordinationStoreTest,
     Get_CoordinatorUnavailable_NoGrace_ReturnsUnavailableWithoutRetry) {
  UnreachableClient client;
  CoordinationStoreOptions options = ShortOptions();
  options.unavailable_grace = absl::ZeroDuration();
  CoordinationStore store(&client, options);
  absl::StatusOr<std::string> value = store.Get("k", absl::Seconds(5));
  EXPECT_THAT(value.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(value.status().message()),
              HasSubstr("coordinator unreachable"));
  EXPECT_EQ(client.gets_, 1);
  EXPECT_THAT(store.Set("k", "v"), StatusIs(absl::StatusCode::kUnavailable));
}

// A coordinator that stays unreachable is reported once the grace has
// passed, well before the wait's own timeout, naming the key.
TEST(CoordinationStoreTest,
     Get_UnavailableLongerThanGrace_ReturnsUnavailableAfterGrace) {
  UnreachableClient client;
  CoordinationStoreOptions options = ShortOptions();
  options.unavailable_grace = absl::Milliseconds(300);
  CoordinationStore store(&client, options);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> value = store.Get("k", absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  EXPECT_THAT(value.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(value.status().message()), HasSubstr("'k'"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_GT(client.gets_, 1);
}

// A coordinator unavailable for the whole of a wait shorter than the
// grace is reported as Unavailable, not as a key that was never set.
TEST(CoordinationStoreTest, Get_UnavailableUntilDeadline_ReturnsUnavailable) {
  UnreachableClient client;
  CoordinationStore store(&client, ShortOptions());  // grace 5 s
  absl::StatusOr<std::string> value = store.Get("k", absl::Milliseconds(300));
  EXPECT_THAT(value.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(value.status().message()),
              HasSubstr("coordinator unreachable"));
}

// A client that answers Unavailable to its first `failures` calls of each
// kind (a coordinator still starting, or briefly overloaded), then works.
class FlakyClient : public InMemoryStoreClient {
 public:
  explicit FlakyClient(int failures)
      : set_failures_(failures), get_failures_(failures) {}
  absl::Status KeySet(const std::string& key,
                      const std::string& value) override {
    if (set_failures_ > 0) {
      --set_failures_;
      return absl::UnavailableError("connection refused");
    }
    return InMemoryStoreClient::KeySet(key, value);
  }
  absl::StatusOr<std::string> KeyGet(const std::string& key,
                                     absl::Duration timeout) override {
    if (get_failures_ > 0) {
      --get_failures_;
      return absl::UnavailableError("connection refused");
    }
    return InMemoryStoreClient::KeyGet(key, timeout);
  }

 private:
  int set_failures_;
  int get_failures_;
};

// Transient Unavailable answers inside the grace are ridden out: the set
// lands and the get returns the value.
TEST(CoordinationStoreTest, SetAndGet_BriefUnavailable_RetriedAndSucceed) {
  FlakyClient client(3);
  CoordinationStore store(&client, ShortOptions());
  ASSERT_TRUE(store.Set("k", "v").ok());
  absl::StatusOr<std::string> value = store.Get("k", absl::Seconds(10));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

}  // namespace
}  // namespace muon
