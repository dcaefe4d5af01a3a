#include "control/host_agent.h"

#include <algorithm>
#include <chrono>
#include <deque>
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

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

absl::Duration JoinWait(const v1::JoinRequest& r) {
  return r.timeout_ms() > 0 ? absl::Milliseconds(r.timeout_ms())
                            : absl::Seconds(60);
}

}  // namespace

class HostAgent::Impl final : public v1::Coordinator::Service {
 public:
  Impl(Options options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        stub_(v1::Coordinator::NewStub(std::move(channel))) {
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
    }
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
    uint64_t incarnation = 0;
    bool joined = false;
    bool gone = false;  // left, or its process ended
    absl::Time last_seen;
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
    grpc::ClientContext out;
    out.set_deadline(in->deadline());
    const std::string auth = NoteAuthorization(*in);
    if (!auth.empty()) out.AddMetadata(kAuthorizationMetadataKey, auth);
    return ((*stub_).*method)(&out, request, response);
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

  // A context for the agent's own call, with `timeout` and the ranks'
  // authorization.
  std::unique_ptr<grpc::ClientContext> OwnContext(absl::Duration timeout) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    absl::MutexLock lock(&mu_);
    if (!authorization_.empty()) {
      context->AddMetadata(kAuthorizationMetadataKey, authorization_);
    }
    return context;
  }

  // Adds `request` to the open round (opening one); returns the round
  // and whether this call completes it (and so sends it).
  std::shared_ptr<JoinRound> AddToRound(const v1::JoinRequest& request,
                                        bool* leader)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendRound(JoinRound& round);
  std::string MissingRanksLocked(const JoinRound& round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One HostHeartbeat with `request`'s entries; keeps its response (or
  // error) for the ranks' heartbeats.
  grpc::Status SendHostHeartbeat(v1::HostHeartbeatRequest request,
                                 v1::HeartbeatResponse* response);
  void HeartbeatLoop();
  void FlushReports();

  const Options options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::string authorization_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, LocalRank> locals_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<JoinRound> round_ ABSL_GUARDED_BY(mu_);
  // Zero until the first Join response gives the heartbeat timeout.
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool have_response_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status last_status_ ABSL_GUARDED_BY(mu_);
  v1::HeartbeatResponse last_response_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StepReport> reports_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;
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
  locals_[rank].incarnation = request.incarnation();
  *leader = round->entries.size() == locals_.size();
  if (*leader) round->sent = true;
  return round;
}

void HostAgent::Impl::SendRound(JoinRound& round) {
  v1::HostJoinRequest host_join;
  host_join.set_host(options_.host);
  for (v1::JoinRequest& e : round.entries) *host_join.add_ranks() = e;
  std::unique_ptr<grpc::ClientContext> context =
      OwnContext(round.wait + options_.rpc_timeout);
  context->set_wait_for_ready(true);  // the coordinator may start later
  v1::JoinResponse response;
  const grpc::Status status =
      stub_->HostJoin(context.get(), host_join, &response);
  absl::MutexLock lock(&mu_);
  round.status = status;
  round.response = std::move(response);
  round.done = true;
  if (status.ok() && !round.response.send_full_manifest()) {
    const absl::Time now = absl::Now();
    for (const v1::JoinRequest& e : round.entries) {
      LocalRank& l = locals_[JoinRank(e)];
      l.joined = true;
      l.last_seen = now;
    }
    const absl::Duration timeout =
        round.response.heartbeat_timeout_ms() > 0
            ? absl::Milliseconds(round.response.heartbeat_timeout_ms())
            : absl::Seconds(30);
    interval_ = options_.heartbeat_interval > absl::ZeroDuration()
                    ? options_.heartbeat_interval
                    : std::min(absl::Seconds(1), timeout / 5);
  }
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

grpc::Status HostAgent::Impl::Join(grpc::ServerContext* context,
                                   const v1::JoinRequest* request,
                                   v1::JoinResponse* response) {
  NoteAuthorization(*context);
  const int rank = JoinRank(*request);
  std::shared_ptr<JoinRound> round;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    if (!locals_.contains(rank)) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("host agent of ", options_.host, ": rank ", rank,
                       " joined, but this host runs ranks ",
                       absl::StrJoin(options_.ranks, ", ")));
    }
    round = AddToRound(*request, &leader);
  }
  if (leader) SendRound(*round);
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round->done || shutdown_;
  };
  const absl::Duration wait = JoinWait(*request);
  if (!mu_.AwaitWithTimeout(absl::Condition(&done), wait) || !round->done) {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("host agent of ", options_.host, ": rank ", rank,
                     " waited ", absl::FormatDuration(wait),
                     " for this host's ranks ", MissingRanksLocked(*round),
                     " to join (their processes have not called Join)"));
  }
  *response = round->response;
  return round->status;
}

grpc::Status HostAgent::Impl::SendHostHeartbeat(
    v1::HostHeartbeatRequest request, v1::HeartbeatResponse* response) {
  request.set_host(options_.host);
  std::unique_ptr<grpc::ClientContext> context =
      OwnContext(options_.rpc_timeout);
  v1::HeartbeatResponse got;
  const grpc::Status status =
      stub_->HostHeartbeat(context.get(), request, &got);
  absl::MutexLock lock(&mu_);
  ++heartbeats_sent_;
  have_response_ = true;
  last_status_ = status;
  if (status.ok()) last_response_ = got;
  if (response != nullptr) *response = std::move(got);
  return status;
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
    it->second.incarnation = request->incarnation();
    if (request->leaving()) it->second.gone = true;
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
  v1::HostHeartbeatRequest host;
  {
    absl::MutexLock lock(&mu_);
    auto it = locals_.find(rank);
    if (it == locals_.end() || it->second.gone) return;
    it->second.gone = true;
    if (!failed || !it->second.joined) return;
    v1::HeartbeatRequest* beat = host.add_ranks();
    beat->set_rank(rank);
    beat->set_incarnation(it->second.incarnation);
    beat->set_error(absl::StrCat("its process (pid ", pid, ") on ",
                                 options_.host, " ended: ", how));
  }
  SendHostHeartbeat(std::move(host), nullptr);
}

void HostAgent::Impl::FlushReports() {
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
    std::unique_ptr<grpc::ClientContext> context =
        OwnContext(options_.rpc_timeout);
    v1::ReportStepResponse response;
    const grpc::Status status =
        stub_->ReportSteps(context.get(), batch, &response);
    absl::MutexLock lock(&mu_);
    (status.ok() ? reports_sent_ : reports_dropped_) += static_cast<int64_t>(n);
  }
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
      const absl::Time now = absl::Now();
      for (int r : options_.ranks) {
        const LocalRank& l = locals_[r];
        // A rank silent for 1.5 intervals is left out (a late beat skips
        // one host beat, harmless): the coordinator names it lost once it
        // has been left out for its heartbeat timeout.
        if (!l.joined || l.gone || now - l.last_seen > interval * 1.5) continue;
        v1::HeartbeatRequest* beat = request.add_ranks();
        beat->set_rank(r);
        beat->set_incarnation(l.incarnation);
      }
    }
    if (request.ranks_size() > 0)
      SendHostHeartbeat(std::move(request), nullptr);
    FlushReports();
    absl::MutexLock lock(&mu_);
    auto stop = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), interval);
  }
  FlushReports();
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
absl::Duration HostAgent::settle_time() const { return impl_->settle_time(); }
int64_t HostAgent::reports_sent() const { return impl_->reports_sent(); }
int64_t HostAgent::reports_dropped() const { return impl_->reports_dropped(); }

}  // namespace muon
