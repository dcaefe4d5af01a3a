#include "control/host_agent.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "coordination/credentials.h"
#include "grpcpp/grpcpp.h"
#include "muon/v1/coordinator.grpc.pb.h"

namespace muon {
namespace {

constexpr int kMaxHostRanks = 1024;  // HostJoinRequest's limit
constexpr size_t kMaxQueuedReports = 4096;
constexpr int kMaxMessageBytes = 64 << 20;  // as the coordinator's

int JoinRank(const v1::JoinRequest& r) {
  return r.has_manifest() || !r.has_compact() ? r.manifest().rank()
                                              : r.compact().rank();
}

absl::Duration JoinWait(const v1::JoinRequest& r) {
  return r.timeout_ms() > 0 ? absl::Milliseconds(r.timeout_ms())
                            : absl::Seconds(60);
}

// The host's HostHeartbeatStream to the coordinator: one message each way
// per period. Opened on first use, dropped on any error (the next Exchange
// reopens it). Used by one thread at a time (the heartbeat thread); Cancel
// from any thread.
class HeartbeatStream {
 public:
  explicit HeartbeatStream(v1::Coordinator::Stub* stub) : stub_(stub) {}
  ~HeartbeatStream() {
    Drop(/*cancel=*/true, nullptr);
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Sends `request` and waits up to `timeout` for its answer; a stream
  // that was open and broke since (a reset connection, a restarted
  // coordinator) is reopened once. Errors: the status the coordinator
  // ended the stream with (Unimplemented from one without streams;
  // NotFound, Aborted, Unauthenticated, ... as HostHeartbeat's),
  // DeadlineExceeded when no answer came in time, Cancelled after Cancel.
  grpc::Status Exchange(const std::string& authorization,
                        const v1::HostHeartbeatRequest& request,
                        v1::HeartbeatResponse* response,
                        absl::Duration timeout) {
    const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
    grpc::Status status;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool reused = stream_ != nullptr;
      status = TryExchange(authorization, request, response, deadline);
      if (status.ok() || !reused ||
          status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        break;
      }
    }
    return status;
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (live_ != nullptr) live_->TryCancel();
  }

 private:
  using Deadline = std::chrono::system_clock::time_point;

  grpc::Status TryExchange(const std::string& authorization,
                           const v1::HostHeartbeatRequest& request,
                           v1::HeartbeatResponse* response, Deadline deadline) {
    if (stream_ == nullptr) {
      context_ = std::make_unique<grpc::ClientContext>();
      if (!authorization.empty()) {
        context_->AddMetadata(kAuthorizationMetadataKey, authorization);
      }
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) {
          context_.reset();
          return grpc::Status::CANCELLED;
        }
        live_ = context_.get();
      }
      stream_ = stub_->AsyncHostHeartbeatStream(context_.get(), &cq_, this);
      ++pending_;
      if (!Await(deadline, 1)) return Fail(deadline);
    }
    stream_->Write(request, this);
    stream_->Read(response, this);
    pending_ += 2;
    if (!Await(deadline, 2)) return Fail(deadline);
    return grpc::Status::OK;
  }

  // Waits for `n` of the pending operations until `deadline`; false when
  // one failed or the deadline passed (timed_out_).
  bool Await(Deadline deadline, int n) {
    bool all_ok = true;
    for (int i = 0; i < n; ++i) {
      void* tag;
      bool ok;
      if (cq_.AsyncNext(&tag, &ok, deadline) !=
          grpc::CompletionQueue::GOT_EVENT) {
        timed_out_ = true;
        return false;
      }
      --pending_;
      all_ok &= ok;
    }
    return all_ok;
  }

  // Ends the stream after a failed operation and says why: Cancelled
  // after Cancel, DeadlineExceeded after a timeout, else the status the
  // coordinator ended it with (taken before any cancel: cancelling first
  // would replace it with Cancelled).
  grpc::Status Fail(Deadline deadline) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = cancelled_;
    }
    const bool timed_out = timed_out_;
    grpc::Status status(grpc::StatusCode::UNAVAILABLE,
                        "the heartbeat stream broke");
    Drop(cancelled || timed_out, &status,
         std::max(deadline,
                  std::chrono::system_clock::now() + std::chrono::seconds(1)));
    if (cancelled) return grpc::Status::CANCELLED;
    if (timed_out) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "no heartbeat answer in time");
    }
    return status;
  }

  // Drains the pending operations (cancelling first with `cancel`, or
  // once `deadline` passes), finishes the stream, and stores its status
  // in *status unless it is OK or Cancelled.
  void Drop(bool cancel, grpc::Status* status,
            Deadline deadline = Deadline::max()) {
    if (stream_ == nullptr) return;
    if (cancel) context_->TryCancel();
    void* tag;
    bool ok;
    bool cancelled = cancel;
    auto next = [&] {
      if (cq_.AsyncNext(&tag, &ok, deadline) ==
          grpc::CompletionQueue::GOT_EVENT) {
        return;
      }
      if (!cancelled) context_->TryCancel();  // the rest completes at once
      cancelled = true;
      cq_.Next(&tag, &ok);
    };
    for (; pending_ > 0; --pending_) next();
    grpc::Status finished;
    stream_->Finish(&finished, this);
    next();
    if (status != nullptr && !finished.ok() &&
        finished.error_code() != grpc::StatusCode::CANCELLED) {
      *status = finished;
    }
    {
      absl::MutexLock lock(&mu_);
      live_ = nullptr;
    }
    stream_.reset();
    context_.reset();
    timed_out_ = false;
  }

  v1::Coordinator::Stub* const stub_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::HostHeartbeatRequest,
                                                v1::HeartbeatResponse>>
      stream_;
  int pending_ = 0;
  bool timed_out_ = false;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* live_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace

class HostAgent::Impl final : public v1::Coordinator::Service {
 public:
  Impl(Options options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        stub_(v1::Coordinator::NewStub(std::move(channel))),
        stream_(stub_.get()) {
    for (int r : options_.ranks) locals_[r] = LocalRank();
  }
  ~Impl() override { Shutdown(); }

  absl::Status Listen() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(),
                             &port);
    builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
    builder.SetMaxSendMessageSize(kMaxMessageBytes);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr ||
        (options_.listen.rfind("unix:", 0) != 0 && port == 0)) {
      return absl::UnavailableError(
          absl::StrCat("host agent of ", options_.host, ": cannot listen on \"",
                       options_.listen, "\""));
    }
    address_ = options_.listen;
    if (options_.listen.rfind("unix:", 0) != 0) {
      address_ = absl::StrCat(
          options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
    }
    thread_ = std::thread([this] { HeartbeatLoop(); });
    return absl::OkStatus();
  }

  const std::string& address() const { return address_; }

  void Shutdown() {
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return;
      shutdown_ = true;
      // The agent's own calls in flight (a HostJoin may wait a minute);
      // forwarded calls are cancelled with the server's calls below.
      for (grpc::ClientContext* call : own_calls_) call->TryCancel();
    }
    stream_.Cancel();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    }
    if (thread_.joinable()) thread_.join();
  }

  void RankExited(int rank, int64_t pid, bool failed, const std::string& how);

  int64_t heartbeats_sent() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_sent_;
  }
  absl::Duration settle_time() const {
    absl::MutexLock lock(&mu_);
    return 3 * interval_;
  }
  int64_t reports_sent() const {
    absl::MutexLock lock(&mu_);
    return reports_sent_;
  }
  int64_t heartbeats_streamed() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_streamed_;
  }
  int64_t reports_dropped() const {
    absl::MutexLock lock(&mu_);
    return reports_dropped_;
  }

  // The calls the agent batches.
  grpc::Status Join(grpc::ServerContext* context,
                    const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext* context,
                          const v1::StepReport* request,
                          v1::ReportStepResponse* response) override;

  // Every other call, forwarded as is.
#define MUON_HOST_AGENT_FORWARD(Method, Request, Response)                \
  grpc::Status Method(grpc::ServerContext* context,                       \
                      const v1::Request* request, v1::Response* response) \
      override {                                                          \
    return Forward(context, &v1::Coordinator::Stub::Method, *request,     \
                   response);                                             \
  }
  MUON_HOST_AGENT_FORWARD(HostJoin, HostJoinRequest, JoinResponse)
  MUON_HOST_AGENT_FORWARD(HostHeartbeat, HostHeartbeatRequest,
                          HeartbeatResponse)
  MUON_HOST_AGENT_FORWARD(ReportSteps, StepReports, ReportStepResponse)
  MUON_HOST_AGENT_FORWARD(GetJob, GetJobRequest, JobInfo)
  MUON_HOST_AGENT_FORWARD(GetPlan, GetPlanRequest, Plan)
  MUON_HOST_AGENT_FORWARD(GetJobSpec, GetJobSpecRequest, JobSpec)
  MUON_HOST_AGENT_FORWARD(GetAssignments, GetAssignmentsRequest,
                          GetAssignmentsResponse)
  MUON_HOST_AGENT_FORWARD(ListRanks, ListRanksRequest, ListRanksResponse)
  MUON_HOST_AGENT_FORWARD(GetReports, GetReportsRequest, GetReportsResponse)
  MUON_HOST_AGENT_FORWARD(KeySet, KeySetRequest, KeySetResponse)
  MUON_HOST_AGENT_FORWARD(KeyGet, KeyGetRequest, KeyGetResponse)
  MUON_HOST_AGENT_FORWARD(Replan, ReplanRequest, ReplanResponse)
#undef MUON_HOST_AGENT_FORWARD

 private:
  struct LocalRank {
    uint64_t incarnation = 0;  // the one the coordinator accepted
    bool joined = false;
    bool left = false;    // sent a leave (cleared by a new join)
    bool exited = false;  // its process ended (RankExited)
    absl::Time last_seen;
  };
  // A call of the agent's own: the deadline `timeout` from now and the
  // ranks' authorization; Shutdown cancels it while it runs.
  class OwnCall {
   public:
    OwnCall(Impl* impl, absl::Duration timeout) : impl_(impl) {
      context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      absl::MutexLock lock(&impl_->mu_);
      if (!impl_->authorization_.empty()) {
        context_.AddMetadata(kAuthorizationMetadataKey, impl_->authorization_);
      }
      if (impl_->shutdown_) context_.TryCancel();
      impl_->own_calls_.insert(&context_);
    }
    ~OwnCall() {
      absl::MutexLock lock(&impl_->mu_);
      impl_->own_calls_.erase(&context_);
    }
    grpc::ClientContext* context() { return &context_; }

   private:
    Impl* const impl_;
    grpc::ClientContext context_;
  };
  // One HostJoin: the local ranks' Joins gathered until all are in.
  struct JoinRound {
    std::vector<v1::JoinRequest> entries;
    absl::Duration wait;  // the longest entry's
    bool sent = false;
    bool done = false;
    grpc::Status status;
    v1::JoinResponse response;
  };

  template <typename Request, typename Response>
  grpc::Status Forward(grpc::ServerContext* in,
                       grpc::Status (v1::Coordinator::Stub::*method)(
                           grpc::ClientContext*, const Request&, Response*),
                       const Request& request, Response* response) {
    // The caller's deadline and cancellation (a rank that dies, the
    // server's shutdown) carry over.
    std::unique_ptr<grpc::ClientContext> out =
        grpc::ClientContext::FromServerContext(*in);
    const std::string auth = NoteAuthorization(*in);
    if (!auth.empty()) out->AddMetadata(kAuthorizationMetadataKey, auth);
    return ((*stub_).*method)(out.get(), request, response);
  }

  // The caller's authorization value ("" when none), kept for the agent's
  // own calls.
  std::string NoteAuthorization(const grpc::ServerContext& in) {
    const auto& md = in.client_metadata();
    auto it = md.find(kAuthorizationMetadataKey);
    if (it == md.end()) return "";
    std::string value(it->second.data(), it->second.size());
    absl::MutexLock lock(&mu_);
    if (authorization_ != value) authorization_ = value;
    return value;
  }

  // Adds `request` to the open round (opening one); returns the round
  // and whether this call completes it (and so sends it).
  std::shared_ptr<JoinRound> AddToRound(const v1::JoinRequest& request,
                                        bool* leader)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendRound(JoinRound& round);
  std::string MissingRanksLocked(const JoinRound& round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `round` to be answered; the Join's error when it is not.
  grpc::Status AwaitRound(JoinRound& round, int rank, absl::Duration wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One HostHeartbeat with `request`'s entries; keeps its response (or
  // error) for the ranks' heartbeats.
  grpc::Status SendHostHeartbeat(v1::HostHeartbeatRequest request,
                                 v1::HeartbeatResponse* response);
  // The period's heartbeat: on the host's stream (HostHeartbeatStream),
  // or as SendHostHeartbeat where the coordinator has no streams.
  void SendPeriodicHeartbeat(v1::HostHeartbeatRequest request);
  // Keeps a host heartbeat's answer for the ranks; the errors it carried
  // are delivered when it succeeded.
  void TakeHostHeartbeat(const v1::HostHeartbeatRequest& request,
                         const grpc::Status& status,
                         const v1::HeartbeatResponse& response);
  void HeartbeatLoop();
  // The next host heartbeat: the pending errors of joined ranks, and the
  // ranks heard from within 1.5 intervals.
  v1::HostHeartbeatRequest NextHeartbeatLocked(absl::Duration interval)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the queued step reports, each batch within `deadline`; after a
  // failed batch the rest are dropped (counted).
  void FlushReports(absl::Duration deadline);

  const Options options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  HeartbeatStream stream_;  // the heartbeat thread's
  bool use_stream_ = true;  // the heartbeat thread's: false after Unimplemented
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // send a heartbeat now
  std::set<grpc::ClientContext*> own_calls_ ABSL_GUARDED_BY(mu_);
  // Errors of ranks whose process ended, until a host heartbeat carries
  // them (the rank's join first, when it is still in flight).
  std::map<int, std::string> pending_errors_ ABSL_GUARDED_BY(mu_);
  std::string authorization_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, LocalRank> locals_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<JoinRound> round_ ABSL_GUARDED_BY(mu_);
  // Zero until the host's first join round succeeds (its response gives
  // the heartbeat timeout): nonzero means the host has joined.
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool have_response_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status last_status_ ABSL_GUARDED_BY(mu_);
  v1::HeartbeatResponse last_response_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepReport> reports_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_streamed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reports_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reports_dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<HostAgent::Impl::JoinRound> HostAgent::Impl::AddToRound(
    const v1::JoinRequest& request, bool* leader) {
  if (round_ == nullptr || round_->sent) round_ = std::make_shared<JoinRound>();
  std::shared_ptr<JoinRound> round = round_;
  const int rank = JoinRank(request);
  auto same = std::find_if(
      round->entries.begin(), round->entries.end(),
      [rank](const v1::JoinRequest& e) { return JoinRank(e) == rank; });
  if (same != round->entries.end()) {
    *same = request;  // a retry replaces the rank's earlier entry
  } else {
    round->entries.push_back(request);
  }
  round->wait = std::max(round->wait, JoinWait(request));
  *leader = round->entries.size() == locals_.size();
  if (*leader) round->sent = true;
  return round;
}

void HostAgent::Impl::SendRound(JoinRound& round) {
  v1::HostJoinRequest host_join;
  host_join.set_host(options_.host);
  for (v1::JoinRequest& e : round.entries) *host_join.add_ranks() = e;
  OwnCall call(this, round.wait + options_.rpc_timeout);
  call.context()->set_wait_for_ready(true);  // the coordinator may start later
  v1::JoinResponse response;
  const grpc::Status status =
      stub_->HostJoin(call.context(), host_join, &response);
  absl::MutexLock lock(&mu_);
  round.status = status;
  round.response = std::move(response);
  round.done = true;
  if (!status.ok() || round.response.send_full_manifest()) return;
  const absl::Time now = absl::Now();
  for (const v1::JoinRequest& e : round.entries) {
    LocalRank& l = locals_[JoinRank(e)];
    l.joined = true;
    l.left = false;  // a new optimizer of a rank that left
    l.incarnation = e.incarnation();
    l.last_seen = now;
  }
  const absl::Duration timeout =
      round.response.heartbeat_timeout_ms() > 0
          ? absl::Milliseconds(round.response.heartbeat_timeout_ms())
          : absl::Seconds(30);
  interval_ = options_.heartbeat_interval > absl::ZeroDuration()
                  ? options_.heartbeat_interval
                  : std::min(absl::Seconds(1), timeout / 5);
  if (!pending_errors_.empty()) wake_ = true;  // a rank died meanwhile
}

std::string HostAgent::Impl::MissingRanksLocked(const JoinRound& round) const {
  std::vector<int> missing;
  for (int r : options_.ranks) {
    if (std::none_of(
            round.entries.begin(), round.entries.end(),
            [r](const v1::JoinRequest& e) { return JoinRank(e) == r; })) {
      missing.push_back(r);
    }
  }
  std::sort(missing.begin(), missing.end());
  return absl::StrJoin(missing, ", ");
}

grpc::Status HostAgent::Impl::AwaitRound(JoinRound& round, int rank,
                                         absl::Duration wait) {
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round.done || shutdown_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), wait) && round.sent) {
    // Sent: the coordinator answers within the HostJoin's own deadline.
    mu_.AwaitWithTimeout(absl::Condition(&done),
                         round.wait + options_.rpc_timeout);
  }
  if (round.done) return grpc::Status::OK;
  if (shutdown_) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("host agent of ", options_.host, ": shutting down"));
  }
  return grpc::Status(
      grpc::StatusCode::DEADLINE_EXCEEDED,
      absl::StrCat("host agent of ", options_.host, ": rank ", rank, " waited ",
                   absl::FormatDuration(wait), " for this host's ranks ",
                   MissingRanksLocked(round),
                   " to join (their processes have not called Join)"));
}

grpc::Status HostAgent::Impl::Join(grpc::ServerContext* context,
                                   const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  NoteAuthorization(*context);
  const int rank = JoinRank(*request);
  std::shared_ptr<JoinRound> round;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = locals_.find(rank);
    if (it == locals_.end()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("host agent of ", options_.host, ": rank ", rank,
                       " joined, but this host runs ranks ",
                       absl::StrJoin(options_.ranks, ", ")));
    }
    if (interval_ > absl::ZeroDuration() && it->second.joined) {
      // After the host's ranks joined: a retry, or a new optimizer of the
      // rank; the coordinator answers it alone.
      round = std::make_shared<JoinRound>();
      round->entries.push_back(*request);
      round->wait = JoinWait(*request);
      round->sent = leader = true;
    } else {
      round = AddToRound(*request, &leader);
    }
  }
  if (leader) SendRound(*round);
  absl::MutexLock lock(&mu_);
  const grpc::Status waited = AwaitRound(*round, rank, JoinWait(*request));
  if (!waited.ok()) return waited;
  *response = round->response;
  return round->status;
}

grpc::Status HostAgent::Impl::SendHostHeartbeat(
    v1::HostHeartbeatRequest request, v1::HeartbeatResponse* response) {
  request.set_host(options_.host);
  OwnCall call(this, options_.rpc_timeout);
  v1::HeartbeatResponse got;
  const grpc::Status status =
      stub_->HostHeartbeat(call.context(), request, &got);
  TakeHostHeartbeat(request, status, got);
  if (response != nullptr) *response = std::move(got);
  return status;
}

void HostAgent::Impl::TakeHostHeartbeat(const v1::HostHeartbeatRequest& request,
                                        const grpc::Status& status,
                                        const v1::HeartbeatResponse& response) {
  absl::MutexLock lock(&mu_);
  ++heartbeats_sent_;
  have_response_ = true;
  last_status_ = status;
  if (!status.ok()) return;
  last_response_ = response;
  for (const v1::HeartbeatRequest& beat : request.ranks()) {
    if (!beat.error().empty()) pending_errors_.erase(beat.rank());
  }
}

void HostAgent::Impl::SendPeriodicHeartbeat(v1::HostHeartbeatRequest request) {
  if (!use_stream_) {
    SendHostHeartbeat(std::move(request), nullptr);
    return;
  }
  request.set_host(options_.host);
  std::string authorization;
  {
    absl::MutexLock lock(&mu_);
    authorization = authorization_;
  }
  v1::HeartbeatResponse got;
  const grpc::Status status =
      stream_.Exchange(authorization, request, &got, options_.rpc_timeout);
  if (status.error_code() == grpc::StatusCode::CANCELLED) return;  // Shutdown
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    use_stream_ = false;  // an older coordinator: one call per period
    SendHostHeartbeat(std::move(request), nullptr);
    return;
  }
  TakeHostHeartbeat(request, status, got);
  absl::MutexLock lock(&mu_);
  ++heartbeats_streamed_;
}

grpc::Status HostAgent::Impl::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  NoteAuthorization(*context);
  bool cached = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = locals_.find(request->rank());
    if (it == locals_.end()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("host agent of ", options_.host, ": rank ",
                       request->rank(), " does not run on this host"));
    }
    it->second.last_seen = absl::Now();
    if (request->leaving()) it->second.left = true;
    cached = have_response_ && request->error().empty() && !request->leaving();
    if (cached) {
      if (!last_status_.ok()) return last_status_;
      *response = last_response_;
    }
  }
  if (cached) return grpc::Status::OK;
  // An error or a leave goes out at once, as does the first heartbeat.
  v1::HostHeartbeatRequest host;
  *host.add_ranks() = *request;
  return SendHostHeartbeat(std::move(host), response);
}

grpc::Status HostAgent::Impl::ReportStep(grpc::ServerContext* context,
                                         const v1::StepReport* request,
                                         v1::ReportStepResponse*) {
  NoteAuthorization(*context);
  absl::MutexLock lock(&mu_);
  if (reports_.size() >= kMaxQueuedReports) {
    ++reports_dropped_;
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("host agent of ", options_.host, ": ", kMaxQueuedReports,
                     " step reports queued already"));
  }
  reports_.push_back(*request);
  return grpc::Status::OK;
}

void HostAgent::Impl::RankExited(int rank, int64_t pid, bool failed,
                                 const std::string& how) {
  absl::MutexLock lock(&mu_);
  auto it = locals_.find(rank);
  if (it == locals_.end() || it->second.exited) return;
  it->second.exited = true;
  if (!failed) return;
  const std::string error = absl::StrCat("its process (pid ", pid, ") on ",
                                         options_.host, " ended: ", how);
  if (round_ != nullptr && !round_->sent) {
    // Before this host's ranks joined: the round can no longer fill, so
    // the waiting Joins fail at once, naming the rank.
    round_->sent = round_->done = true;
    round_->status = grpc::Status(
        grpc::StatusCode::ABORTED,
        absl::StrCat("host agent of ", options_.host, ": rank ", rank,
                     " failed before this host's ranks joined: ", error));
    round_ = nullptr;
    return;
  }
  // The heartbeat thread sends it at once (once the rank's join is
  // answered), and again until the coordinator has it.
  pending_errors_[rank] = error;
  wake_ = true;
}

void HostAgent::Impl::FlushReports(absl::Duration deadline) {
  std::deque<v1::StepReport> queued;
  {
    absl::MutexLock lock(&mu_);
    queued.swap(reports_);
  }
  while (!queued.empty()) {
    v1::StepReports batch;
    const size_t n = std::min<size_t>(queued.size(), kMaxHostRanks);
    for (size_t i = 0; i < n; ++i) {
      *batch.add_reports() = std::move(queued.front());
      queued.pop_front();
    }
    OwnCall call(this, deadline);
    v1::ReportStepResponse response;
    const grpc::Status status =
        stub_->ReportSteps(call.context(), batch, &response);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      reports_sent_ += static_cast<int64_t>(n);
      continue;
    }
    // The coordinator is slow or gone: the heartbeat must not wait on it.
    reports_dropped_ += static_cast<int64_t>(n + queued.size());
    return;
  }
}

v1::HostHeartbeatRequest HostAgent::Impl::NextHeartbeatLocked(
    absl::Duration interval) {
  v1::HostHeartbeatRequest request;
  const absl::Time now = absl::Now();
  for (int r : options_.ranks) {
    const LocalRank& l = locals_[r];
    if (!l.joined) continue;
    auto error = pending_errors_.find(r);
    if (error != pending_errors_.end()) {
      v1::HeartbeatRequest* beat = request.add_ranks();
      beat->set_rank(r);
      beat->set_incarnation(l.incarnation);
      beat->set_error(error->second);
      continue;
    }
    // A rank silent for 1.5 intervals is left out (a late beat skips one
    // host beat, harmless): the coordinator names it lost once it has been
    // left out for its heartbeat timeout.
    if (l.left || l.exited || now - l.last_seen > interval * 1.5) continue;
    v1::HeartbeatRequest* beat = request.add_ranks();
    beat->set_rank(r);
    beat->set_incarnation(l.incarnation);
  }
  return request;
}

void HostAgent::Impl::HeartbeatLoop() {
  absl::Duration interval;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || interval_ > absl::ZeroDuration();
    };
    mu_.Await(absl::Condition(&ready));
    interval = interval_;
  }
  while (true) {
    v1::HostHeartbeatRequest request;
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) break;
      wake_ = false;
      request = NextHeartbeatLocked(interval);
    }
    if (request.ranks_size() > 0) SendPeriodicHeartbeat(std::move(request));
    FlushReports(std::min(interval, options_.rpc_timeout));
    absl::MutexLock lock(&mu_);
    auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || wake_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&woken), interval);
  }
}

absl::StatusOr<std::unique_ptr<HostAgent>> HostAgent::Start(Options options) {
  if (options.coordinator.empty() || options.listen.empty()) {
    return absl::InvalidArgumentError(
        "host agent: the coordinator and listen addresses must be set");
  }
  if (options.ranks.empty() ||
      static_cast<int>(options.ranks.size()) > kMaxHostRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("host agent of ", options.host, ": ", options.ranks.size(),
                     " ranks; must be in [1, ", kMaxHostRanks, "]"));
  }
  std::vector<int> sorted = options.ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || (i > 0 && sorted[i] == sorted[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("host agent of ", options.host, ": rank ", sorted[i],
                       sorted[i] < 0 ? " is negative" : " is listed twice"));
    }
  }
  MUON_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      MakeCoordinatorChannel(options.coordinator, options.security));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(channel));
  MUON_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<HostAgent>(new HostAgent(std::move(impl)));
}

HostAgent::HostAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HostAgent::~HostAgent() { Shutdown(); }
const std::string& HostAgent::address() const { return impl_->address(); }
void HostAgent::RankExited(int rank, int64_t pid, bool failed,
                           const std::string& how) {
  impl_->RankExited(rank, pid, failed, how);
}
void HostAgent::Shutdown() { impl_->Shutdown(); }
int64_t HostAgent::heartbeats_sent() const { return impl_->heartbeats_sent(); }
int64_t HostAgent::heartbeats_streamed() const {
  return impl_->heartbeats_streamed();
}
absl::Duration HostAgent::settle_time() const { return impl_->settle_time(); }
int64_t HostAgent::reports_sent() const { return impl_->reports_sent(); }
int64_t HostAgent::reports_dropped() const { return impl_->reports_dropped(); }

}  // namespace muon
