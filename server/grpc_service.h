// The gRPC face of the coordinator: one handler per RPC of
// muon.v1.Coordinator on gRPC's callback API, each checking the caller's
// credentials, converting nothing but status (the core already speaks the
// proto messages) and delegating to CoordinatorService. Join and KeyGet hold
// no thread while they wait: the core completes them (XLA's "RPC handler"
// layer, without its thread per waiting call).
//
// Authentication (coordination/credentials.h): with a job secret set, every
// RPC must carry `authorization: Bearer <job secret>`; the read-only RPCs
// (GetJob, GetPlan, GetJobSpec, GetAssignments, ListRanks, GetReports) also
// accept the read-only token. Missing or wrong: UNAUTHENTICATED "missing or
// invalid credentials" (nothing about the job); the read-only token on a rank
// RPC: PERMISSION_DENIED.
//
// HostHeartbeatStream alone is on gRPC's async API, served by a
// HeartbeatStreamServer (below) over several completion queues: thousands
// of long-lived streams each keep a read outstanding, and a completion
// queue's cost per event grows with its outstanding operations in
// Debian's libgrpc, built with gRPC's debug checks (NDEBUG unset).
//
// Lifecycle: construct over a service that outlives it, register with a
// grpc::ServerBuilder (with a HeartbeatStreamServer's completion queues),
// destroy after the server has shut down.
// Thread-safety: handlers run concurrently on gRPC's threads; the core is
// thread-safe.
#ifndef MUON_SERVER_GRPC_SERVICE_H_
#define MUON_SERVER_GRPC_SERVICE_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordination/credentials.h"
#include "grpcpp/grpcpp.h"
#include "muon/v1/coordinator.grpc.pb.h"
#include "server/coordinator_service.h"

namespace muon {

// absl::Status -> grpc::Status keeping the canonical code and the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
// grpc::Status -> absl::Status keeping the canonical code and the message.
absl::Status FromGrpcStatus(const grpc::Status& status);

// v1::Coordinator::CallbackService, except HostHeartbeatStream on the async
// API (HeartbeatStreamServer). Every method of muon.v1.Coordinator is listed
// here: one left out would be served synchronously, answering UNIMPLEMENTED.
namespace coordinator_methods {
using C = v1::Coordinator;
using Base = C::WithCallbackMethod_Join<
    C::WithCallbackMethod_HostJoin<C::WithCallbackMethod_Heartbeat<
        C::WithCallbackMethod_ReportStep<C::WithCallbackMethod_HostHeartbeat<
            C::WithCallbackMethod_ReportSteps<C::WithCallbackMethod_GetJob<
                C::WithCallbackMethod_GetPlan<C::WithCallbackMethod_GetJobSpec<
                    C::WithCallbackMethod_GetAssignments<
                        C::WithCallbackMethod_ListRanks<
                            C::WithCallbackMethod_GetReports<
                                C::WithCallbackMethod_KeySet<
                                    C::WithCallbackMethod_KeyGet<
                                        C::WithCallbackMethod_Replan<
                                            C::WithAsyncMethod_HostHeartbeatStream<
                                                C::Service>>>>>>>>>>>>>>>>;
}  // namespace coordinator_methods
using CoordinatorServiceBase = coordinator_methods::Base;

class HeartbeatStreamServer;

class CoordinatorGrpcService final : public CoordinatorServiceBase {
 public:
  CoordinatorGrpcService(CoordinatorService* service, CoordinatorAuth auth)
      : service_(service), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* HostJoin(grpc::CallbackServerContext* context,
                                     const v1::HostJoinRequest* request,
                                     v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportStep(
      grpc::CallbackServerContext* context, const v1::StepReport* request,
      v1::ReportStepResponse* response) override;
  grpc::ServerUnaryReactor* HostHeartbeat(
      grpc::CallbackServerContext* context,
      const v1::HostHeartbeatRequest* request,
      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportSteps(
      grpc::CallbackServerContext* context, const v1::StepReports* request,
      v1::ReportStepResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobInfo* response) override;
  grpc::ServerUnaryReactor* GetPlan(grpc::CallbackServerContext* context,
                                    const v1::GetPlanRequest* request,
                                    v1::Plan* response) override;
  grpc::ServerUnaryReactor* GetJobSpec(grpc::CallbackServerContext* context,
                                       const v1::GetJobSpecRequest* request,
                                       v1::JobSpec* response) override;
  grpc::ServerUnaryReactor* GetAssignments(
      grpc::CallbackServerContext* context,
      const v1::GetAssignmentsRequest* request,
      v1::GetAssignmentsResponse* response) override;
  grpc::ServerUnaryReactor* ListRanks(grpc::CallbackServerContext* context,
                                      const v1::ListRanksRequest* request,
                                      v1::ListRanksResponse* response) override;
  grpc::ServerUnaryReactor* GetReports(
      grpc::CallbackServerContext* context,
      const v1::GetReportsRequest* request,
      v1::GetReportsResponse* response) override;
  grpc::ServerUnaryReactor* Replan(grpc::CallbackServerContext* context,
                                   const v1::ReplanRequest* request,
                                   v1::ReplanResponse* response) override;
  grpc::ServerUnaryReactor* KeySet(grpc::CallbackServerContext* context,
                                   const v1::KeySetRequest* request,
                                   v1::KeySetResponse* response) override;
  grpc::ServerUnaryReactor* KeyGet(grpc::CallbackServerContext* context,
                                   const v1::KeyGetRequest* request,
                                   v1::KeyGetResponse* response) override;

 private:
  friend class HeartbeatStreamServer;
  enum class Access { kRank, kRead };
  // OK when the call's token grants `access` (see the file comment).
  absl::Status Authorize(const grpc::ServerContextBase* context,
                         Access access) const;

  CoordinatorService* const service_;  // Not owned.
  const CoordinatorAuth auth_;
};

// Serves HostHeartbeatStream for a CoordinatorGrpcService: a host's stream
// reads one HostHeartbeatRequest at a time and answers it
// (CoordinatorService::HostHeartbeat) before reading the next; a refused
// credential or a failed heartbeat ends the stream with its status, the
// host closing its side ends it with OK. Streams are spread over the
// completion queues (one thread each) in the order they open.
//
// Lifecycle: AddCompletionQueues before the server is built, Start after,
// Shutdown after the server's Shutdown returned (as gRPC's async API
// requires), then destroy.
class HeartbeatStreamServer {
 public:
  explicit HeartbeatStreamServer(CoordinatorGrpcService* service)
      : service_(service) {}
  HeartbeatStreamServer(const HeartbeatStreamServer&) = delete;
  HeartbeatStreamServer& operator=(const HeartbeatStreamServer&) = delete;
  ~HeartbeatStreamServer() { Shutdown(); }

  // Adds `count` (>= 1) completion queues to `builder`.
  void AddCompletionQueues(grpc::ServerBuilder* builder, int count);
  // Waits for streams on every queue, one thread per queue.
  void Start();
  // Shuts the queues down and joins their threads. Idempotent.
  void Shutdown();

 private:
  class Stream;
  // A completion queue and its thread. Every operation on a queue starts
  // under its mutex and only before `shut_down`: once the server has shut
  // down, a stream's next event ends it instead (gRPC refuses operations
  // on a queue being shut down).
  struct Queue {
    std::unique_ptr<grpc::ServerCompletionQueue> cq;
    absl::Mutex mu;
    bool shut_down ABSL_GUARDED_BY(mu) = false;
    std::thread thread;
  };
  // Waits for the next stream on `queue`.
  void RequestStream(Queue* queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue->mu);
  static void Serve(Queue* queue);

  CoordinatorGrpcService* const service_;  // Not owned.
  std::vector<std::unique_ptr<Queue>> queues_;
};

}  // namespace muon

#endif  // MUON_SERVER_GRPC_SERVICE_H_
