// muon::Muon: torch.optim.Muon for C++, on one device or with parameters
// sharded over ranks (FSDP, DDP, ...).
//
// Single device (no DistributedConfig): per step and per 2-D parameter W
// with gradient G and momentum buffer B (torch.optim.Muon, PyTorch 2.9+):
//   B <- B.lerp(G, 1 - momentum)
//   U <- nesterov ? G.lerp(B, momentum) : B
//   O <- NS_k(U)                      (kernels/newton_schulz.h)
//   W <- W * (1 - lr * weight_decay)
//   W <- W - AdjustLR(lr, shape) * O
// Distributed: the same numbers (bitwise, in fp32) with each matrix
// orthogonalized exactly once in the world, by its owner rank (see
// client/step_executor.h); momentum buffers stay sharded like the
// parameters, so a checkpoint saves and restores per rank.
//
// Lifecycle: Create (validates arguments; in distributed mode joins the job
// through the coordinator and receives the plan) -> [fill grads, Step]* .
// Thread-compatible.
#ifndef MUON_CLIENT_MUON_H_
#define MUON_CLIENT_MUON_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/agent.h"
#include "client/communicator.h"
#include "client/distributed_config.h"
#include "client/parameter.h"
#include "client/step_executor.h"
#include "kernels/ns_engine.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// torch.optim.Muon's constructor arguments, with its defaults.
struct MuonOptions {
  double lr = 1e-3;            // >= 0
  double weight_decay = 0.1;   // >= 0, decoupled, with the unadjusted lr
  double momentum = 0.95;      // >= 0
  bool nesterov = true;
  // Newton-Schulz (a, b, c): Keller Jordan's quintic.
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  double eps = 1e-7;           // Frobenius-norm floor before NS
  int ns_steps = 5;            // < 100, as torch
  // "original": lr*sqrt(max(1, rows/cols));
  // "match_rms_adamw": lr*0.2*sqrt(max(rows, cols)).
  std::string adjust_lr_fn = "original";
  // Newton-Schulz coefficient schedule: "quintic" ((ns_a, ns_b, ns_c) for
  // ns_steps iterations) or "polar_express" (Amsel et al. 2025,
  // per-iteration coefficients; ns_steps and the coefficients are ignored).
  std::string ns_schedule = "quintic";
  // Where this rank's owned matrices are orthogonalized: "cpu" (OpenBLAS
  // fp32) or "cuda" (cuBLAS on `cuda_device`, host-staged: parameters and
  // collectives stay on the host, so several ranks may share one GPU).
  std::string device = "cpu";
  int cuda_device = 0;
  // GPU arithmetic: "bf16" (bf16 in, fp32 accumulate), "tf32" or "fp32".
  std::string gpu_precision = "bf16";
};

// Checks `options` as torch.optim.Muon.__init__ does.
// Errors: InvalidArgument naming the argument and its value.
absl::Status ValidateMuonOptions(const MuonOptions& options);

// Reads optimizer options from the job spec's proto (unset = default).
MuonOptions MuonOptionsFromProto(const v1::OptimizerOptions& proto);

class Muon {
 public:
  // `params` are not owned and must outlive the optimizer; their data and
  // grad vectors must not be resized afterwards.
  // Errors (all raised before any collective, with nothing modified):
  //   InvalidArgument: an option out of range (names it and its value); a
  //     parameter that is not 2-D (names it and its shape); data size not
  //     matching local_shape; placements that do not fit the mesh; a custom
  //     assign_fn with a missing, duplicated or out-of-range owner (names
  //     the parameter and the ranks); manifests that disagree across ranks
  //     (from the coordinator, the same error on every rank).
  //   DeadlineExceeded / Unavailable: the coordinator or other ranks did
  //     not answer in time.
  static absl::StatusOr<std::unique_ptr<Muon>> Create(
      std::vector<Parameter*> params, const MuonOptions& options = {},
      std::optional<DistributedConfig> distributed_config = std::nullopt);

  ~Muon();

  // One optimizer step over every parameter.
  // Errors: FailedPrecondition when a gradient is missing or has the wrong
  // size (names the parameter and rank; raised before any collective, with
  // parameters and state untouched); communicator errors.
  absl::Status Step();

  // Clears every gradient to zero (keeps sizes).
  void ZeroGrad();

  // The plan (owners, buckets, loads, hash) this optimizer runs.
  const v1::Plan& plan() const { return plan_; }
  // rank -> indices of this rank's matrices that it orthogonalizes (seeds'
  // optimizer.assignments). Indices are parameter indices when every
  // parameter is 2-D; with expert stacks, positions in matrices().
  // Matrices of parameters other ranks hold (other pipeline stages) are not
  // listed.
  std::map<int, std::vector<int>> assignments() const;
  // This rank's matrices in order: a 2-D parameter is one, a stack one per
  // expert slice (what an assign_fn sees).
  const std::vector<MatrixInfo>& matrices() const { return matrices_; }
  int current_rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Counters and timings of the last Step on this rank.
  const StepStats& last_step_stats() const { return stats_; }
  int64_t step_count() const { return step_; }
  // Momentum buffer of parameter i (local shard; zeros before the first
  // step).
  const std::vector<float>& momentum_buffer(int i) const { return buffers_[i]; }
  const MuonOptions& options() const { return options_; }
  // The agent when a coordinator is configured, else nullptr.
  Agent* agent() { return agent_.get(); }

 private:
  Muon() = default;

  std::vector<Parameter*> params_;  // Not owned.
  MuonOptions options_;
  UpdateRule rule_;
  int rank_ = 0;
  int world_size_ = 1;
  v1::Plan plan_;
  std::unique_ptr<Communicator> owned_comm_;  // world of one, if needed
  std::unique_ptr<kernels::NsEngine> ns_engine_;
  std::unique_ptr<Agent> agent_;
  std::unique_ptr<StepExecutor> executor_;
  std::vector<std::vector<float>> buffers_;  // momentum, local shards
  std::vector<std::vector<float>> nesterov_;  // U when nesterov, local
  std::vector<const float*> update_ptrs_;
  std::vector<float*> param_ptrs_;
  std::vector<MatrixInfo> matrices_;
  StepStats stats_;
  int64_t step_ = 0;
};

}  // namespace muon

#endif  // MUON_CLIENT_MUON_H_
