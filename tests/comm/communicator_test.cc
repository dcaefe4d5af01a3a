// One set of test bodies run against every Communicator backend (typed
// tests, Ray's StoreClientTestBase style), plus Gloo-only tests for
// Split, timeouts and Abort. Multi-rank groups run as one thread per rank in
// this process, each rank with its own communicator, rendezvousing through
// an in-memory fake of the coordinator's key-value store; traffic stays on
// 127.0.0.1. Every collective is bounded by the options' timeout, so every
// join below is bounded too.
#include "comm/communicator.h"

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/gloo_communicator.h"
#include "comm/local_communicator.h"
#include "device/host_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/fake_cuda_stream.h"
#include "tests/comm/in_memory_store_client.h"

namespace muon {
namespace {

using ::muon::testing::InMemoryStoreClient;
using ::testing::HasSubstr;

MATCHER_P(StatusIs, code, "") { return arg.code() == code; }

using Group = std::vector<std::unique_ptr<Communicator>>;

// Runs fn(rank) for every rank on its own thread and waits for all.
void RunRanks(int world_size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

// Timeout of every collective in the shared tests: generous for a loaded
// 2-core machine; the collectives themselves take milliseconds.
constexpr absl::Duration kTimeout = absl::Seconds(10);

struct LocalBackend {
  static constexpr int kMaxWorldSize = 1;
  static constexpr const char* kName = "local";

  absl::StatusOr<Group> MakeGroup(int world_size) {
    if (world_size != 1) return absl::InvalidArgumentError("local: world 1");
    Group group;
    group.push_back(LocalCommunicator::Create());
    return group;
  }
};

struct GlooBackend {
  static constexpr int kMaxWorldSize = 4;
  static constexpr const char* kName = "gloo";

  absl::StatusOr<Group> MakeGroup(int world_size) {
    GlooOptions options;
    options.timeout = kTimeout;
    options.prefix = absl::StrCat("test/group", groups_made++);
    // Default-constructed: Unknown until the rank's thread fills it in.
    std::vector<absl::StatusOr<std::unique_ptr<GlooCommunicator>>> made(
        world_size);
    RunRanks(world_size, [&](int rank) {
      made[rank] = GlooCommunicator::Create(rank, world_size, &client, options);
    });
    Group group;
    for (auto& comm : made) {
      if (!comm.ok()) return comm.status();
      group.push_back(std::move(*comm));
    }
    return group;
  }

  InMemoryStoreClient client;  // Outlives the communicators (declared first).
  int groups_made = 0;
};

template <typename Backend>
class CommunicatorTest : public ::testing::Test {
 protected:
  Group MakeGroup(int world_size) {
    absl::StatusOr<Group> group = backend_.MakeGroup(world_size);
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? std::move(*group) : Group();
  }

  // World sizes this backend is tested with.
  static std::vector<int> WorldSizes() {
    std::vector<int> sizes;
    for (int n = 1; n <= Backend::kMaxWorldSize; ++n) sizes.push_back(n);
    return sizes;
  }

  Backend backend_;
};

struct BackendNames {
  template <typename Backend>
  static std::string GetName(int) {
    return Backend::kName;
  }
};

using Backends = ::testing::Types<LocalBackend, GlooBackend>;
TYPED_TEST_SUITE(CommunicatorTest, Backends, BackendNames);

TYPED_TEST(CommunicatorTest, Accessors_ReportRankWorldSizeAndBackend) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(group[rank]->rank(), rank);
      EXPECT_EQ(group[rank]->world_size(), n);
      EXPECT_EQ(group[rank]->backend(), TypeParam::kName);
    }
  }
}

// Elements rank p sends to rank q: uneven, zero for some pairs (including
// some self shares, e.g. p = q = 1).
int64_t Count(int p, int q) { return (p + q + 1) % 3; }
float Value(int p, int q, int i) { return 1000.0f * p + 100.0f * q + i; }

// Rank `rank`'s all-to-all(v) in a world of `n` with the counts above: what
// it sends (packed in peer order), the counts, and what it must receive.
struct PackedAllToAll {
  std::vector<float> send;
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> want;  // expected received data, packed in peer order
  int64_t recv_total() const { return static_cast<int64_t>(want.size()); }
};

PackedAllToAll MakePackedAllToAll(int rank, int n) {
  PackedAllToAll a;
  a.send_counts.resize(n);
  a.recv_counts.resize(n);
  for (int q = 0; q < n; ++q) {
    a.send_counts[q] = Count(rank, q);
    a.recv_counts[q] = Count(q, rank);
    for (int i = 0; i < a.send_counts[q]; ++i) {
      a.send.push_back(Value(rank, q, i));
    }
    for (int i = 0; i < a.recv_counts[q]; ++i)
      a.want.push_back(Value(q, rank, i));
  }
  return a;
}

TYPED_TEST(CommunicatorTest, AllToAllV_UnevenAndZeroCounts_DeliversPackedData) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<absl::Status> status(n);
    std::vector<std::vector<float>> received(n);
    RunRanks(n, [&](int rank) {
      const PackedAllToAll a = MakePackedAllToAll(rank, n);
      received[rank].assign(a.recv_total(), -1.0f);
      status[rank] = group[rank]->AllToAllV(
          a.send.data(), a.send_counts, received[rank].data(), a.recv_counts);
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_EQ(received[rank], MakePackedAllToAll(rank, n).want)
          << "rank " << rank;
    }
  }
}

// The collective on a host stream: the caller's thread only enqueues; a
// second stream that waits for the Work's event reads the received data
// (plain memory: only the event orders the write and the read, which
// ThreadSanitizer checks under --config=tsan); Work::Wait returns OK.
TYPED_TEST(CommunicatorTest,
           EnqueueAllToAllV_OnHostStream_EventOrdersConsumerStream) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<absl::Status> status(n);
    std::vector<std::vector<float>> copied(n);
    RunRanks(n, [&](int rank) {
      const PackedAllToAll a = MakePackedAllToAll(rank, n);
      std::vector<float> received(a.recv_total(), -1.0f);
      device::HostStream comm_stream("comm");
      device::HostStream consumer("consumer");
      absl::StatusOr<std::unique_ptr<Work>> work =
          group[rank]->EnqueueAllToAllV(&comm_stream, a.send.data(),
                                        a.send_counts, received.data(),
                                        a.recv_counts);
      if (!work.ok()) {
        status[rank] = work.status();
        return;
      }
      status[rank] = consumer.WaitFor((*work)->event());
      if (!status[rank].ok()) return;
      status[rank] = consumer.Launch([&] {
        copied[rank] = received;
        return absl::OkStatus();
      });
      if (!status[rank].ok()) return;
      status[rank] = (*work)->Wait(absl::Seconds(20));
      if (!status[rank].ok()) return;
      status[rank] = consumer.Synchronize(absl::Seconds(20));
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_EQ(copied[rank], MakePackedAllToAll(rank, n).want)
          << "rank " << rank;
    }
  }
}

// A stream of another device is refused naming it, before anything runs.
TYPED_TEST(CommunicatorTest, AllToAllVOnStream_CudaStream_InvalidArgument) {
  Group group = this->MakeGroup(1);
  ASSERT_EQ(group.size(), 1);
  testing::FakeCudaStream stream("fake-cuda");
  const std::vector<int64_t> zeros(1, 0);
  const absl::Status s =
      group[0]->AllToAllVOnStream(&stream, nullptr, zeros, nullptr, zeros);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()),
              ::testing::AllOf(HasSubstr("fake-cuda"), HasSubstr("cuda:0")));
}

TYPED_TEST(CommunicatorTest, AllToAllV_AllZeroCountsNullBuffers_ReturnsOk) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<absl::Status> status(n);
    RunRanks(n, [&](int rank) {
      const std::vector<int64_t> zeros(n, 0);
      status[rank] = group[rank]->AllToAllV(nullptr, zeros, nullptr, zeros);
    });
    for (int rank = 0; rank < n; ++rank)
      EXPECT_TRUE(status[rank].ok()) << status[rank];
  }
}

// Elements rank p contributes to the all-gather (rank 1 contributes none).
int64_t GatherCount(int p) { return p == 1 ? 0 : p + 1; }

TYPED_TEST(CommunicatorTest, AllGatherV_UnevenCounts_GathersInRankOrder) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<int64_t> counts(n);
    std::vector<float> want;
    for (int p = 0; p < n; ++p) {
      counts[p] = GatherCount(p);
      for (int i = 0; i < counts[p]; ++i) want.push_back(100.0f * p + i);
    }
    std::vector<absl::Status> status(n);
    std::vector<std::vector<float>> received(n);
    RunRanks(n, [&](int rank) {
      std::vector<float> send;
      for (int i = 0; i < counts[rank]; ++i) send.push_back(100.0f * rank + i);
      received[rank].assign(want.size(), -1.0f);
      status[rank] =
          group[rank]->AllGatherV(send.empty() ? nullptr : send.data(),
                                  counts[rank], received[rank].data(), counts);
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_EQ(received[rank], want) << "rank " << rank;
    }
  }
}

TYPED_TEST(CommunicatorTest, AllGatherV_AllEmptyNullBuffers_ReturnsOk) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<absl::Status> status(n);
    RunRanks(n, [&](int rank) {
      status[rank] = group[rank]->AllGatherV(nullptr, 0, nullptr,
                                             std::vector<int64_t>(n, 0));
    });
    for (int rank = 0; rank < n; ++rank)
      EXPECT_TRUE(status[rank].ok()) << status[rank];
  }
}

TYPED_TEST(CommunicatorTest, Broadcast_FromLastRank_CopiesToEveryRank) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    const int root = n - 1;
    const std::vector<float> want = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f};
    std::vector<absl::Status> status(n), empty_status(n);
    std::vector<std::vector<float>> data(n);
    RunRanks(n, [&](int rank) {
      data[rank] = rank == root ? want : std::vector<float>(want.size(), -1);
      status[rank] =
          group[rank]->Broadcast(data[rank].data(), want.size(), root);
      empty_status[rank] = group[rank]->Broadcast(nullptr, 0, root);
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_TRUE(empty_status[rank].ok()) << empty_status[rank];
      EXPECT_EQ(data[rank], want) << "rank " << rank;
    }
  }
}

TYPED_TEST(CommunicatorTest, Barrier_RepeatedRounds_NoRankLeavesEarly) {
  constexpr int kRounds = 3;
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::atomic<int> arrived[kRounds] = {};
    std::vector<std::vector<int>> seen(n, std::vector<int>(kRounds, -1));
    std::vector<absl::Status> status(n);
    RunRanks(n, [&](int rank) {
      for (int round = 0; round < kRounds && status[rank].ok(); ++round) {
        // Stagger arrivals so a barrier that does not wait would show.
        absl::SleepFor(absl::Milliseconds(5 * rank));
        arrived[round].fetch_add(1);
        status[rank] = group[rank]->Barrier();
        seen[rank][round] = arrived[round].load();
      }
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_EQ(seen[rank], std::vector<int>(kRounds, n)) << "rank " << rank;
    }
  }
}

TYPED_TEST(CommunicatorTest,
           Collectives_WrongArguments_ReturnInvalidArgumentAndStayUsable) {
  using absl::StatusCode;
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    Communicator& comm = *group[0];
    float buffer[8] = {};
    const std::vector<int64_t> ones(n, 1);
    const std::vector<int64_t> too_long(n + 1, 1);
    // Checked locally before any communication, so one rank suffices.
    absl::Status status = comm.AllToAllV(buffer, too_long, buffer, ones);
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(status.message()), HasSubstr("send_counts"));
    EXPECT_THAT(comm.AllToAllV(buffer, ones, buffer, too_long),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.AllToAllV(buffer, {}, buffer, {}),
                StatusIs(StatusCode::kInvalidArgument));
    std::vector<int64_t> negative = ones;
    negative[0] = -1;
    EXPECT_THAT(comm.AllToAllV(buffer, negative, buffer, negative),
                StatusIs(StatusCode::kInvalidArgument));
    std::vector<int64_t> self_mismatch = ones;
    self_mismatch[0] = 2;
    EXPECT_THAT(comm.AllToAllV(buffer, ones, buffer, self_mismatch),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.AllToAllV(nullptr, ones, buffer, ones),
                StatusIs(StatusCode::kInvalidArgument));
    // Counts whose bytes overflow int64 (their sum, or one alone).
    const std::vector<int64_t> huge(n, std::numeric_limits<int64_t>::max());
    status = comm.AllToAllV(buffer, huge, buffer, huge);
    EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(status.message()), HasSubstr("int64 bytes"));
    EXPECT_THAT(comm.AllGatherV(buffer, 1, buffer, too_long),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.AllGatherV(buffer, 2, buffer, ones),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Broadcast(buffer, 1, n),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Broadcast(buffer, 1, -1),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Broadcast(buffer, -1, 0),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Broadcast(nullptr, 1, 0),
                StatusIs(StatusCode::kInvalidArgument));

    // Rejected calls did not disturb the group.
    std::vector<absl::Status> barrier(n);
    RunRanks(n, [&](int rank) { barrier[rank] = group[rank]->Barrier(); });
    for (int rank = 0; rank < n; ++rank)
      EXPECT_TRUE(barrier[rank].ok()) << barrier[rank];
  }
}

TYPED_TEST(CommunicatorTest, Split_OwnRankOnly_ReturnsWorldOfOne) {
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    std::vector<absl::Status> status(n);
    std::vector<float> received(n, -1);
    RunRanks(n, [&](int rank) {
      absl::StatusOr<std::unique_ptr<Communicator>> solo =
          group[rank]->Split({rank});
      status[rank] = solo.status();
      if (!solo.ok()) return;
      EXPECT_EQ((*solo)->rank(), 0);
      EXPECT_EQ((*solo)->world_size(), 1);
      EXPECT_EQ((*solo)->backend(), TypeParam::kName);
      const float value = rank + 0.25f;
      status[rank] = (*solo)->AllToAllV(&value, {1}, &received[rank], {1});
    });
    for (int rank = 0; rank < n; ++rank) {
      ASSERT_TRUE(status[rank].ok()) << status[rank];
      EXPECT_EQ(received[rank], rank + 0.25f);
    }
  }
}

TYPED_TEST(CommunicatorTest, Split_BadRankLists_ReturnInvalidArgument) {
  using absl::StatusCode;
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    Communicator& comm = *group[n - 1];
    EXPECT_THAT(comm.Split({}).status(),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Split({n}).status(),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(comm.Split({n - 1, n - 1}).status(),
                StatusIs(StatusCode::kInvalidArgument));
    if (n > 1) {
      EXPECT_THAT(comm.Split({0}).status(),  // Lacks this rank.
                  StatusIs(StatusCode::kInvalidArgument));
      EXPECT_THAT(comm.Split({n - 1, 0}).status(),  // Not ascending.
                  StatusIs(StatusCode::kInvalidArgument));
    }
  }
}

TYPED_TEST(CommunicatorTest, Abort_ThenCalls_ReturnAborted) {
  using absl::StatusCode;
  for (int n : this->WorldSizes()) {
    SCOPED_TRACE(absl::StrCat("world_size ", n));
    Group group = this->MakeGroup(n);
    ASSERT_EQ(group.size(), n);
    for (auto& comm : group) comm->Abort();
    for (auto& comm : group) {
      float x = 1;
      const std::vector<int64_t> ones(n, 1);
      std::vector<float> out(n);
      EXPECT_THAT(comm->AllToAllV(out.data(), ones, out.data(), ones),
                  StatusIs(StatusCode::kAborted));
      EXPECT_THAT(comm->AllGatherV(&x, 1, out.data(), ones),
                  StatusIs(StatusCode::kAborted));
      EXPECT_THAT(comm->Broadcast(&x, 1, 0), StatusIs(StatusCode::kAborted));
      EXPECT_THAT(comm->Barrier(), StatusIs(StatusCode::kAborted));
      EXPECT_THAT(comm->Split({comm->rank()}).status(),
                  StatusIs(StatusCode::kAborted));
      comm->Abort();  // Idempotent.
    }
  }
}

// Gloo only: Split into real sub-groups, failures and Abort across ranks.
class GlooCommunicatorTest : public ::testing::Test {
 protected:
  std::vector<std::unique_ptr<GlooCommunicator>> MakeGroup(
      int world_size, absl::Duration timeout) {
    GlooOptions options;
    options.timeout = timeout;
    options.prefix = absl::StrCat("gloo_test/group", groups_made_++);
    // Default-constructed: Unknown until the rank's thread fills it in.
    std::vector<absl::StatusOr<std::unique_ptr<GlooCommunicator>>> made(
        world_size);
    RunRanks(world_size, [&](int rank) {
      made[rank] =
          GlooCommunicator::Create(rank, world_size, &client_, options);
    });
    std::vector<std::unique_ptr<GlooCommunicator>> group;
    for (auto& comm : made) {
      EXPECT_TRUE(comm.ok()) << comm.status();
      if (!comm.ok()) return {};
      group.push_back(std::move(*comm));
    }
    return group;
  }

  InMemoryStoreClient client_;  // Outlives the communicators.
  int groups_made_ = 0;
};

TEST_F(GlooCommunicatorTest, Split_TwoInterleavedSubGroups_EachDoesAllToAllV) {
  constexpr int kWorld = 4;
  auto group = MakeGroup(kWorld, kTimeout);
  ASSERT_EQ(group.size(), kWorld);
  // {0, 2} and {1, 3}; done twice to check that repeated splits with the same
  // lists rendezvous under fresh keys.
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<float>> received(kWorld);
  std::vector<std::string> prefixes(kWorld);
  RunRanks(kWorld, [&](int rank) {
    const std::vector<int> ranks = {rank % 2, rank % 2 + 2};
    for (int round = 0; round < 2 && status[rank].ok(); ++round) {
      absl::StatusOr<std::unique_ptr<Communicator>> sub =
          group[rank]->Split(ranks);
      status[rank] = sub.status();
      if (!sub.ok()) return;
      Communicator& comm = **sub;
      EXPECT_EQ(comm.world_size(), 2);
      EXPECT_EQ(comm.rank(), rank / 2);
      prefixes[rank] = static_cast<GlooCommunicator&>(comm).prefix();
      // Sub-rank r sends r + 1 elements to each peer: values 10 * rank + q.
      const int r = comm.rank();
      const std::vector<int64_t> send_counts = {r + 1, r + 1};
      const std::vector<int64_t> recv_counts = {1, 2};
      std::vector<float> send;
      for (int q = 0; q < 2; ++q) {
        for (int i = 0; i <= r; ++i) send.push_back(10.0f * rank + q);
      }
      received[rank].assign(3, -1);
      status[rank] = comm.AllToAllV(send.data(), send_counts,
                                    received[rank].data(), recv_counts);
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(status[rank].ok()) << status[rank];
    const int low = rank % 2;       // Global rank of sub-rank 0.
    const int high = rank % 2 + 2;  // Global rank of sub-rank 1.
    const int me = rank / 2;
    EXPECT_EQ(received[rank],
              (std::vector<float>{10.0f * low + me, 10.0f * high + me,
                                  10.0f * high + me}))
        << "rank " << rank;
    EXPECT_EQ(prefixes[rank],
              absl::StrCat(group[rank]->prefix(), "/split1/", low, "_", high));
  }
  // The parent group is still usable.
  RunRanks(kWorld, [&](int rank) { status[rank] = group[rank]->Barrier(); });
  for (int rank = 0; rank < kWorld; ++rank)
    EXPECT_TRUE(status[rank].ok()) << status[rank];
}

TEST_F(GlooCommunicatorTest, Create_BadArguments_ReturnInvalidArgument) {
  using absl::StatusCode;
  GlooOptions options;
  EXPECT_THAT(GlooCommunicator::Create(0, 0, &client_, options).status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GlooCommunicator::Create(2, 2, &client_, options).status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GlooCommunicator::Create(0, 2, nullptr, options).status(),
              StatusIs(StatusCode::kInvalidArgument));
  options.timeout = absl::ZeroDuration();
  EXPECT_THAT(GlooCommunicator::Create(0, 2, &client_, options).status(),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(GlooCommunicatorTest, Create_PeerNeverJoins_ReturnsDeadlineExceeded) {
  GlooOptions options;
  options.timeout = absl::Milliseconds(500);
  options.prefix = "gloo_test/lonely";
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
      GlooCommunicator::Create(0, 2, &client_, options);
  EXPECT_THAT(comm.status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("gloo Create on rank 0: rendezvous"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Two of four ranks join; each one's timeout names the two that did not
// (ranks 1 and 3), so a failed start-up says whom to look at.
TEST_F(GlooCommunicatorTest, Create_TwoRanksMissing_ErrorNamesThem) {
  GlooOptions options;
  options.timeout = absl::Seconds(1);
  options.prefix = "gloo_test/half";
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      statuses[i] =
          GlooCommunicator::Create(2 * i, 4, &client_, options).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : statuses) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("ranks 1, 3 of 4 have not joined the rendezvous"));
  }
}

TEST_F(GlooCommunicatorTest,
       AllToAllV_PeerNeverCalls_ReturnsDeadlineExceededWithinTimeout) {
  auto group = MakeGroup(2, absl::Seconds(1));
  ASSERT_EQ(group.size(), 2);
  float send[2] = {1, 2};
  float recv[2] = {};
  const absl::Time start = absl::Now();
  const int gets_before = client_.key_gets();
  // Rank 1 never calls.
  absl::Status status = group[0]->AllToAllV(send, {1, 1}, recv, {1, 1});
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Gloo's timeout names no peer address: no peer's addresses are looked
  // up for it (a call to the coordinator per peer on every rank).
  EXPECT_EQ(client_.key_gets(), gets_before);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Names the operation and rank and keeps Gloo's own message.
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("gloo AllToAllV on rank 0"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("Timed out"));
  // The group is broken for good: later calls fail fast, naming the cause.
  absl::Status later = group[0]->Barrier();
  EXPECT_THAT(later, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(later.message()), HasSubstr("AllToAllV"));
}

// Rank 0 blocks in `op` (rank 1 has not called it yet) and is aborted from
// another thread: it returns Aborted at once. Rank 1's call then fails too,
// never hangs: usually at once with Unavailable naming rank 0 (its
// connection was reset), but when Gloo's transport has already accepted
// rank 1's payload before the reset reaches it, only at its timeout
// (DeadlineExceeded) — both within the group's timeout.
constexpr absl::Duration kAbortTestTimeout = absl::Seconds(3);

void AbortDuringCollective(
    std::vector<std::unique_ptr<GlooCommunicator>>& group,
    const std::function<absl::Status(Communicator&)>& op) {
  ASSERT_EQ(group.size(), 2);
  absl::Status blocked_status;
  absl::Duration blocked_for;
  std::thread blocked([&] {
    const absl::Time start = absl::Now();
    blocked_status = op(*group[0]);
    blocked_for = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time abort_start = absl::Now();
  group[0]->Abort();
  EXPECT_LT(absl::Now() - abort_start, absl::Seconds(5));
  blocked.join();
  EXPECT_THAT(blocked_status, StatusIs(absl::StatusCode::kAborted));
  EXPECT_LT(blocked_for, absl::Seconds(2));  // well before the timeout

  const absl::Time start = absl::Now();
  absl::Status peer_status = op(*group[1]);
  EXPECT_LT(absl::Now() - start, kAbortTestTimeout + absl::Seconds(2));
  EXPECT_THAT(std::string(peer_status.message()), HasSubstr("on rank 1"));
  if (peer_status.code() == absl::StatusCode::kUnavailable) {
    EXPECT_THAT(std::string(peer_status.message()), HasSubstr("(peer rank 0)"));
  } else {
    EXPECT_THAT(peer_status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  }
}

TEST_F(GlooCommunicatorTest,
       Abort_DuringAllToAllV_UnblocksCallerAndPeerFailsFast) {
  auto group = MakeGroup(2, kAbortTestTimeout);
  AbortDuringCollective(group, [](Communicator& comm) {
    float send[2] = {1, 2};
    float recv[2] = {};
    return comm.AllToAllV(send, {1, 1}, recv, {1, 1});
  });
}

TEST_F(GlooCommunicatorTest,
       Abort_DuringBarrier_UnblocksCallerAndPeerFailsFast) {
  auto group = MakeGroup(2, kAbortTestTimeout);
  AbortDuringCollective(group,
                        [](Communicator& comm) { return comm.Barrier(); });
}

// A Split whose peer never comes times out and breaks the group: a retry
// would number its rendezvous apart from the late peer's first attempt.
TEST_F(GlooCommunicatorTest, Split_PeerNeverCalls_TimesOutAndBreaksTheGroup) {
  auto group = MakeGroup(2, absl::Seconds(1));
  ASSERT_EQ(group.size(), 2);
  const absl::Time start = absl::Now();
  const absl::Status split = group[0]->Split({0, 1}).status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(split, StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Status later = group[0]->Barrier();
  EXPECT_THAT(later, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(std::string(later.message()), HasSubstr("Split"));
}

TEST_F(GlooCommunicatorTest, Abort_DuringSplit_ReturnsAborted) {
  auto group = MakeGroup(2, kAbortTestTimeout);
  ASSERT_EQ(group.size(), 2);
  absl::Status status;
  absl::Duration took;
  std::thread splitter([&] {
    const absl::Time start = absl::Now();
    status = group[0]->Split({0, 1}).status();  // Rank 1 never joins.
    took = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));
  group[0]->Abort();
  splitter.join();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kAborted));
  EXPECT_LT(took, absl::Seconds(5));
}

// A world of one whose collectives succeed but which reports an
// asynchronous error once aborted, as an NCCL communicator does after
// ncclCommAbort ended its kernels (they then complete with no CUDA error).
class AbortedAfterCollective final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "aborted-after"; }
  absl::Status AllToAllV(const float*, const std::vector<int64_t>&, float*,
                         const std::vector<int64_t>&) override {
    Abort();  // the abort lands while the collective's kernels drain
    return absl::OkStatus();
  }
  absl::Status AsyncError() override {
    return aborted_ ? absl::AbortedError("aborted-after: communicator aborted")
                    : absl::OkStatus();
  }
  absl::Status AllGatherV(const float*, int64_t, float*,
                          const std::vector<int64_t>&) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(float*, int64_t, int) override {
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(
      const std::vector<int>&) override {
    return absl::UnimplementedError("Split");
  }
  void Abort() override { aborted_ = true; }

 private:
  std::atomic<bool> aborted_{false};
};

// A Work whose event completed after the communicator was aborted reports
// the abort, not OK: its receive buffer may be half written.
TEST(CommunicatorWorkTest, Wait_EventCompletedAfterAbort_ReturnsAsyncError) {
  AbortedAfterCollective comm;
  device::HostStream stream("comm");
  const std::vector<int64_t> zeros(1, 0);
  absl::StatusOr<std::unique_ptr<Work>> work =
      comm.EnqueueAllToAllV(&stream, nullptr, zeros, nullptr, zeros);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE(stream.Synchronize(absl::Seconds(20)).ok());
  ASSERT_TRUE((*work)->IsCompleted());
  const absl::Status waited = (*work)->Wait(absl::Seconds(20));
  EXPECT_THAT(waited, StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(std::string(waited.message()), HasSubstr("communicator aborted"));
}

}  // namespace
}  // namespace muon
