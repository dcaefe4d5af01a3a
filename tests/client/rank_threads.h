// Helpers for multi-rank tests that run every rank as a thread of one test
// process (each with its own communicator and coordinator client): bounded
// thread fan-out, deterministic data and bitwise comparison.
#ifndef MUON_TESTS_CLIENT_RANK_THREADS_H_
#define MUON_TESTS_CLIENT_RANK_THREADS_H_

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace muon {
namespace testing {

// Bounds of the blocking calls: generous for a loaded 2-core machine (the
// rendezvous and collectives take milliseconds), short enough that a broken
// rank fails the test in seconds.
constexpr absl::Duration kGlooTimeout = absl::Seconds(5);
constexpr int64_t kJoinTimeoutMs = 5000;
// A rank thread that has not returned by then is stuck despite the bounds
// above: abort rather than hang the test.
constexpr absl::Duration kRankDeadline = absl::Seconds(60);

// Runs fn(rank) on `world_size` threads and returns each rank's Status.
// std::mutex, not absl::Mutex: ThreadSanitizer sees it (--config=tsan).
inline std::vector<absl::Status> RunOnRanks(
    int world_size, const std::function<absl::Status(int)>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<absl::Status> statuses(world_size,
                                     absl::UnknownError("rank did not finish"));
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::Status s = fn(rank);
      std::lock_guard<std::mutex> lock(mu);
      statuses[rank] = std::move(s);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, absl::ToChronoNanoseconds(kRankDeadline),
                     [&] { return done == world_size; })) {
      std::fprintf(stderr,
                   "RunOnRanks: only %d of %d ranks finished within %s; "
                   "aborting instead of hanging\n",
                   done, world_size,
                   absl::FormatDuration(kRankDeadline).c_str());
      std::abort();
    }
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// Deterministic values in [-1, 1), a function of the seed only.
inline std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen() >> 8) * 0x1p-23f - 1.0f;
  return v;
}

// Bit-for-bit equality of two float vectors, naming the first difference.
inline ::testing::AssertionResult BitwiseEqual(
    const std::vector<float>& actual, const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << std::hexfloat << actual[i]
             << " vs expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_RANK_THREADS_H_
