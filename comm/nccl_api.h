// nccl_api: the NCCL and CUDA runtime calls NcclCommunicator makes, behind a
// plain C++ header that includes no CUDA header.
//
// Why: Bazel 4.2.3 rejects a gcc-compiled source that includes headers from
// /usr/local/cuda/include ("include path ... references a path outside of
// the execution root", then "undeclared inclusion(s)"), so the one
// translation unit that includes nccl.h and cuda_runtime.h (nccl_api.cc) is
// compiled by a genrule and linked as an object (client/BUILD.bazel,
// :nccl_api, built only with --config=cuda). Everything else, including
// nccl_communicator.cc and its tests, sees only this header.
//
// Each function forwards to the NCCL/CUDA function of the same name
// (deliberately not Google-style names, so that the expression text kept in
// error messages names the real API) and returns that function's result
// code as an int: ncclResult_t for nccl*, cudaError_t for cuda*. The
// constants below mirror the codes this project tests for; nccl_api.cc
// static_asserts that they match the headers it was compiled against
// (NCCL 2.28, CUDA 13).
//
// Thread-safety: as the wrapped functions (NCCL and the CUDA runtime are
// thread-safe; a communicator must not be used by two threads at once).
#ifndef MUON_COMM_NCCL_API_H_
#define MUON_COMM_NCCL_API_H_

#include <cstddef>

// NCCL's and CUDA's opaque handle types, declared exactly as nccl.h
// (typedef struct ncclComm* ncclComm_t) and driver_types.h
// (typedef struct CUstream_st* cudaStream_t) declare them.
struct ncclComm;
struct CUstream_st;

namespace muon {
namespace nccl_api {

using Comm = ::ncclComm*;       // ncclComm_t
using Stream = ::CUstream_st*;  // cudaStream_t

// ncclResult_t values.
constexpr int kNcclSuccess = 0;
constexpr int kNcclUnhandledCudaError = 1;
constexpr int kNcclSystemError = 2;
constexpr int kNcclInternalError = 3;
constexpr int kNcclInvalidArgument = 4;
constexpr int kNcclInvalidUsage = 5;
constexpr int kNcclRemoteError = 6;
constexpr int kNcclInProgress = 7;
// NCCL_SPLIT_NOCOLOR.
constexpr int kNcclSplitNoColor = -1;

// cudaError_t values.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorInsufficientDriver = 35;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorNotReady = 600;
// cudaStreamNonBlocking.
constexpr unsigned kCudaStreamNonBlocking = 1;

// NCCL_UNIQUE_ID_BYTES and ncclUniqueId.
constexpr int kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

// The ncclConfig_t fields this project sets; the rest keep
// NCCL_CONFIG_INITIALIZER's defaults.
struct Config {
  // config.blocking: 0 makes every call return at once (ncclInProgress
  // while work continues) so that callers can bound it.
  int blocking = 1;
  // config.commName (shown in NCCL's logs); may be null. Must outlive the
  // call.
  const char* comm_name = nullptr;
};

// ncclDataType_t values used here.
enum class DataType { kFloat32, kInt32 };

// NCCL (nccl.h). ncclAllReduce always sums (ncclSum).
int ncclGetVersion(int* version);
int ncclGetUniqueId(UniqueId* id);
int ncclCommInitRankConfig(Comm* comm, int nranks, const UniqueId& id, int rank,
                           const Config& config);
int ncclCommSplit(Comm comm, int color, int key, Comm* newcomm,
                  const Config& config);
int ncclCommGetAsyncError(Comm comm, int* async_error);
int ncclCommCount(Comm comm, int* count);
int ncclCommUserRank(Comm comm, int* rank);
int ncclCommFinalize(Comm comm);
int ncclCommDestroy(Comm comm);
int ncclCommAbort(Comm comm);
int ncclGroupStart();
int ncclGroupEnd();
int ncclSend(const void* buffer, size_t count, DataType type, int peer,
             Comm comm, Stream stream);
int ncclRecv(void* buffer, size_t count, DataType type, int peer, Comm comm,
             Stream stream);
int ncclAllGather(const void* send, void* recv, size_t send_count,
                  DataType type, Comm comm, Stream stream);
int ncclBroadcast(const void* send, void* recv, size_t count, DataType type,
                  int root, Comm comm, Stream stream);
int ncclAllReduce(const void* send, void* recv, size_t count, DataType type,
                  Comm comm, Stream stream);
const char* ncclGetErrorString(int result);
const char* ncclGetLastError(Comm comm);

// CUDA runtime (cuda_runtime_api.h). The memcpy functions use
// cudaMemcpyDefault (direction from the pointers, unified addressing).
int cudaGetDeviceCount(int* count);
int cudaGetDevice(int* device);
int cudaSetDevice(int device);
int cudaStreamCreateWithFlags(Stream* stream, unsigned flags);
int cudaStreamDestroy(Stream stream);
int cudaStreamQuery(Stream stream);
int cudaMalloc(void** pointer, size_t bytes);
int cudaFree(void* pointer);
int cudaMemsetAsync(void* pointer, int value, size_t bytes, Stream stream);
// Note: from pageable host memory cudaMemcpy may return before the DMA to
// the device is done, and it does not order with work on a
// non-blocking stream: use the Async forms on that stream, or
// cudaDeviceSynchronize, before such work reads the bytes.
int cudaMemcpy(void* dst, const void* src, size_t bytes);
int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, Stream stream);
int cudaDeviceSynchronize();
const char* cudaGetErrorName(int error);
const char* cudaGetErrorString(int error);

}  // namespace nccl_api
}  // namespace muon

#endif  // MUON_COMM_NCCL_API_H_
