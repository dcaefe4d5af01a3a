// StagingCommunicator over Gloo groups of 3 ranks (one thread each, traffic
// on 127.0.0.1), with a runtime that claims cuda:0 but keeps its "device
// memory" in host memory: every staging copy is a counted memcpy, so the
// staging's counts, offsets and ordering are checked without a GPU
// (tests/control/staged_ranks_test runs the staging over CUDA memory on a
// GPU).
#include "comm/staging_communicator.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/gloo_communicator.h"
#include "device/host_stream.h"
#include "device/memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/comm/fake_cuda_stream.h"
#include "tests/comm/in_memory_store_client.h"

namespace muon {
namespace {

using ::muon::testing::FakeCudaStream;
using ::muon::testing::InMemoryStoreClient;
using ::testing::HasSubstr;

// cuda:0 in name, host memory in fact; copies are counted.
class FakeDeviceRuntime final : public device::Runtime {
 public:
  device::Device device() const override { return device::Device::Cuda(0); }
  absl::StatusOr<std::unique_ptr<device::Stream>> CreateStream(
      const std::string&) override {
    return absl::UnimplementedError("fake runtime");
  }
  absl::StatusOr<std::unique_ptr<device::Event>> CreateEvent(
      const std::string&) override {
    return absl::UnimplementedError("fake runtime");
  }
  absl::StatusOr<std::unique_ptr<device::Event>> CreateTimingEvent(
      const std::string&) override {
    return absl::UnimplementedError("fake runtime");
  }
  device::Allocator* allocator() override { return device::HostAllocator(); }
  device::Allocator* pinned_host_allocator() override { return &pinned; }
  absl::StatusOr<std::unique_ptr<device::Stream>> WrapStream(
      void*, const std::string&) override {
    return absl::UnimplementedError("fake runtime");
  }
  absl::Status CopyToHost(void* host_dst, const void* src,
                          int64_t bytes) override {
    ++to_host;
    if (fail_copies) return absl::InternalError("fake copy to host failed");
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(void* dst, const void* host_src,
                            int64_t bytes) override {
    ++from_host;
    if (bytes > 0) std::memcpy(dst, host_src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHostOnStream(device::Stream*, void*, const void*,
                                  int64_t) override {
    return absl::UnimplementedError("fake runtime");
  }
  absl::Status CopyFromHostOnStream(device::Stream*, void*, const void*,
                                    int64_t) override {
    return absl::UnimplementedError("fake runtime");
  }
  absl::Status Zero(void* dst, int64_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  std::atomic<bool> fail_copies{false};  // CopyToHost fails
  std::atomic<int> to_host{0};
  std::atomic<int> from_host{0};
  // What the staging takes as "pinned" memory, counted.
  device::CountingAllocator pinned{device::HostAllocator()};
};

void RunRanks(int world_size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

constexpr int kWorld = 3;

// kWorld Gloo communicators, each staged through its own fake runtime.
class StagingCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GlooOptions options;
    options.timeout = absl::Seconds(10);
    options.prefix = "staging/test";
    std::vector<absl::StatusOr<std::unique_ptr<GlooCommunicator>>> made(kWorld);
    RunRanks(kWorld, [&](int rank) {
      made[rank] = GlooCommunicator::Create(rank, kWorld, &client_, options);
    });
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(made[r].ok()) << made[r].status();
      host_.push_back(std::move(*made[r]));
      runtime_.push_back(std::make_unique<FakeDeviceRuntime>());
      absl::StatusOr<std::unique_ptr<StagingCommunicator>> staged =
          StagingCommunicator::Create(host_[r].get(), runtime_[r].get());
      ASSERT_TRUE(staged.ok()) << staged.status();
      staged_.push_back(std::move(*staged));
    }
  }

  InMemoryStoreClient client_;  // outlives the communicators
  std::vector<std::unique_ptr<GlooCommunicator>> host_;
  std::vector<std::unique_ptr<FakeDeviceRuntime>> runtime_;
  std::vector<std::unique_ptr<StagingCommunicator>> staged_;
};

// Rank r sends (r + 1) * (p + 1) - 1 values to peer p (peer 0 gets none
// from rank 0), value 1000 r + 100 p + i: uneven and empty counts.
int64_t Count(int from, int to) { return (from + 1) * (to + 1) - 1; }
float Value(int from, int to, int64_t i) {
  return static_cast<float>(1000 * from + 100 * to + i);
}

TEST_F(StagingCommunicatorTest,
       AllToAllVUnevenAndEmpty_DeliversThroughHostStagingOnEveryRank) {
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<float>> got(kWorld);
  RunRanks(kWorld, [&](int r) {
    std::vector<int64_t> sc(kWorld), rc(kWorld);
    std::vector<float> send;
    for (int p = 0; p < kWorld; ++p) {
      sc[p] = Count(r, p);
      rc[p] = Count(p, r);
      for (int64_t i = 0; i < sc[p]; ++i) send.push_back(Value(r, p, i));
    }
    int64_t total = 0;
    for (int64_t c : rc) total += c;
    got[r].assign(total, -1.0f);
    status[r] = staged_[r]->AllToAllV(send.data(), sc, got[r].data(), rc);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    std::vector<float> want;
    for (int p = 0; p < kWorld; ++p) {
      for (int64_t i = 0; i < Count(p, r); ++i) want.push_back(Value(p, r, i));
    }
    EXPECT_EQ(got[r], want) << "rank " << r;
    EXPECT_EQ(runtime_[r]->to_host, 1);
    EXPECT_EQ(runtime_[r]->from_host, 1);
  }
}

TEST_F(StagingCommunicatorTest,
       AllGatherVAndBroadcast_SameValuesAsTheHostCollectives) {
  std::vector<absl::Status> gathered(kWorld), broadcast(kWorld);
  std::vector<std::vector<float>> all(kWorld), data(kWorld);
  RunRanks(kWorld, [&](int r) {
    const std::vector<int64_t> rc = {1, 2, 3};
    std::vector<float> mine(rc[r], static_cast<float>(r + 1));
    all[r].assign(6, 0.0f);
    gathered[r] = staged_[r]->AllGatherV(mine.data(), rc[r], all[r].data(), rc);
    data[r].assign(4, static_cast<float>(10 * r));
    broadcast[r] = staged_[r]->Broadcast(data[r].data(), 4, /*root=*/1);
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(gathered[r].ok()) << gathered[r];
    ASSERT_TRUE(broadcast[r].ok()) << broadcast[r];
    EXPECT_EQ(all[r], (std::vector<float>{1, 2, 2, 3, 3, 3}));
    EXPECT_EQ(data[r], std::vector<float>(4, 10.0f));
  }
}

TEST_F(StagingCommunicatorTest,
       AllToAllVOnStream_DeviceStreamRunsItHostStreamRefusedByName) {
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<float>> got(kWorld);
  RunRanks(kWorld, [&](int r) {
    FakeCudaStream stream(absl::StrCat("rank ", r, " comm"));
    const std::vector<int64_t> counts(kWorld, 1);
    std::vector<float> send(kWorld);
    for (int p = 0; p < kWorld; ++p) send[p] = Value(r, p, 0);
    got[r].assign(kWorld, -1.0f);
    status[r] = stream.Launch([&] {
      return staged_[r]->AllToAllVOnStream(&stream, send.data(), counts,
                                           got[r].data(), counts);
    });
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    for (int p = 0; p < kWorld; ++p) EXPECT_EQ(got[r][p], Value(p, r, 0));
  }
  device::HostStream host("a host stream");
  float x = 0.0f;
  const std::vector<int64_t> one = {1, 0, 0};
  const absl::Status refused =
      staged_[0]->AllToAllVOnStream(&host, &x, one, &x, one);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("\"a host stream\" is on cpu; this communicator's "
                        "buffers are on cuda:0"));
}

TEST_F(StagingCommunicatorTest,
       Staging_InRuntimesPinnedMemory_GrownToLargestCollectiveAndReused) {
  constexpr int64_t kFloat = sizeof(float);
  std::vector<absl::Status> status(kWorld);
  // Per rank: the pinned bytes held after each all-to-all.
  std::vector<std::vector<int64_t>> in_use(kWorld);
  RunRanks(kWorld, [&](int r) {
    const auto all_to_all = [&](int64_t each) {
      const std::vector<int64_t> counts(kWorld, each);
      std::vector<float> send(kWorld * each, 1.0f), recv(kWorld * each);
      return staged_[r]->AllToAllV(send.data(), counts, recv.data(), counts);
    };
    for (int64_t each : {int64_t{100}, int64_t{10}, int64_t{300}}) {
      if (status[r] = all_to_all(each); !status[r].ok()) return;
      in_use[r].push_back(runtime_[r]->pinned.bytes_in_use());
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    // Send and receive staging of 300 floats, then no more for 30, then
    // both grown (the smaller ones freed first) to 900.
    EXPECT_EQ(in_use[r],
              (std::vector<int64_t>{2 * 300 * kFloat, 2 * 300 * kFloat,
                                    2 * 900 * kFloat}))
        << "rank " << r;
    // Each smaller buffer freed before its larger one is taken: never
    // more than the two of 900 at once (2100 floats had both been kept).
    EXPECT_EQ(runtime_[r]->pinned.peak_bytes(), 2 * 900 * kFloat)
        << "rank " << r;
  }
}

// Rank 1's copy to host fails before the exchange: it aborts its host
// communicator, so the other ranks fail at once (their connections to it
// are reset) instead of waiting out the 10 s timeout.
TEST_F(StagingCommunicatorTest, CopyFailsOnOneRank_PeersFailBeforeTimeout) {
  runtime_[1]->fail_copies = true;
  std::vector<absl::Status> status(kWorld);
  const absl::Time start = absl::Now();
  RunRanks(kWorld, [&](int r) {
    const std::vector<int64_t> counts(kWorld, 2);
    std::vector<float> send(2 * kWorld, 1.0f), recv(2 * kWorld);
    status[r] = staged_[r]->AllToAllV(send.data(), counts, recv.data(), counts);
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(status[1].message()),
              HasSubstr("fake copy to host failed (before the exchange: "
                        "aborted the host communicator"));
  for (int r : {0, 2}) {
    EXPECT_FALSE(status[r].ok()) << "rank " << r;
    EXPECT_NE(status[r].code(), absl::StatusCode::kDeadlineExceeded)
        << status[r];
  }
}

TEST_F(StagingCommunicatorTest, BadCounts_InvalidArgumentBeforeAnyCopy) {
  float x = 0.0f;
  const absl::Status s =
      staged_[1]->AllToAllV(&x, {1, 1}, &x, {1, 1});  // 2 entries, world 3
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("gloo+staged"));
  EXPECT_EQ(runtime_[1]->to_host, 0);
  EXPECT_EQ(runtime_[1]->from_host, 0);
}

TEST_F(StagingCommunicatorTest, Split_SubGroupIsStagedToo) {
  std::vector<absl::Status> status(kWorld);
  std::vector<std::vector<float>> got(kWorld);
  RunRanks(kWorld, [&](int r) {
    if (r == 1) return;  // not in {0, 2}
    absl::StatusOr<std::unique_ptr<Communicator>> sub =
        staged_[r]->Split({0, 2});
    if (!sub.ok()) {
      status[r] = sub.status();
      return;
    }
    EXPECT_EQ((*sub)->backend(), "gloo+staged");
    EXPECT_EQ((*sub)->buffer_device(), device::Device::Cuda(0));
    const std::vector<int64_t> counts = {1, 1};
    std::vector<float> send = {static_cast<float>(r), static_cast<float>(r)};
    got[r].assign(2, -1.0f);
    status[r] = (*sub)->AllToAllV(send.data(), counts, got[r].data(), counts);
  });
  for (int r : {0, 2}) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], (std::vector<float>{0.0f, 2.0f}));
  }
}

TEST_F(StagingCommunicatorTest, Create_NullOrHostRuntime_RefusedByName) {
  FakeDeviceRuntime runtime;
  EXPECT_EQ(StagingCommunicator::Create(nullptr, &runtime).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status host =
      StagingCommunicator::Create(host_[0].get(), device::HostRuntime())
          .status();
  EXPECT_EQ(host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(host.message(), HasSubstr("host buffers need no staging"));
}

}  // namespace
}  // namespace muon
