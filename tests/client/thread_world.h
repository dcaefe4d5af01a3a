// A world of ranks as threads of one test process: one in-process
// CoordinatorService, a LocalCoordinationClient and a GlooCommunicator (over
// loopback) per rank. Bounded: every blocking call has a short timeout.
#ifndef MUON_TESTS_CLIENT_THREAD_WORLD_H_
#define MUON_TESTS_CLIENT_THREAD_WORLD_H_

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/gloo_communicator.h"
#include "coordination/coordination_client.h"
#include "gtest/gtest.h"
#include "server/coordinator_service.h"
#include "server/local_coordination_client.h"
#include "tests/client/rank_threads.h"

namespace muon {
namespace testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int world_size)
      : world_size_(world_size), service_(Options(world_size)) {
    for (int r = 0; r < world_size; ++r) {
      clients_.push_back(std::make_unique<LocalCoordinationClient>(&service_));
    }
    comms_.resize(world_size);
  }
  ~ThreadWorld() {
    comms_.clear();
    service_.Shutdown();
  }

  int size() const { return world_size_; }
  CoordinatorService& service() { return service_; }
  CoordinationClient* client(int rank) { return clients_[rank].get(); }
  Communicator* comm(int rank) { return comms_[rank].get(); }

  // Connects every rank's Gloo world; false (with failures recorded) if a
  // rank failed.
  bool Connect() {
    GlooOptions options;
    options.timeout = kGlooTimeout;
    options.prefix = "gloo/test";
    std::vector<absl::Status> statuses =
        RunOnRanks(world_size_, [&](int rank) -> absl::Status {
          absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
              GlooCommunicator::Create(rank, world_size_, client(rank),
                                       options);
          if (!comm.ok()) return comm.status();
          comms_[rank] = *std::move(comm);
          return absl::OkStatus();
        });
    bool ok = true;
    for (int r = 0; r < world_size_; ++r) {
      EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
      ok = ok && statuses[r].ok();
    }
    return ok;
  }

 private:
  static CoordinatorService::Options Options(int world_size) {
    CoordinatorService::Options o;
    o.job_id = "test";
    o.world_size = world_size;
    o.default_join_timeout = absl::Milliseconds(kJoinTimeoutMs);
    return o;
  }

  const int world_size_;
  CoordinatorService service_;
  std::vector<std::unique_ptr<LocalCoordinationClient>> clients_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace testing
}  // namespace muon

#endif  // MUON_TESTS_CLIENT_THREAD_WORLD_H_
