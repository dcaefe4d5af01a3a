#include "client/normuon.h"

#include <string>
#include <utility>
#include <vector>

namespace muon {
namespace {

class NorMuon final : public OwnerTransform {
 public:
  NorMuon(double beta2, double eps) : beta2_(beta2), eps_(eps) {}

  std::string name() const override { return "normuon"; }

  RowStateSpec row_state() const override {
    return RowStateSpec{kNorMuonRowState};
  }

  std::vector<std::pair<std::string, double>> params() const override {
    return {{"beta2", beta2_}, {"eps", eps_}};
  }

  absl::Status Apply(kernels::StepKernels& kernels, device::Stream* stream,
                     float* o, int64_t rows, int64_t cols,
                     float* v) const override {
    return kernels.NorMuonNormalize(stream, o, rows, cols, v, beta2_, eps_);
  }

 private:
  const double beta2_;
  const double eps_;
};

}  // namespace

std::shared_ptr<const OwnerTransform> MakeNorMuon(double beta2, double eps) {
  return std::make_shared<NorMuon>(beta2, eps);
}

}  // namespace muon
