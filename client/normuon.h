// NorMuon (Li et al., "NorMuon: Making Muon more efficient and scalable",
// arXiv 2510.05491; microsoft/dion's NorMuon, whose rescale it follows) as
// an OwnerTransform: after Newton-Schulz each matrix's update O is
// normalized per row (neuron) by a second-moment estimate v, then rescaled
// to its Frobenius norm (kernels::NorMuonNormalize):
//   v_i <- lerp(v_i, mean_j O_ij^2, 1 - beta2)
//   O_ij <- O_ij / (sqrt(v_i) + eps)
//   O <- O * ||O_before||_F / max(||O||_F, eps)
// v is the row state "variance_neuron" (dion's name).
#ifndef MUON_CLIENT_NORMUON_H_
#define MUON_CLIENT_NORMUON_H_

#include <memory>

#include "client/owner_transform.h"

namespace muon {

// NorMuon's row state key in state_dict and checkpoints.
inline constexpr char kNorMuonRowState[] = "variance_neuron";

// `beta2` in [0, 1) and `eps` > 0, as MuonOptions::normuon_beta2 and
// normuon_eps (checked there, by ValidateMuonOptions).
std::shared_ptr<const OwnerTransform> MakeNorMuon(double beta2, double eps);

}  // namespace muon

#endif  // MUON_CLIENT_NORMUON_H_
