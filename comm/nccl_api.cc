// The only translation unit that includes nccl.h and cuda_runtime.h; see
// nccl_api.h. Compiled by the genrule :nccl_api_obj (--config=cuda only).
#include "comm/nccl_api.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <type_traits>

namespace muon {
namespace nccl_api {
namespace {

static_assert(std::is_same<Comm, ncclComm_t>::value, "ncclComm_t changed");
static_assert(std::is_same<Stream, cudaStream_t>::value,
              "cudaStream_t changed");
static_assert(kNcclSuccess == ncclSuccess, "ncclResult_t changed");
static_assert(kNcclUnhandledCudaError == ncclUnhandledCudaError, "");
static_assert(kNcclSystemError == ncclSystemError, "");
static_assert(kNcclInternalError == ncclInternalError, "");
static_assert(kNcclInvalidArgument == ncclInvalidArgument, "");
static_assert(kNcclInvalidUsage == ncclInvalidUsage, "");
static_assert(kNcclRemoteError == ncclRemoteError, "");
static_assert(kNcclInProgress == ncclInProgress, "");
static_assert(kNcclSplitNoColor == NCCL_SPLIT_NOCOLOR, "");
static_assert(kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES, "");
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId), "");
static_assert(kCudaSuccess == cudaSuccess, "cudaError_t changed");
static_assert(kCudaErrorMemoryAllocation == cudaErrorMemoryAllocation, "");
static_assert(kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver, "");
static_assert(kCudaErrorNoDevice == cudaErrorNoDevice, "");
static_assert(kCudaErrorNotReady == cudaErrorNotReady, "");
static_assert(kCudaStreamNonBlocking == cudaStreamNonBlocking, "");

ncclDataType_t ToNccl(DataType type) {
  switch (type) {
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kFloat32:
    default:
      return ncclFloat32;
  }
}

ncclConfig_t ToNccl(const Config& config) {
  ncclConfig_t out = NCCL_CONFIG_INITIALIZER;
  out.blocking = config.blocking;
  if (config.comm_name != nullptr) out.commName = config.comm_name;
  return out;
}

}  // namespace

int ncclGetVersion(int* version) { return ::ncclGetVersion(version); }

int ncclGetUniqueId(UniqueId* id) {
  ncclUniqueId nccl_id;
  const ncclResult_t result = ::ncclGetUniqueId(&nccl_id);
  if (result == ncclSuccess) {
    static_assert(sizeof(id->internal) == sizeof(nccl_id.internal), "");
    for (int i = 0; i < kUniqueIdBytes; ++i) {
      id->internal[i] = nccl_id.internal[i];
    }
  }
  return result;
}

int ncclCommInitRankConfig(Comm* comm, int nranks, const UniqueId& id, int rank,
                           const Config& config) {
  ncclUniqueId nccl_id;
  for (int i = 0; i < kUniqueIdBytes; ++i) nccl_id.internal[i] = id.internal[i];
  ncclConfig_t nccl_config = ToNccl(config);
  return ::ncclCommInitRankConfig(comm, nranks, nccl_id, rank, &nccl_config);
}

int ncclCommSplit(Comm comm, int color, int key, Comm* newcomm,
                  const Config& config) {
  ncclConfig_t nccl_config = ToNccl(config);
  return ::ncclCommSplit(comm, color, key, newcomm, &nccl_config);
}

int ncclCommGetAsyncError(Comm comm, int* async_error) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ::ncclCommGetAsyncError(comm, &state);
  *async_error = state;
  return result;
}

int ncclCommCount(Comm comm, int* count) {
  return ::ncclCommCount(comm, count);
}

int ncclCommUserRank(Comm comm, int* rank) {
  return ::ncclCommUserRank(comm, rank);
}

int ncclCommFinalize(Comm comm) { return ::ncclCommFinalize(comm); }
int ncclCommDestroy(Comm comm) { return ::ncclCommDestroy(comm); }
int ncclCommAbort(Comm comm) { return ::ncclCommAbort(comm); }
int ncclGroupStart() { return ::ncclGroupStart(); }
int ncclGroupEnd() { return ::ncclGroupEnd(); }

int ncclSend(const void* buffer, size_t count, DataType type, int peer,
             Comm comm, Stream stream) {
  return ::ncclSend(buffer, count, ToNccl(type), peer, comm, stream);
}

int ncclRecv(void* buffer, size_t count, DataType type, int peer, Comm comm,
             Stream stream) {
  return ::ncclRecv(buffer, count, ToNccl(type), peer, comm, stream);
}

int ncclAllGather(const void* send, void* recv, size_t send_count,
                  DataType type, Comm comm, Stream stream) {
  return ::ncclAllGather(send, recv, send_count, ToNccl(type), comm, stream);
}

int ncclBroadcast(const void* send, void* recv, size_t count, DataType type,
                  int root, Comm comm, Stream stream) {
  return ::ncclBroadcast(send, recv, count, ToNccl(type), root, comm, stream);
}

int ncclAllReduce(const void* send, void* recv, size_t count, DataType type,
                  Comm comm, Stream stream) {
  return ::ncclAllReduce(send, recv, count, ToNccl(type), ncclSum, comm,
                         stream);
}

const char* ncclGetErrorString(int result) {
  return ::ncclGetErrorString(static_cast<ncclResult_t>(result));
}

const char* ncclGetLastError(Comm comm) { return ::ncclGetLastError(comm); }

int cudaGetDeviceCount(int* count) { return ::cudaGetDeviceCount(count); }
int cudaGetDevice(int* device) { return ::cudaGetDevice(device); }
int cudaSetDevice(int device) { return ::cudaSetDevice(device); }

int cudaStreamCreateWithFlags(Stream* stream, unsigned flags) {
  return ::cudaStreamCreateWithFlags(stream, flags);
}

int cudaStreamDestroy(Stream stream) { return ::cudaStreamDestroy(stream); }
int cudaStreamQuery(Stream stream) { return ::cudaStreamQuery(stream); }
int cudaMalloc(void** pointer, size_t bytes) {
  return ::cudaMalloc(pointer, bytes);
}
int cudaFree(void* pointer) { return ::cudaFree(pointer); }

int cudaMemsetAsync(void* pointer, int value, size_t bytes, Stream stream) {
  return ::cudaMemsetAsync(pointer, value, bytes, stream);
}

int cudaMemcpy(void* dst, const void* src, size_t bytes) {
  return ::cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
}

int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  return ::cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
}

int cudaDeviceSynchronize() { return ::cudaDeviceSynchronize(); }

const char* cudaGetErrorName(int error) {
  return ::cudaGetErrorName(static_cast<cudaError_t>(error));
}

const char* cudaGetErrorString(int error) {
  return ::cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace nccl_api
}  // namespace muon
