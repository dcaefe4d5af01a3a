#include "comm/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <numeric>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/coordination_store.h"
#include "comm/local_communicator.h"
#include "common/status_macros.h"
#include "gloo/allgatherv.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/context.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "gloo/types.h"

namespace muon {
namespace {

constexpr char kBackend[] = "gloo";

// Gloo adds timeouts to steady_clock::now() (and multiplies the connect
// timeout by 5): keep them far from overflowing.
constexpr absl::Duration kMaxTimeout = absl::Hours(24);

absl::Duration CappedTimeout(absl::Duration timeout) {
  return std::min(timeout, kMaxTimeout);
}

// Gloo reports timeouts as IoException/EnforceNotMet text only ("Timed out
// waiting 1000ms for recv operation to complete", "Connect timeout ...",
// "Wait timeout for key(s)", "Application timeout caused pair closure").
bool IsTimeout(const std::string& what) {
  const std::string lower = absl::AsciiStrToLower(what);
  return absl::StrContains(lower, "timed out") ||
         absl::StrContains(lower, "timeout");
}

// Gloo's TCP transport writes without MSG_NOSIGNAL, so a peer that resets
// its connection (crashed or aborted) would kill this process with SIGPIPE
// instead of failing the call. Ignore SIGPIPE unless the program installed
// its own handler.
void IgnoreSigpipeOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

int64_t Sum(const std::vector<int64_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

}  // namespace

// Registers the buffers of the pending collective so Abort can interrupt
// their waits; unregisters on scope exit. Declare it after the buffers' owner
// (the Gloo options object) so it is destroyed first.
class GlooCommunicator::InflightScope {
 public:
  InflightScope(GlooCommunicator* comm,
                std::initializer_list<gloo::transport::UnboundBuffer*> buffers)
      : comm_(comm) {
    std::lock_guard<std::mutex> lock(comm_->inflight_mu_);
    comm_->inflight_.assign(buffers.begin(), buffers.end());
  }
  ~InflightScope() {
    std::lock_guard<std::mutex> lock(comm_->inflight_mu_);
    comm_->inflight_.clear();
    comm_->inflight_cv_.notify_all();
  }

 private:
  GlooCommunicator* const comm_;  // Not owned.
};

GlooCommunicator::GlooCommunicator(
    int rank, int world_size, CoordinationClient* client,
    const GlooOptions& options, std::vector<int> root_ranks, bool subgroup,
    std::shared_ptr<gloo::transport::Device> device)
    : rank_(rank),
      world_size_(world_size),
      client_(client),
      options_(options),
      timeout_(std::max<int64_t>(
          1, absl::ToInt64Milliseconds(CappedTimeout(options.timeout)))),
      root_ranks_(std::move(root_ranks)),
      subgroup_(subgroup),
      store_(std::make_unique<CoordinationStore>(
          client, CoordinationStoreOptions{CappedTimeout(options.timeout)})),
      device_(std::move(device)),
      peer_addresses_(world_size) {}

GlooCommunicator::~GlooCommunicator() {
  // Pairs (and their sockets) go before the device's event loop.
  context_.reset();
  device_.reset();
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    int rank, int world_size, CoordinationClient* store_client,
    const GlooOptions& options) {
  const std::string where = absl::StrCat("gloo Create on rank ", rank, ": ");
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "world_size is ", world_size, "; want >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "rank is ", rank, "; want 0 <= rank < world_size ", world_size));
  }
  if (store_client == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "store_client is null"));
  }
  if (options.hostname.empty() || options.prefix.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "options.hostname ('", options.hostname,
        "') and options.prefix ('", options.prefix, "') must be non-empty"));
  }
  if (options.timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "options.timeout is ",
                     absl::FormatDuration(options.timeout), "; want >= 1ms"));
  }
  std::vector<int> root_ranks(world_size);
  std::iota(root_ranks.begin(), root_ranks.end(), 0);
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(
      rank, world_size, store_client, options, std::move(root_ranks),
      /*subgroup=*/false, /*device=*/nullptr));
  if (world_size > 1) {
    IgnoreSigpipeOnce();
    absl::Status bound = comm->RunGloo("Create", [&] {
      gloo::transport::tcp::attr attr(options.hostname.c_str());
      comm->device_ = gloo::transport::tcp::CreateDevice(attr);
    });
    if (!bound.ok()) {
      return absl::Status(
          bound.code(),
          absl::StrCat(bound.message(), " (binding options.hostname \"",
                       options.hostname,
                       "\": it must be an address of this host; see "
                       "GLOO_SOCKET_IFNAME)"));
    }
  }
  MUON_RETURN_IF_ERROR(comm->Connect("Create", *comm->store_));
  return comm;
}

absl::Status GlooCommunicator::Connect(absl::string_view op,
                                       CoordinationStore& store) {
  if (world_size_ == 1) return absl::OkStatus();
  absl::Status connected = RunGloo(op, [&] {
    gloo::rendezvous::PrefixStore prefix_store(options_.prefix, store);
    auto context =
        std::make_shared<gloo::rendezvous::Context>(rank_, world_size_);
    context->setTimeout(timeout_);
    context->connectFullMesh(prefix_store, device_);
    context_ = std::move(context);
  });
  if (connected.code() == absl::StatusCode::kDeadlineExceeded) {
    const std::string missing = MissingRanks(store);
    if (!missing.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat(connected.message(), "; ", missing));
    }
  }
  MUON_RETURN_IF_ERROR(connected);
  PublishAddresses(store);
  return absl::OkStatus();
}

std::string GlooCommunicator::MissingRanks(CoordinationStore& store) const {
  // A rank entering Gloo's full-mesh rendezvous first stores its host name
  // under "<prefix>/rank_<rank>", then its addresses under
  // "<prefix>/<rank>" (gloo::rendezvous::Context::connectFullMesh through a
  // PrefixStore; older Gloo versions store only the latter). One or two
  // reads per rank, without waiting: this is the error path. Every rank of
  // a failed start-up runs it at once, so each reads at most kChecked
  // ranks' keys (the first ones: the order in which Gloo waits for them).
  constexpr int kListed = 16;
  constexpr int kChecked = 64;
  std::vector<int> missing;
  const int checked = std::min(world_size_, kChecked + 1);
  for (int r = 0; r < checked; ++r) {
    if (r == rank_) continue;
    bool joined = false;
    for (const std::string& key : {absl::StrCat(options_.prefix, "/rank_", r),
                                   absl::StrCat(options_.prefix, "/", r)}) {
      absl::StatusOr<bool> has = store.Has(key);
      if (!has.ok()) return "";  // The store cannot tell.
      if (*has) {
        joined = true;
        break;
      }
    }
    if (!joined) missing.push_back(root_ranks_[r]);
  }
  if (missing.empty()) return "";
  std::vector<std::string> names;
  for (size_t i = 0; i < missing.size() && i < kListed; ++i) {
    names.push_back(absl::StrCat(missing[i]));
  }
  if (missing.size() > static_cast<size_t>(kListed)) {
    names.push_back(absl::StrCat("and ", missing.size() - kListed, " more"));
  }
  return absl::StrCat(
      missing.size() == 1 ? "rank " : "ranks ", absl::StrJoin(names, ", "),
      " of ", world_size_, missing.size() == 1 ? " has" : " have",
      " not joined the rendezvous (not started, exited, or cannot reach the "
      "coordinator)",
      checked < world_size_
          ? absl::StrCat("; ranks 0-", checked - 1, " checked")
          : "");
}

std::string GlooCommunicator::AddressesKey(int rank) const {
  return absl::StrCat(options_.prefix, "/addresses/", rank);
}

void GlooCommunicator::PublishAddresses(CoordinationStore& store) {
  // Gloo's error messages name a peer by the address of the remote end of
  // the connection as its pair prints it ("[127.0.0.1]:41864"), which is
  // only known once connected. Line p: this rank's pair facing rank p.
  std::vector<std::string> lines(world_size_);
  try {
    for (int peer = 0; peer < world_size_; ++peer) {
      if (peer != rank_) lines[peer] = context_->getPair(peer)->address().str();
    }
  } catch (const std::exception&) {
    return;  // Best effort only.
  }
  store.Set(AddressesKey(rank_), absl::StrJoin(lines, "\n")).IgnoreError();
}

int GlooCommunicator::FindPeer(const std::string& message) {
  // Gloo writes a peer as "[address]:port"; a message with none (a
  // timeout) names no peer, and looking up every peer's addresses for it
  // would cost the coordinator one call per peer on every rank.
  if (world_size_ == 1 || message.find("]:") == std::string::npos) return -1;
  // At most kFindPeerLookups store reads, none started after one second,
  // and none after one that failed other than for a missing key (an
  // unreachable coordinator answers each only at its RPC deadline).
  constexpr int kFindPeerLookups = 64;
  const absl::Time stop_lookups = absl::Now() + absl::Seconds(1);
  int lookups = 0;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    std::string address;
    {
      std::lock_guard<std::mutex> lock(peer_mu_);
      address = peer_addresses_[peer];
    }
    if (address.empty()) {
      // Cached addresses are still matched after the lookups stop.
      if (lookups >= kFindPeerLookups || absl::Now() >= stop_lookups) continue;
      ++lookups;
      // Published by the peer right after it connected: no waiting.
      absl::StatusOr<std::string> lines =
          store_->Get(AddressesKey(peer), absl::ZeroDuration());
      if (!lines.ok()) {
        // A key not set yet is DeadlineExceeded from a zero wait.
        if (!absl::IsNotFound(lines.status()) &&
            !absl::IsDeadlineExceeded(lines.status())) {
          lookups = kFindPeerLookups;
        }
        continue;
      }
      const std::vector<std::string> split = absl::StrSplit(*lines, '\n');
      if (split.size() != static_cast<size_t>(world_size_)) continue;
      address = split[rank_];
      if (address.empty()) continue;
      std::lock_guard<std::mutex> lock(peer_mu_);
      peer_addresses_[peer] = address;
    }
    for (size_t pos = message.find(address); pos != std::string::npos;
         pos = message.find(address, pos + 1)) {
      const size_t end = pos + address.size();
      // "[127.0.0.1]:123" must not match "[127.0.0.1]:1234".
      if (end == message.size() ||
          !std::isdigit(static_cast<unsigned char>(message[end]))) {
        return peer;
      }
    }
  }
  return -1;
}

std::string GlooCommunicator::Where(absl::string_view op, int peer) const {
  std::string where =
      absl::StrCat(kBackend, " ", op, " on rank ", root_ranks_[rank_]);
  if (subgroup_) {
    absl::StrAppend(&where, " (rank ", rank_, " of group ", options_.prefix,
                    ")");
  }
  if (peer >= 0) {
    absl::StrAppend(&where, " (peer rank ", root_ranks_[peer], ")");
  }
  absl::StrAppend(&where, ": ");
  return where;
}

absl::Status GlooCommunicator::RunGloo(absl::string_view op,
                                       const std::function<void()>& fn) {
  absl::Status status;
  try {
    fn();
    return absl::OkStatus();
  } catch (const CoordinationStoreError& e) {
    status = absl::Status(
        e.status().code(),
        absl::StrCat(Where(op, -1), "rendezvous: ", e.status().message()));
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    const std::string message = Where(op, FindPeer(what)) + what;
    status = IsTimeout(what) ? absl::DeadlineExceededError(message)
                             : absl::UnavailableError(message);
  } catch (const gloo::EnforceNotMet& e) {
    const std::string what = e.what();
    const std::string message = Where(op, FindPeer(what)) + what;
    status = IsTimeout(what) ? absl::DeadlineExceededError(message)
                             : absl::InternalError(message);
  } catch (const std::exception& e) {
    status = absl::InternalError(Where(op, -1) + e.what());
  } catch (...) {
    status = absl::InternalError(Where(op, -1) + "unknown exception");
  }
  if (aborted_.load()) {
    return absl::AbortedError(absl::StrCat(
        Where(op, -1), "communicator was aborted (", status.message(), ")"));
  }
  return status;
}

absl::Status GlooCommunicator::RunCollectiveLocked(
    absl::string_view op, const std::function<void()>& fn) {
  absl::Status status = RunGloo(op, fn);
  if (status.ok() && aborted_.load()) {
    // An interrupted wait returns quietly: the data is not valid.
    status = absl::AbortedError(
        absl::StrCat(Where(op, -1), "communicator was aborted"));
  }
  if (!status.ok() && failed_.ok() && !aborted_.load()) failed_ = status;
  return status;
}

absl::Status GlooCommunicator::CheckUsableLocked(absl::string_view op) const {
  if (aborted_.load()) {
    return absl::AbortedError(
        absl::StrCat(Where(op, -1), "communicator was aborted"));
  }
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(op, -1), "communicator unusable after an earlier ",
                     "error: ", failed_.ToString()));
  }
  return absl::OkStatus();
}

uint32_t GlooCommunicator::NextTagLocked() { return next_tag_++; }

absl::Status GlooCommunicator::AllToAllV(
    const float* send, const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  std::lock_guard<std::mutex> lock(op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked("AllToAllV"));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllToAllV(
      kBackend, rank_, world_size_, send, send_counts, recv, recv_counts));
  if (world_size_ == 1) {
    if (send_counts[0] > 0) {
      std::memmove(recv, send, send_counts[0] * sizeof(float));
    }
    return absl::OkStatus();
  }
  const int64_t send_total = Sum(send_counts);
  const int64_t recv_total = Sum(recv_counts);
  return RunCollectiveLocked("AllToAllV", [&] {
    // Gloo wants real buffers even for zero bytes: point those at a dummy.
    float dummy_send = 0;
    float dummy_recv = 0;
    auto in = context_->createUnboundBuffer(
        send_total > 0 ? const_cast<float*>(send) : &dummy_send,
        send_total * sizeof(float));
    auto out = context_->createUnboundBuffer(
        recv_total > 0 ? recv : &dummy_recv, recv_total * sizeof(float));
    gloo::AlltoallvOptions opts(context_);
    InflightScope inflight(this, {in.get(), out.get()});
    opts.setInput<float>(std::move(in), send_counts);
    opts.setOutput<float>(std::move(out), recv_counts);
    opts.setTag(NextTagLocked());
    opts.setTimeout(timeout_);
    gloo::alltoallv(opts);
  });
}

absl::Status GlooCommunicator::AllGatherV(
    const float* send, int64_t send_count, float* recv,
    const std::vector<int64_t>& recv_counts) {
  std::lock_guard<std::mutex> lock(op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked("AllGatherV"));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllGatherV(
      kBackend, rank_, world_size_, send, send_count, recv, recv_counts));
  // Own contribution first; Gloo then only moves the others' (no input
  // buffer, so it does not copy again).
  const int64_t offset = std::accumulate(
      recv_counts.begin(), recv_counts.begin() + rank_, int64_t{0});
  if (send_count > 0) {
    std::memmove(recv + offset, send, send_count * sizeof(float));
  }
  if (world_size_ == 1) return absl::OkStatus();
  const int64_t recv_total = Sum(recv_counts);
  return RunCollectiveLocked("AllGatherV", [&] {
    float dummy = 0;
    auto out = context_->createUnboundBuffer(recv_total > 0 ? recv : &dummy,
                                             recv_total * sizeof(float));
    gloo::AllgathervOptions opts(context_);
    InflightScope inflight(this, {out.get()});
    opts.setOutput<float>(
        std::move(out),
        std::vector<size_t>(recv_counts.begin(), recv_counts.end()));
    opts.setTag(NextTagLocked());
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  });
}

absl::Status GlooCommunicator::Broadcast(float* data, int64_t count, int root) {
  std::lock_guard<std::mutex> lock(op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked("Broadcast"));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckBroadcast(
      kBackend, rank_, world_size_, data, count, root));
  if (world_size_ == 1) return absl::OkStatus();
  return RunCollectiveLocked("Broadcast", [&] {
    float dummy = 0;
    auto out = context_->createUnboundBuffer(count > 0 ? data : &dummy,
                                             count * sizeof(float));
    gloo::BroadcastOptions opts(context_);
    InflightScope inflight(this, {out.get()});
    opts.setOutput<float>(std::move(out));
    opts.setRoot(root);
    opts.setTag(NextTagLocked());
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  std::lock_guard<std::mutex> lock(op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked("Barrier"));
  if (world_size_ == 1) return absl::OkStatus();
  return RunCollectiveLocked("Barrier", [&] {
    // gloo::barrier's algorithm (dissemination), on a buffer we own so that
    // Abort can interrupt it.
    char dummy = 0;
    auto buffer = context_->createUnboundBuffer(&dummy, 0);
    InflightScope inflight(this, {buffer.get()});
    const uint64_t slot =
        gloo::Slot::build(gloo::kBarrierSlotPrefix, NextTagLocked());
    for (int distance = 1; distance < world_size_; distance <<= 1) {
      buffer->recv((world_size_ + rank_ - distance) % world_size_, slot, 0, 0);
      buffer->send((rank_ + distance) % world_size_, slot, 0, 0);
      // A false return means Abort interrupted the wait.
      if (!buffer->waitRecv(nullptr, timeout_)) return;
      if (!buffer->waitSend(nullptr, timeout_)) return;
    }
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> GlooCommunicator::Split(
    const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked("Split"));
  MUON_RETURN_IF_ERROR(
      communicator_internal::CheckSplit(kBackend, rank_, world_size_, ranks));
  const std::string joined = absl::StrJoin(ranks, "_");
  const int n = split_counts_[joined]++;
  GlooOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/split", n, "/", joined);
  std::vector<int> root_ranks;
  root_ranks.reserve(ranks.size());
  for (int r : ranks) root_ranks.push_back(root_ranks_[r]);
  const int new_rank = static_cast<int>(
      std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  std::unique_ptr<GlooCommunicator> child(new GlooCommunicator(
      new_rank, static_cast<int>(ranks.size()), client_, options,
      std::move(root_ranks), /*subgroup=*/true, device_));
  // The rendezvous goes through this communicator's store, so that Abort
  // here cancels it.
  absl::Status status = child->Connect("Split", *store_);
  if (aborted_.load()) {
    return absl::AbortedError(absl::StrCat(
        Where("Split", -1), "communicator was aborted",
        status.ok() ? "" : absl::StrCat(" (", status.message(), ")")));
  }
  if (!status.ok()) {
    // The members number their splits alike: one that failed here may
    // have succeeded or be pending elsewhere, so a retry could pair with
    // another split's rendezvous. The group is broken for good, as after a
    // failed collective.
    if (failed_.ok()) failed_ = status;
    return status;
  }
  return std::unique_ptr<Communicator>(std::move(child));
}

void GlooCommunicator::Abort() {
  aborted_.store(true);
  store_->Cancel();
  if (context_ != nullptr) {
    // Hard close (connection reset): peers' pending and later calls fail at
    // once instead of at their timeouts.
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Best effort.
    }
  }
  // Closing does not wake this rank's own pending waits. Each abortWait*
  // releases one wait and a collective may wait several times, so repeat
  // until the collective has returned (bounded by the timeout).
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(timeout_.count());
  std::unique_lock<std::mutex> lock(inflight_mu_);
  while (!inflight_.empty() && absl::Now() < deadline) {
    for (gloo::transport::UnboundBuffer* buffer : inflight_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
    inflight_cv_.wait_for(lock, std::chrono::milliseconds(1),
                          [this] { return inflight_.empty(); });
  }
}

}  // namespace muon
