// NcclCommunicator over NCCL (--config=cuda build). NCCL and CUDA are
// reached through comm/nccl_api.h, so this file includes no CUDA header.
#include "comm/nccl_communicator.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/local_communicator.h"
#include "comm/nccl_api.h"
#include "common/status_macros.h"
#include "device/cuda_runtime.h"

namespace muon {

namespace {

// Unqualified, so that the expression text in error messages reads as the
// NCCL/CUDA call it forwards to.
using nccl_api::cudaFree;
using nccl_api::cudaGetDevice;
using nccl_api::cudaMalloc;
using nccl_api::cudaMemcpy;
using nccl_api::cudaMemcpyAsync;
using nccl_api::cudaMemsetAsync;
using nccl_api::cudaSetDevice;
using nccl_api::cudaStreamCreateWithFlags;
using nccl_api::cudaStreamDestroy;
using nccl_api::cudaStreamQuery;
using nccl_api::kCudaStreamNonBlocking;
using nccl_api::ncclAllGather;
using nccl_api::ncclAllReduce;
using nccl_api::ncclBroadcast;
using nccl_api::ncclCommAbort;
using nccl_api::ncclCommCount;
using nccl_api::ncclCommDestroy;
using nccl_api::ncclCommFinalize;
using nccl_api::ncclCommGetAsyncError;
using nccl_api::ncclCommInitRankConfig;
using nccl_api::ncclCommSplit;
using nccl_api::ncclCommUserRank;
using nccl_api::ncclGetErrorString;
using nccl_api::ncclGetLastError;
using nccl_api::ncclGetUniqueId;
using nccl_api::ncclGroupEnd;
using nccl_api::ncclGroupStart;
using nccl_api::ncclRecv;
using nccl_api::ncclSend;

constexpr char kBackend[] = "nccl";
constexpr nccl_api::DataType kFloat32 = nccl_api::DataType::kFloat32;
constexpr nccl_api::DataType kInt32 = nccl_api::DataType::kInt32;

// Longest sleep between two polls: how late a completion (or Abort) may be
// noticed once the first few polls, which only yield, have passed.
constexpr absl::Duration kMaxPollSleep = absl::Milliseconds(1);
// Longest single KeyGet while waiting for the unique id.
constexpr absl::Duration kMaxKeyGet = absl::Seconds(1);

bool IsOk(int nccl_result) {
  return nccl_result == nccl_api::kNcclSuccess ||
         nccl_result == nccl_api::kNcclInProgress;
}

absl::StatusCode NcclCode(int result) {
  switch (result) {
    case nccl_api::kNcclSystemError:
    case nccl_api::kNcclRemoteError:
      return absl::StatusCode::kUnavailable;
    case nccl_api::kNcclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case nccl_api::kNcclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

// Waits between polls: yields first (collectives of a step take
// microseconds to milliseconds), then sleeps 10 us doubling up to
// kMaxPollSleep.
class Backoff {
 public:
  void Wait() {
    if (++polls_ <= 64) {
      std::this_thread::yield();
      return;
    }
    absl::SleepFor(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxPollSleep);
  }

 private:
  int polls_ = 0;
  absl::Duration sleep_ = absl::Microseconds(10);
};

// Makes a CUDA device current on this thread; restores the previous one.
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (switched_) cudaSetDevice(previous_);
  }

  // Returns the CUDA error of cudaSetDevice (0 on success).
  int Enter(int device) {
    if (cudaGetDevice(&previous_) == nccl_api::kCudaSuccess &&
        previous_ == device) {
      return nccl_api::kCudaSuccess;
    }
    const int error = cudaSetDevice(device);
    switched_ = error == nccl_api::kCudaSuccess && previous_ >= 0;
    return error;
  }

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// Offsets of a packed layout: offsets[p] = counts[0] + ... + counts[p-1].
std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t p = 1; p < counts.size(); ++p) {
    offsets[p] = offsets[p - 1] + counts[p - 1];
  }
  return offsets;
}

// Color of a rank list for ncclCommSplit: 32-bit FNV-1a over the ranks,
// made non-negative. Deterministic across processes (unlike absl::Hash,
// which is seeded per process). Two lists of one round that collide would
// form one communicator; Split's all-gather of global ranks reports that.
int SplitColor(const std::vector<int>& ranks) {
  uint32_t hash = 2166136261u;
  for (int rank : ranks) {
    const uint32_t value = static_cast<uint32_t>(rank);
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xffu;
      hash *= 16777619u;
    }
  }
  return static_cast<int>(hash & 0x7fffffffu);
}

// The split call as NcclError names it.
constexpr char kSplitCall[] =
    "ncclCommSplit(comm, color, key, &newcomm, config)";

std::string UniqueIdKey(const std::string& prefix) {
  return absl::StrCat(prefix, "/unique_id");
}

bool IsHex(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c)) != 0;
  });
}

// Waits for `key` in the store until `deadline`, KeyGet by KeyGet (each at
// most kMaxKeyGet), treating NotFound and DeadlineExceeded as "not yet".
absl::StatusOr<std::string> WaitForKey(CoordinationClient* store,
                                       const std::string& key,
                                       absl::Time deadline,
                                       absl::Duration timeout) {
  while (true) {
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", key, "' not set within ", absl::FormatDuration(timeout),
          " (did rank 0 call Create with this prefix?)"));
    }
    absl::StatusOr<std::string> value =
        store->KeyGet(key, std::min(remaining, kMaxKeyGet));
    if (value.ok()) return value;
    if (value.status().code() == absl::StatusCode::kNotFound) {
      // A store that does not wait: poll gently.
      absl::SleepFor(std::min(remaining, absl::Milliseconds(10)));
    } else if (value.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return value.status();
    }
  }
}

}  // namespace

// Evaluates NCCL call `expr`; returns its error (naming `op`, `peer` and the
// expression) from the enclosing member function unless it returned
// ncclSuccess or ncclInProgress (non-blocking: the caller waits).
#define MUON_NCCL_RETURN_IF_ERROR(op, peer, expr)               \
  do {                                                          \
    const int muon_nccl_result_ = (expr);                       \
    if (!IsOk(muon_nccl_result_)) {                             \
      return NcclError((op), (peer), #expr, muon_nccl_result_); \
    }                                                           \
  } while (0)

// Evaluates CUDA runtime call `expr`; returns its error unless cudaSuccess.
#define MUON_NCCL_CUDA_RETURN_IF_ERROR(op, expr)       \
  do {                                                 \
    const int muon_cuda_error_ = (expr);               \
    if (muon_cuda_error_ != nccl_api::kCudaSuccess) {  \
      return CudaError((op), #expr, muon_cuda_error_); \
    }                                                  \
  } while (0)

NcclCommunicator::NcclCommunicator(int rank, int world_size,
                                   const NcclOptions& options,
                                   std::vector<int> root_ranks,
                                   std::string group_name)
    : rank_(rank),
      world_size_(world_size),
      options_(options),
      root_ranks_(std::move(root_ranks)),
      group_name_(std::move(group_name)) {}

NcclCommunicator::~NcclCommunicator() {
  absl::MutexLock lock(&op_mu_);
  if (comm_ == nullptr && barrier_buffer_ == nullptr && stream_ == nullptr) {
    return;
  }
  DeviceScope scope;
  scope.Enter(options_.device);
  bool finalized = false;
  if (comm_ != nullptr) {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    if (failed_.ok() && !aborted_.load() && IsOk(ncclCommFinalize(comm))) {
      finalized = WaitCommReady("destroy", comm_, "ncclCommFinalize(comm)",
                                absl::Now() + options_.timeout,
                                /*check_aborted=*/false)
                      .ok();
    }
    if (finalized) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
    }
    comm_ = nullptr;
  }
  // cudaFree waits for the whole device, including a kernel stuck on a dead
  // peer: unless the communicator finalized cleanly (no failure, no abort,
  // ncclCommFinalize completed in time), the 4-byte buffer is left to the
  // process's exit instead. (On the clean path cudaFree still waits for
  // the device's other work.)
  if (barrier_buffer_ != nullptr && finalized) cudaFree(barrier_buffer_);
  if (stream_ != nullptr) {
    cudaStreamDestroy(static_cast<nccl_api::Stream>(stream_));
  }
}

std::string NcclCommunicator::Where(absl::string_view op, int peer) const {
  auto global = [this](int rank) {
    return rank >= 0 && rank < static_cast<int>(root_ranks_.size()) &&
                   root_ranks_[rank] >= 0
               ? root_ranks_[rank]
               : rank;
  };
  std::string where =
      absl::StrCat(kBackend, " ", op, " on rank ", global(rank_));
  if (!group_name_.empty()) {
    absl::StrAppend(&where, " (rank ", rank_, " of group ", group_name_, ")");
  }
  if (peer >= 0) absl::StrAppend(&where, " (peer rank ", global(peer), ")");
  absl::StrAppend(&where, ": ");
  return where;
}

absl::Status NcclCommunicator::NcclError(absl::string_view op, int peer,
                                         absl::string_view expr,
                                         int result) const {
  const char* text = ncclGetErrorString(result);
  std::string message = absl::StrCat(Where(op, peer), expr, ": ",
                                     text != nullptr ? text : "NCCL error");
  // Process-wide in NCCL (its comm argument is unused): may belong to
  // another communicator's failure, so it is labeled as such.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') {
    absl::StrAppend(&message, "; NCCL's last error: ", last);
  }
  return absl::Status(NcclCode(result), message);
}

absl::Status NcclCommunicator::CudaError(absl::string_view op,
                                         absl::string_view expr,
                                         int error) const {
  // The device layer's map (codes and "<expr>: <name> (<code>): <text>").
  const std::string what(expr);
  const absl::Status s = device::CudaErrorToStatus(error, what.c_str());
  return absl::Status(s.code(), absl::StrCat(Where(op), s.message()));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    int rank, int world_size, CoordinationClient* store,
    const NcclOptions& options) {
  const std::string where = absl::StrCat("nccl Create on rank ", rank, ": ");
  MUON_RETURN_IF_ERROR(
      CheckCreateArguments(where, rank, world_size, store, options));
  const absl::Time deadline = absl::Now() + options.timeout;
  MUON_RETURN_IF_ERROR(CheckDeviceVisible(where, options.device));
  std::vector<int> root_ranks(world_size);
  std::iota(root_ranks.begin(), root_ranks.end(), 0);
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(
      rank, world_size, options, std::move(root_ranks), /*group_name=*/""));
  DeviceScope scope;
  if (const int error = scope.Enter(options.device);
      error != nccl_api::kCudaSuccess) {
    return comm->CudaError("Create", "cudaSetDevice(options.device)", error);
  }
  MUON_RETURN_IF_ERROR(comm->InitResources("Create"));
  nccl_api::UniqueId id;
  MUON_RETURN_IF_ERROR(comm->ExchangeUniqueId(store, deadline, &id));
  MUON_RETURN_IF_ERROR(comm->InitComm(id, deadline));
  return comm;
}

absl::Status NcclCommunicator::CheckCreateArguments(
    const std::string& where, int rank, int world_size,
    const CoordinationClient* store, const NcclOptions& options) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "world_size is ", world_size, "; want >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "rank is ", rank, "; want 0 <= rank < world_size ", world_size));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(where, "store is null"));
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "options.prefix must be non-empty"));
  }
  if (options.timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "options.timeout is ",
                     absl::FormatDuration(options.timeout), "; want >= 1ms"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "options.device is ", options.device, "; want >= 0"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::CheckDeviceVisible(const std::string& where,
                                                  int device) {
  std::string no_device_reason;
  const int device_count = device::CudaDeviceCount(&no_device_reason);
  if (device_count <= 0 && !no_device_reason.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "no usable GPU: ", no_device_reason));
  }
  if (device_count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "no GPU visible (cudaGetDeviceCount found 0)"));
  }
  if (device >= device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "options.device is ", device, " but only ",
                     device_count, " CUDA device(s) are visible"));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::ExchangeUniqueId(CoordinationClient* store,
                                                absl::Time deadline,
                                                nccl_api::UniqueId* id) {
  // Rendezvous: rank 0's ncclUniqueId, hex-encoded (the store's values may
  // travel as proto3 strings, which must be valid UTF-8).
  const std::string key = UniqueIdKey(options_.prefix);
  if (rank_ == 0) {
    const int result = ncclGetUniqueId(id);
    if (!IsOk(result)) {
      return NcclError("Create", -1, "ncclGetUniqueId(&id)", result);
    }
    if (world_size_ > 1) {
      const absl::Status set =
          store->KeySet(key, absl::BytesToHexString(absl::string_view(
                                 id->internal, nccl_api::kUniqueIdBytes)));
      if (!set.ok()) {
        return absl::Status(
            set.code(), absl::StrCat(Where("Create"), "rendezvous: KeySet('",
                                     key, "'): ", set.message()));
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> hex =
      WaitForKey(store, key, deadline, options_.timeout);
  if (!hex.ok()) {
    return absl::Status(
        hex.status().code(),
        absl::StrCat(Where("Create"), "rendezvous: ", hex.status().message()));
  }
  if (hex->size() != 2 * nccl_api::kUniqueIdBytes || !IsHex(*hex)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where("Create"), "rendezvous: key '", key, "' holds ", hex->size(),
        " characters; want ", 2 * nccl_api::kUniqueIdBytes,
        " hex digits (an ncclUniqueId written by rank 0's Create)"));
  }
  const std::string bytes = absl::HexStringToBytes(*hex);
  std::copy(bytes.begin(), bytes.end(), id->internal);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::InitComm(const nccl_api::UniqueId& id,
                                        absl::Time deadline) {
  nccl_api::Config config;
  config.blocking = 0;
  config.comm_name = options_.prefix.c_str();
  nccl_api::Comm nccl_comm = nullptr;
  const int init =
      ncclCommInitRankConfig(&nccl_comm, world_size_, id, rank_, config);
  if (!IsOk(init)) {
    if (nccl_comm != nullptr) ncclCommAbort(nccl_comm);
    return NcclError(
        "Create", -1,
        "ncclCommInitRankConfig(&comm, world_size, id, rank, config)", init);
  }
  absl::Status ready = WaitCommReady(
      "Create", nccl_comm,
      "ncclCommInitRankConfig(&comm, world_size, id, rank, config)", deadline,
      /*check_aborted=*/false);
  if (!ready.ok()) {
    ncclCommAbort(nccl_comm);
    return ready;
  }
  absl::MutexLock lock(&op_mu_);
  comm_ = nccl_comm;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::InitResources(absl::string_view op) {
  nccl_api::Stream stream = nullptr;
  MUON_NCCL_CUDA_RETURN_IF_ERROR(
      op, cudaStreamCreateWithFlags(&stream, kCudaStreamNonBlocking));
  stream_ = stream;
  void* buffer = nullptr;
  MUON_NCCL_CUDA_RETURN_IF_ERROR(op, cudaMalloc(&buffer, sizeof(float)));
  barrier_buffer_ = static_cast<float*>(buffer);
  // On the communicator's (non-blocking) stream, so that the barriers
  // enqueued there later are ordered after it.
  MUON_NCCL_CUDA_RETURN_IF_ERROR(
      op, cudaMemsetAsync(buffer, 0, sizeof(float), stream));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitCommReady(absl::string_view op, void* comm,
                                             absl::string_view what,
                                             absl::Time deadline,
                                             bool check_aborted) {
  nccl_api::Comm nccl_comm = static_cast<nccl_api::Comm>(comm);
  Backoff backoff;
  while (true) {
    int state = nccl_api::kNcclSuccess;
    MUON_NCCL_RETURN_IF_ERROR(op, -1, ncclCommGetAsyncError(nccl_comm, &state));
    if (state == nccl_api::kNcclSuccess) return absl::OkStatus();
    if (state != nccl_api::kNcclInProgress) {
      return NcclError(op, -1, absl::StrCat(what, " (asynchronous result)"),
                       state);
    }
    if (check_aborted && aborted_.load()) {
      return absl::AbortedError(
          absl::StrCat(Where(op), "communicator was aborted"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          Where(op), what, " did not complete within ",
          absl::FormatDuration(options_.timeout),
          " (ncclCommGetAsyncError still ncclInProgress: a rank of the group "
          "did not make the same call, failed, or is slow)"));
    }
    backoff.Wait();
  }
}

absl::Status NcclCommunicator::WaitStreamLocked(absl::string_view op,
                                                absl::Time deadline) {
  nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
  nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
  Backoff backoff;
  while (true) {
    const int query = cudaStreamQuery(stream);
    if (query != nccl_api::kCudaSuccess &&
        query != nccl_api::kCudaErrorNotReady) {
      return CudaError(op, "cudaStreamQuery(stream)", query);
    }
    int state = nccl_api::kNcclSuccess;
    MUON_NCCL_RETURN_IF_ERROR(op, -1, ncclCommGetAsyncError(comm, &state));
    if (!IsOk(state)) {
      return NcclError(op, -1, "ncclCommGetAsyncError(comm, &state) -> state",
                       state);
    }
    if (query == nccl_api::kCudaSuccess) return absl::OkStatus();
    if (aborted_.load()) {
      return absl::AbortedError(
          absl::StrCat(Where(op), "communicator was aborted"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          Where(op), "not complete on the GPU within ",
          absl::FormatDuration(options_.timeout),
          " (cudaStreamQuery still cudaErrorNotReady: a rank of the group did "
          "not make the same call, failed, or is slow)"));
    }
    backoff.Wait();
  }
}

absl::Status NcclCommunicator::CheckUsableLocked(absl::string_view op) const {
  if (aborted_.load()) {
    return absl::AbortedError(
        absl::StrCat(Where(op), "communicator was aborted"));
  }
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(op), "communicator unusable after an earlier ",
                     "error: ", failed_.ToString()));
  }
  if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(op), "no NCCL communicator"));
  }
  return absl::OkStatus();
}

void NcclCommunicator::AbortCommLocked() {
  if (comm_ == nullptr) return;
  // Non-blocking: may return ncclInProgress and finish in NCCL's own
  // thread; the communicator must not be touched afterwards either way.
  ncclCommAbort(static_cast<nccl_api::Comm>(comm_));
  comm_ = nullptr;
}

absl::Status NcclCommunicator::FailLocked(absl::string_view op,
                                          absl::Status status) {
  if (aborted_.load()) {
    if (status.code() != absl::StatusCode::kAborted) {
      status = absl::AbortedError(absl::StrCat(
          Where(op), "communicator was aborted (", status.message(), ")"));
    }
  } else if (failed_.ok()) {
    failed_ = status;
  }
  AbortCommLocked();
  return status;
}

absl::Status NcclCommunicator::RunLocked(
    absl::string_view op, const std::function<absl::Status()>& enqueue) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  MUON_RETURN_IF_ERROR(LaunchLocked(op, enqueue, deadline));
  // The calls are on stream_: wait for them (bounded by the deadline).
  absl::Status status = WaitStreamLocked(op, deadline);
  if (!status.ok()) return FailLocked(op, std::move(status));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::LaunchLocked(
    absl::string_view op, const std::function<absl::Status()>& enqueue,
    absl::Time deadline) {
  DeviceScope scope;
  if (const int error = scope.Enter(options_.device);
      error != nccl_api::kCudaSuccess) {
    return CudaError(op, "cudaSetDevice(options.device)", error);
  }
  absl::Status status = enqueue();
  // ncclGroupEnd and lone calls may return ncclInProgress: the operations
  // are on the stream only once the communicator leaves that state.
  if (status.ok()) {
    status = WaitCommReady(op, comm_, "launch of the enqueued NCCL calls",
                           deadline, /*check_aborted=*/true);
  }
  if (!status.ok()) return FailLocked(op, std::move(status));
  return absl::OkStatus();
}

absl::Status NcclCommunicator::EndGroup(absl::string_view op,
                                        absl::Status body_status) const {
  const int end = ncclGroupEnd();
  MUON_RETURN_IF_ERROR(body_status);
  if (!IsOk(end)) return NcclError(op, -1, "ncclGroupEnd()", end);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllToAllV(
    const float* send, const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  constexpr char kOp[] = "AllToAllV";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllToAllV(
      kBackend, rank_, world_size_, send, send_counts, recv, recv_counts));
  return RunLocked(kOp, [&]() -> absl::Status {
    return EnqueueAllToAllVLocked(kOp, stream_, send, send_counts, recv,
                                  recv_counts);
  });
}

absl::Status NcclCommunicator::AllToAllVOnStream(
    device::Stream* stream, const float* send,
    const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  constexpr char kOp[] = "AllToAllVOnStream";
  if (stream == nullptr ||
      stream->device() != device::Device::Cuda(options_.device)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(kOp, -1), "stream \"", stream ? stream->name() : "null",
        "\" is on ", stream ? stream->device().ToString() : "no device",
        ", not this communicator's cuda:", options_.device));
  }
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllToAllV(
      kBackend, rank_, world_size_, send, send_counts, recv, recv_counts));
  void* native = stream->native_handle();
  return LaunchLocked(
      kOp,
      [&]() -> absl::Status {
        return EnqueueAllToAllVLocked(kOp, native, send, send_counts, recv,
                                      recv_counts);
      },
      absl::Now() + options_.timeout);
}

absl::Status NcclCommunicator::AsyncError() {
  constexpr char kOp[] = "AsyncError";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  int state = nccl_api::kNcclSuccess;
  MUON_NCCL_RETURN_IF_ERROR(
      kOp, -1,
      ncclCommGetAsyncError(static_cast<nccl_api::Comm>(comm_), &state));
  if (!IsOk(state)) {
    return FailLocked(kOp, NcclError(kOp, -1,
                                     "ncclCommGetAsyncError(comm, &state) -> "
                                     "state",
                                     state));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::EnqueueAllToAllVLocked(
    absl::string_view op, void* native_stream, const float* send,
    const std::vector<int64_t>& send_counts, float* recv,
    const std::vector<int64_t>& recv_counts) {
  const std::vector<int64_t> send_offsets = Offsets(send_counts);
  const std::vector<int64_t> recv_offsets = Offsets(recv_counts);
  const float* own_send = send + send_offsets[rank_];
  float* own_recv = recv + recv_offsets[rank_];
  const size_t own_bytes = send_counts[rank_] * sizeof(float);
  // The own part moves unless it is empty or in place: by a device copy, or
  // with exchange_self_through_nccl by send/recv to self in the group.
  const bool move_own = own_bytes > 0 && own_send != own_recv;
  const bool self_via_nccl = move_own && options_.exchange_self_through_nccl;
  bool any_peer = self_via_nccl;
  for (int p = 0; p < world_size_; ++p) {
    if (p != rank_ && (send_counts[p] > 0 || recv_counts[p] > 0)) {
      any_peer = true;
    }
  }
  nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
  nccl_api::Stream stream = static_cast<nccl_api::Stream>(native_stream);
  if (move_own && !self_via_nccl) {
    MUON_NCCL_CUDA_RETURN_IF_ERROR(
        op, cudaMemcpyAsync(own_recv, own_send, own_bytes, stream));
  }
  if (!any_peer) return absl::OkStatus();
  MUON_NCCL_RETURN_IF_ERROR(op, -1, ncclGroupStart());
  return EndGroup(op, [&]() -> absl::Status {
    for (int p = 0; p < world_size_; ++p) {
      if (p == rank_ && !self_via_nccl) continue;
      if (send_counts[p] > 0) {
        MUON_NCCL_RETURN_IF_ERROR(
            op, p,
            ncclSend(send + send_offsets[p], send_counts[p], kFloat32, p, comm,
                     stream));
      }
      if (recv_counts[p] > 0) {
        MUON_NCCL_RETURN_IF_ERROR(
            op, p,
            ncclRecv(recv + recv_offsets[p], recv_counts[p], kFloat32, p, comm,
                     stream));
      }
    }
    return absl::OkStatus();
  }());
}

absl::Status NcclCommunicator::AllGatherV(
    const float* send, int64_t send_count, float* recv,
    const std::vector<int64_t>& recv_counts) {
  constexpr char kOp[] = "AllGatherV";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckAllGatherV(
      kBackend, rank_, world_size_, send, send_count, recv, recv_counts));
  const std::vector<int64_t> offsets = Offsets(recv_counts);
  const int64_t total = offsets.back() + recv_counts.back();
  // Every rank has the same recv_counts: all skip, or none.
  if (total == 0) return absl::OkStatus();
  const bool equal =
      std::all_of(recv_counts.begin(), recv_counts.end(),
                  [&](int64_t count) { return count == recv_counts[0]; });
  return RunLocked(kOp, [&]() -> absl::Status {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
    if (equal) {
      MUON_NCCL_RETURN_IF_ERROR(
          kOp, -1,
          ncclAllGather(send, recv, send_count, kFloat32, comm, stream));
      return absl::OkStatus();
    }
    float* own_recv = recv + offsets[rank_];
    if (send_count > 0 && send != own_recv) {
      MUON_NCCL_CUDA_RETURN_IF_ERROR(
          kOp,
          cudaMemcpyAsync(own_recv, send, send_count * sizeof(float), stream));
    }
    MUON_NCCL_RETURN_IF_ERROR(kOp, -1, ncclGroupStart());
    return EndGroup(kOp, [&]() -> absl::Status {
      for (int p = 0; p < world_size_; ++p) {
        if (p == rank_) continue;
        if (send_count > 0) {
          MUON_NCCL_RETURN_IF_ERROR(
              kOp, p, ncclSend(send, send_count, kFloat32, p, comm, stream));
        }
        if (recv_counts[p] > 0) {
          MUON_NCCL_RETURN_IF_ERROR(kOp, p,
                                    ncclRecv(recv + offsets[p], recv_counts[p],
                                             kFloat32, p, comm, stream));
        }
      }
      return absl::OkStatus();
    }());
  });
}

absl::Status NcclCommunicator::Broadcast(float* data, int64_t count, int root) {
  constexpr char kOp[] = "Broadcast";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(communicator_internal::CheckBroadcast(
      kBackend, rank_, world_size_, data, count, root));
  if (count == 0) return absl::OkStatus();  // Same count on every rank.
  return RunLocked(kOp, [&]() -> absl::Status {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
    MUON_NCCL_RETURN_IF_ERROR(
        kOp, -1,
        ncclBroadcast(data, data, count, kFloat32, root, comm, stream));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::Barrier() {
  constexpr char kOp[] = "Barrier";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  return RunLocked(kOp, [&]() -> absl::Status {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
    float* buffer = barrier_buffer_;
    MUON_NCCL_RETURN_IF_ERROR(
        kOp, -1, ncclAllReduce(buffer, buffer, 1, kFloat32, comm, stream));
    return absl::OkStatus();
  });
}

namespace {

absl::Status CheckPointToPoint(absl::string_view op, int rank, int world_size,
                               const float* data, int64_t count, int peer) {
  const std::string where =
      absl::StrCat(kBackend, " ", op, " on rank ", rank, ": ");
  if (peer < 0 || peer >= world_size || peer == rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "peer is ", peer, "; want 0 <= peer < world_size ",
                     world_size, " and peer != rank ", rank));
  }
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "count is ", count, "; want >= 0"));
  }
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "data is null but ", count, " elements are to be moved"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status NcclCommunicator::Send(const float* data, int64_t count, int peer,
                                    uint32_t tag) {
  constexpr char kOp[] = "Send";
  (void)tag;  // NCCL matches point-to-point messages by order, not tag.
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(
      CheckPointToPoint(kOp, rank_, world_size_, data, count, peer));
  if (count == 0) return absl::OkStatus();  // The Recv skips too.
  return RunLocked(kOp, [&]() -> absl::Status {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
    MUON_NCCL_RETURN_IF_ERROR(
        kOp, peer, ncclSend(data, count, kFloat32, peer, comm, stream));
    return absl::OkStatus();
  });
}

absl::Status NcclCommunicator::Recv(float* data, int64_t count, int peer,
                                    uint32_t tag) {
  constexpr char kOp[] = "Recv";
  (void)tag;
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(
      CheckPointToPoint(kOp, rank_, world_size_, data, count, peer));
  if (count == 0) return absl::OkStatus();
  return RunLocked(kOp, [&]() -> absl::Status {
    nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
    nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
    MUON_NCCL_RETURN_IF_ERROR(
        kOp, peer, ncclRecv(data, count, kFloat32, peer, comm, stream));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Split(
    const std::vector<int>& ranks) {
  constexpr char kOp[] = "Split";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  MUON_RETURN_IF_ERROR(
      communicator_internal::CheckSplit(kBackend, rank_, world_size_, ranks));
  const int position = static_cast<int>(
      std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  std::string group_name = absl::StrCat(options_.prefix, "/split", splits_++,
                                        "/", absl::StrJoin(ranks, "_"));
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclCommunicator> child,
      SplitLocked(kOp, SplitColor(ranks), position, std::move(group_name)));
  std::vector<int> expected(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) expected[i] = root_ranks_[ranks[i]];
  if (child->root_ranks_ != expected) {
    const std::string formed = absl::StrJoin(child->root_ranks_, ", ");
    child->Abort();
    return absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), "ranks is {", absl::StrJoin(ranks, ", "),
        "} (global ranks {", absl::StrJoin(expected, ", "),
        "}) but the group formed has global ranks {", formed,
        "}: the ranks of one Split round disagree on the lists (or two "
        "lists' colors collided)"));
  }
  return std::unique_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::SplitByColor(int color, int key) {
  constexpr char kOp[] = "SplitByColor";
  absl::MutexLock lock(&op_mu_);
  MUON_RETURN_IF_ERROR(CheckUsableLocked(kOp));
  if (color < kNoColor) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(kOp), "color is ", color, "; want >= 0 or kNoColor (-1)"));
  }
  std::string group_name =
      absl::StrCat(options_.prefix, "/split", splits_++, "/color", color);
  return SplitLocked(kOp, color, key, std::move(group_name));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::SplitLocked(
    absl::string_view op, int color, int key, std::string group_name) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  DeviceScope scope;
  if (const int error = scope.Enter(options_.device);
      error != nccl_api::kCudaSuccess) {
    return CudaError(op, "cudaSetDevice(options.device)", error);
  }
  nccl_api::Comm parent = static_cast<nccl_api::Comm>(comm_);
  nccl_api::Config config;
  config.blocking = 0;
  // The split runs as the parent's asynchronous job, which writes the new
  // communicator to *slot only when it is done (NCCL keeps the pointer). On
  // success it is read and freed below; if the wait fails, ncclCommAbort of
  // the parent joins the job, but the slot is deliberately leaked (8 bytes)
  // rather than risk a late write into freed memory.
  auto* slot = new nccl_api::Comm(nullptr);
  const int result = ncclCommSplit(parent, color, key, slot, config);
  if (!IsOk(result)) {
    delete slot;
    return FailLocked(op, NcclError(op, -1, kSplitCall, result));
  }
  absl::Status status = WaitCommReady(op, parent, kSplitCall, deadline,
                                      /*check_aborted=*/true);
  if (!status.ok()) {
    status = FailLocked(op, std::move(status));  // Aborts the parent.
    if (*slot != nullptr) ncclCommAbort(*slot);
    return status;
  }
  nccl_api::Comm newcomm = *slot;
  delete slot;
  if (color == kNoColor) return std::unique_ptr<NcclCommunicator>();
  if (newcomm == nullptr) {
    return FailLocked(op, absl::InternalError(
                              absl::StrCat(Where(op),
                                           "ncclCommSplit completed without a "
                                           "communicator for color ",
                                           color)));
  }
  int count = 0;
  int user_rank = 0;
  status = SplitCommShape(op, newcomm, deadline, &count, &user_rank);
  if (!status.ok()) {
    ncclCommAbort(newcomm);
    return FailLocked(op, std::move(status));
  }

  return MakeSplitChild(op, newcomm, count, user_rank, std::move(group_name));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>>
NcclCommunicator::MakeSplitChild(absl::string_view op, void* newcomm, int count,
                                 int user_rank, std::string group_name) {
  std::vector<int> child_roots(count, -1);
  child_roots[user_rank] = root_ranks_[rank_];
  std::unique_ptr<NcclCommunicator> child(
      new NcclCommunicator(user_rank, count, options_, std::move(child_roots),
                           std::move(group_name)));
  {
    absl::MutexLock child_lock(&child->op_mu_);
    child->comm_ = newcomm;
  }
  absl::Status status = child->InitResources(op);
  if (status.ok()) status = child->ExchangeRootRanks(op, root_ranks_[rank_]);
  if (!status.ok()) {
    child->Abort();
    return status;
  }
  return child;
}

absl::Status NcclCommunicator::SplitCommShape(absl::string_view op,
                                              void* newcomm,
                                              absl::Time deadline, int* count,
                                              int* user_rank) {
  nccl_api::Comm c = static_cast<nccl_api::Comm>(newcomm);
  MUON_RETURN_IF_ERROR(WaitCommReady(op, c, kSplitCall, deadline,
                                     /*check_aborted=*/true));
  const int count_result = ncclCommCount(c, count);
  if (!IsOk(count_result)) {
    return NcclError(op, -1, "ncclCommCount(newcomm, &count)", count_result);
  }
  const int rank_result = ncclCommUserRank(c, user_rank);
  if (!IsOk(rank_result)) {
    return NcclError(op, -1, "ncclCommUserRank(newcomm, &user_rank)",
                     rank_result);
  }
  if (*count < 1 || *user_rank < 0 || *user_rank >= *count) {
    return absl::InternalError(
        absl::StrCat(Where(op), "ncclCommSplit made a communicator of ", *count,
                     " ranks with this rank at ", *user_rank));
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicator::ExchangeRootRanks(absl::string_view op,
                                                 int my_root_rank) {
  absl::MutexLock lock(&op_mu_);
  DeviceScope scope;
  if (const int error = scope.Enter(options_.device);
      error != nccl_api::kCudaSuccess) {
    return CudaError(op, "cudaSetDevice(options.device)", error);
  }
  void* raw = nullptr;
  MUON_NCCL_CUDA_RETURN_IF_ERROR(
      op, cudaMalloc(&raw, world_size_ * sizeof(int32_t)));
  int32_t* gathered = static_cast<int32_t*>(raw);
  const int32_t mine = my_root_rank;
  bool stream_done = false;  // The all-gather and the copies have finished.
  absl::Status status = [&]() -> absl::Status {
    // The upload is enqueued on the communicator's stream ahead of the
    // all-gather (a plain cudaMemcpy from pageable memory may return before
    // its DMA lands and does not order with a non-blocking stream);
    // RunLocked waits for the stream, so `mine` outlives the copy and the
    // download below reads the finished all-gather.
    MUON_RETURN_IF_ERROR(RunLocked(op, [&]() -> absl::Status {
      nccl_api::Comm comm = static_cast<nccl_api::Comm>(comm_);
      nccl_api::Stream stream = static_cast<nccl_api::Stream>(stream_);
      MUON_NCCL_CUDA_RETURN_IF_ERROR(
          op,
          cudaMemcpyAsync(gathered + rank_, &mine, sizeof(int32_t), stream));
      MUON_NCCL_RETURN_IF_ERROR(
          op, -1,
          ncclAllGather(gathered + rank_, gathered, 1, kInt32, comm, stream));
      return absl::OkStatus();
    }));
    std::vector<int32_t> host(world_size_);
    MUON_NCCL_CUDA_RETURN_IF_ERROR(
        op, cudaMemcpy(host.data(), gathered, world_size_ * sizeof(int32_t)));
    stream_done = true;
    for (int r = 0; r < world_size_; ++r) {
      if (host[r] < 0) {
        return absl::InternalError(
            absl::StrCat(Where(op), "all-gather of global ranks gave ", host[r],
                         " for rank ", r));
      }
      root_ranks_[r] = host[r];
    }
    return absl::OkStatus();
  }();
  // As in the destructor: no device-wide wait when the stream may be stuck.
  if (stream_done) cudaFree(raw);
  return status;
}

void NcclCommunicator::Abort() {
  aborted_.store(true);
  // A pending call notices aborted_ within one poll and releases op_mu_.
  absl::MutexLock lock(&op_mu_);
  DeviceScope scope;
  scope.Enter(options_.device);
  AbortCommLocked();
}

}  // namespace muon
