// Default (non-CUDA) build of the device API in kernels/cuda/*.h: every
// entry point returns Unimplemented("built without CUDA: build with
// --config=cuda") and BuiltWithCuda() is false, so code using the API links
// and fails clearly at run time. --config=cuda builds use the .cu files.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/muon_update_cuda.h"
#include "kernels/cuda/newton_schulz_cuda.h"

namespace muon {
namespace kernels {
namespace cuda {
namespace {

absl::Status NoCuda(const char* what) {
  return absl::UnimplementedError(
      absl::StrCat(what, ": built without CUDA: build with --config=cuda"));
}

}  // namespace

bool BuiltWithCuda() { return false; }

struct NsCudaContext::State {};

NsCudaContext::NsCudaContext(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
NsCudaContext::~NsCudaContext() = default;

absl::StatusOr<std::unique_ptr<NsCudaContext>> NsCudaContext::Create(
    device::Runtime*, device::Stream*, device::Allocator*) {
  return NoCuda("NsCudaContext::Create");
}

absl::Status NsCudaContext::Reserve(int64_t, int64_t, int64_t, GpuPrecision,
                                    const NewtonSchulzOptions&) {
  return NoCuda("NsCudaContext::Reserve");
}
int64_t NsCudaContext::ScratchBytes() const { return 0; }
const SymmetricProducts& NsCudaContext::symmetric_products() const {
  static const SymmetricProducts kDefault;
  return kDefault;
}
void NsCudaContext::set_symmetric_products(const SymmetricProducts&) {}
bool NsCudaContext::cuda_graphs() const { return false; }
void NsCudaContext::set_cuda_graphs(bool) {}
int NsCudaContext::CudaGraphCount() const { return 0; }
absl::Status NsCudaContext::cuda_graph_capture_error() const {
  return absl::OkStatus();
}
int NsCudaContext::device() const { return -1; }
device::Stream* NsCudaContext::stream() const { return nullptr; }

absl::Status NewtonSchulzBatched(NsCudaContext*, const float*, int64_t, int64_t,
                                 int64_t, const NewtonSchulzOptions&,
                                 GpuPrecision, float*) {
  return NoCuda("NewtonSchulzBatched");
}

absl::Status DenseGemm(NsCudaContext*, GpuPrecision, int64_t, int64_t, int64_t,
                       const void*, const void*, void*) {
  return NoCuda("DenseGemm");
}

absl::Status Momentum(void*, Elem, const void*, Elem, int64_t, double, FmaMode,
                      void*) {
  return NoCuda("Momentum");
}

absl::Status FormUpdate(const void*, Elem, const void*, Elem, int64_t, double,
                        bool, float*, FmaMode, void*) {
  return NoCuda("FormUpdate");
}

absl::Status FirstNonFinite(const float*, int64_t, int64_t*, void*) {
  return NoCuda("FirstNonFinite");
}

absl::Status FirstNonFiniteBf16(const uint16_t*, int64_t, int64_t*, void*) {
  return NoCuda("FirstNonFiniteBf16");
}

int64_t NorMuonScratchBytes(int64_t rows) {
  return rows <= 0 ? 0 : 2 * rows * 8 + 4;
}

absl::Status NorMuonNormalize(float*, int64_t, int64_t, float*, double, double,
                              void*, void*) {
  return NoCuda("NorMuonNormalize");
}

absl::Status DecayAndApply(float*, const float*, int64_t, double, double,
                           double, FmaMode, void*) {
  return NoCuda("DecayAndApply");
}

absl::Status DecayAndApplyBf16(uint16_t*, const float*, int64_t, double, double,
                               double, FmaMode, void*) {
  return NoCuda("DecayAndApplyBf16");
}

absl::Status PackBf16(const float*, int64_t, int64_t, int64_t, uint16_t*,
                      void*) {
  return NoCuda("PackBf16");
}

absl::Status RoundToBf16(float*, int64_t, void*) {
  return NoCuda("RoundToBf16");
}

absl::Status Scale(void*, Elem, int64_t, float, void*) {
  return NoCuda("Scale");
}

absl::Status UnpackBf16(const uint16_t*, int64_t, int64_t, float*, int64_t,
                        void*) {
  return NoCuda("UnpackBf16");
}

absl::Status CublasStatusToStatus(int cublas_status, const char* expr) {
  if (cublas_status == 0) return absl::OkStatus();
  return NoCuda(expr);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muon
