// The optimizer's options: torch.optim.Muon's constructor arguments and
// this runtime's own (MuonOptions), their spellings (MuonOptionNames), the
// job spec's proto form (MuonOptionsFromProto), and ResolveOptions, which
// makes every check across options, the parameters' device and the
// execution options once, with one message each, before any collective.
#ifndef MUON_CLIENT_MUON_OPTIONS_H_
#define MUON_CLIENT_MUON_OPTIONS_H_

#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/qk_clip.h"
#include "device/device.h"
#include "kernels/muon_update.h"
#include "kernels/newton_schulz.h"
#include "kernels/ns_engine.h"
#include "muon/v1/coordinator.pb.h"

namespace muon {

// The dtype of the momentum buffers (MuonOptions::momentum_dtype).
enum class MomentumDType {
  kParam,     // "param": each parameter's own dtype, as torch.optim.Muon
  kFloat32,   // "float32"
  kBFloat16,  // "bfloat16"
};

// torch.optim.Muon's constructor arguments, with its defaults.
struct MuonOptions {
  double lr = 1e-3;           // >= 0
  double weight_decay = 0.1;  // >= 0, decoupled, with the unadjusted lr
  double momentum = 0.95;     // >= 0
  bool nesterov = true;
  // The momentum buffer's dtype. kParam (default): the parameter's, as
  // torch.optim.Muon keeps it (torch.zeros_like(grad)): 2 bytes per
  // parameter for bf16 parameters, 4 for fp32. Each momentum step is then
  // computed in fp32 and rounded to nearest even (torch's bf16 lerp_).
  // kFloat32 keeps a bf16 parameter's momentum in fp32: 2 more bytes per
  // parameter, and the buffer no longer loses the low bits of every
  // (1 - momentum) * grad increment (torch's bf16 buffer does: with
  // momentum 0.95 an increment below 2^-9 of the buffer's magnitude
  // vanishes). Nesterov's U is formed per bucket in fp32 either way (no
  // persistent buffer). Checkpoints and state_dict carry the values as
  // fp32 (a bf16 buffer widened exactly) and load into either dtype.
  MomentumDType momentum_dtype = MomentumDType::kParam;
  // Newton-Schulz (a, b, c): Keller Jordan's quintic.
  double ns_a = 3.4445, ns_b = -4.7750, ns_c = 2.0315;
  double eps = 1e-7;  // Frobenius-norm floor before NS
  int ns_steps = 5;   // < 100, as torch
  // kOriginal ("original"): lr*sqrt(max(1, rows/cols));
  // kMatchRmsAdamW ("match_rms_adamw"): lr*0.2*sqrt(max(rows, cols));
  // kSpectralNorm ("spectral_norm", dion's default): lr*sqrt(rows/cols).
  // On the global shape of the matrix (of an expert slice).
  kernels::AdjustLrFn adjust_lr_fn = kernels::AdjustLrFn::kOriginal;
  // Newton-Schulz coefficient schedule: kQuintic ((ns_a, ns_b, ns_c) for
  // ns_steps iterations) or kPolarExpress (Amsel et al. 2025,
  // per-iteration coefficients; ns_steps and the coefficients are ignored).
  kernels::CoefficientSchedule ns_schedule =
      kernels::CoefficientSchedule::kQuintic;
  // Newton-Schulz evaluation (kernels::NewtonSchulzMethod): "standard"
  // (torch's order) or "gram" (Gram Newton-Schulz, Dao AI Lab 2026:
  // iterates on the m x m Gram matrix, restarting every 2 iterations; fewer
  // FLOPs when max(rows, cols) is several times min(rows, cols); fp32 error
  // against float64 within 2e-5 Frobenius, docs/benchmarks.md) or "auto"
  // (per matrix, whichever executes fewer FLOPs: gram once the long side
  // exceeds twice the short one, kernels::ResolveNewtonSchulzMethod). The
  // same on every rank, so distributed results still equal single-device
  // ones. On a GPU (CUDA parameters, or device kCuda) every product is a
  // full cuBLAS GEMM, so auto picks gram once the long side exceeds 1.5
  // times the short one (kernels/cuda/ns_gemm_plan.h, GpuRunsGram).
  kernels::NewtonSchulzMethod ns_method =
      kernels::NewtonSchulzMethod::kStandard;
  // For CPU parameters, where this rank's owned matrices are
  // orthogonalized: kHost (OpenBLAS fp32) or kCuda (cuBLAS on
  // `cuda_device`, host-staged: parameters, momentum and collectives stay
  // on the host, e.g. an optimizer offloaded to CPU memory that still uses
  // a GPU for Newton-Schulz, or several ranks sharing one GPU). Parameters
  // on a CUDA device run the whole step on that device, whatever these
  // two say.
  device::DeviceKind device = device::DeviceKind::kHost;
  int cuda_device = 0;
  // GPU arithmetic of Newton-Schulz: kBf16 (bf16 in, fp32 accumulate, as
  // torch.optim.Muon), kTf32 or kFp32. For CUDA parameters kFp32 also
  // rounds every multiply and add of the elementwise kernels separately
  // (the CPU kernels' bits); the others use fused multiply-adds (torch's
  // CUDA kernels).
  kernels::GpuPrecision gpu_precision = kernels::GpuPrecision::kBf16;
  // Checks every gradient for NaN/Inf before the step changes anything
  // (a read-only scan, kernels::FirstNonFinite, then a one-float-per-rank
  // all-gather of the result on the step's communicator when the world is
  // larger than one, so that every rank fails the step together). On a
  // non-finite value Step returns FailedPrecondition and parameters and
  // momentum stay unchanged on every rank. Off: NaN/Inf propagate as in
  // torch.optim.Muon. Unset (the default): on, except with
  // ExecutionOptions.overlap_backward, whose exchanges start before the
  // last gradient exists (ResolveOptions). Set true with overlap_backward:
  // each gradient is scanned at its MarkReady, the ranks agree at Step,
  // and a step with a bad gradient on any rank is undone from a snapshot
  // of parameters and momentum taken at the step's first MarkReady (the
  // snapshot's memory: one more copy of both, as transactional_step's).
  std::optional<bool> check_finite;
  // All-or-nothing steps: when a step fails on any rank (this rank's own
  // error, a collective that fails because another rank failed or aborted,
  // or another rank's failure after the last data collective), Step
  // restores this rank's parameters (in their own dtype), momentum buffers
  // and step count bit for bit before returning the error, on every rank.
  // Mechanism: a snapshot taken after the preflight checks and before the
  // momentum pass, and a commit agreement at the end of the step (after the
  // parameters are updated, before the step counts): the same
  // one-float-per-rank all-gather check_finite uses, of each rank's "my
  // step succeeded" flag. A rank whose data path (the executor's
  // collectives) failed skips the agreement; the other ranks' agreement
  // then fails (the coordinator aborts it, or the communicator's timeout)
  // and they restore too. After a rollback agreed through the commit the
  // ranks are still in step and may step again; after a failed collective
  // the process group is usually aborted (restart the job), but no rank
  // keeps a partial step.
  // Memory (preallocated at Create, on the parameters' device), in bytes:
  //   sum over this rank's parameters i of
  //     local_numel(i) * (DTypeSize(dtype(i)) + momentum dtype size)
  // i.e. a copy of each local shard in its own dtype (4 bytes fp32, 2
  // bf16) plus a copy of its momentum buffer, plus 8 for the step count
  // (OptimizerMemory::snapshot_bytes). (Nesterov's U is recomputed every
  // step: not saved.)
  // Time: one copy of those bytes per step (the save; a failed step copies
  // them back) and one more one-float all-gather per step when the world is
  // larger than one.
  // Window not covered: the commit all-gather itself returning OK on some
  // ranks and an error on others (a rank dies or is aborted while the
  // all-gather completes); those that saw OK keep the step, the others
  // restore, and the world must restart from a checkpoint.
  bool transactional_step = false;
  // NorMuon (Li et al., arXiv 2510.05491; microsoft/dion's NorMuon, whose
  // rescale it follows): after Newton-Schulz, on the owner, each matrix's
  // update O is normalized per row (neuron) by a second-moment estimate v
  // (kernels::NorMuonNormalize):
  //   v_i <- lerp(v_i, mean_j O_ij^2, 1 - normuon_beta2)
  //   O_ij <- O_ij / (sqrt(v_i) + normuon_eps)
  //   O <- O * ||O_before||_F / max(||O||_F, normuon_eps)
  // then applied with AdjustLR as usual. v (fp32, one per row of every
  // matrix, zeros at first) is sharded with the parameter's rows (a rank
  // keeps the rows it holds: all of them under Shard(1)), travels to the
  // owner with the gather and back with the redistribute, and is saved as
  // "variance_neuron" in state_dict and checkpoints (resharded on load like
  // the momentum). Every rank must agree (checked in the manifests). CPU
  // parameters, the float32 built-in exchange.
  bool normuon = false;
  double normuon_beta2 = 0.95;  // in [0, 1)
  double normuon_eps = 1e-8;    // > 0
  // QK-clip (MuonClip; client/qk_clip.h): the attention layers whose query
  // and key rows Muon::ClipQk scales; no layers = off. Every parameter a
  // layer names must be 2-D and fit its heads; on CPU parameters.
  QkClipOptions qk_clip;
};

// The learning rate, momentum and weight decay checks of
// torch.optim.Muon.__init__ (also for one parameter's values,
// Muon::SetParamHyperparameters), with its messages ("Learning rate should be
// >= 0 but is: -0.5", the value as Python prints a float). Errors:
// InvalidArgument.
absl::Status ValidateLearningRate(double lr);
absl::Status ValidateMomentum(double momentum);
absl::Status ValidateWeightDecay(double weight_decay);

// Checks `options` as torch.optim.Muon.__init__ does.
// Errors: InvalidArgument naming the argument and its value.
absl::Status ValidateMuonOptions(const MuonOptions& options);

// MuonOptions' enum options as their users spell them: torch's arguments,
// the job spec's fields, the C ABI's strings. Parsed once, by
// ApplyMuonOptionNames; empty = keep the value already in the options.
struct MuonOptionNames {
  // "original" | "match_rms_adamw" | "spectral_norm"
  std::string adjust_lr_fn;
  std::string ns_schedule;     // "quintic" | "polar_express"
  std::string ns_method;       // "standard" | "gram" | "auto"
  std::string device;          // "cpu" | "cuda"
  std::string gpu_precision;   // "bf16" | "tf32" | "fp32"
  std::string momentum_dtype;  // "param" | "float32" | "bfloat16"
};

// Sets the options `names` spells into `options`.
// Errors: InvalidArgument naming the option and value, for adjust_lr_fn in
//   torch's words ("Adjust learning rate function X is not supported"),
//   else `ns_method "Gram" is not supported (use "standard", "gram" or
//   "auto")`; `options` is then unchanged.
absl::Status ApplyMuonOptionNames(const MuonOptionNames& names,
                                  MuonOptions* options);

// Reads optimizer options from the job spec's proto (unset = default).
// Errors: as ApplyMuonOptionNames.
absl::StatusOr<MuonOptions> MuonOptionsFromProto(
    const v1::OptimizerOptions& proto);

// The options ResolveOptions refuses with CUDA parameters in this version,
// each by its name ("... CPU parameters in this version"): NorMuon,
// QK-clip and the step during backward. The docs mark each such feature
// with a "<!-- cpu-only: NAME -->" comment, which tests/python/test_docs.py
// compares with this list.
inline constexpr std::array<const char*, 3> kCpuOnlyOptions = {
    "normuon", "qk_clip", "overlap_backward"};

// Where the options run, for ResolveOptions.
struct OptionContext {
  device::Device device;         // The parameters' device.
  int rank = 0;                  // This rank (in messages).
  bool custom_exchange = false;  // DistributedConfig gather_fn/redistribute_fn.
};

// Test-only, process-wide (off by default): lets ResolveOptions and
// CheckQkClipDevice accept normuon, qk_clip and overlap_backward with CUDA
// parameters, whose device paths (NorMuon's CUDA kernel as the owner
// transform; ClipQkOnStream; MarkReadyOnStream) are written but have not
// yet run on a GPU, so that the GPU tests can run them against the host
// and the step without overlap. Not for trainers: the refusals stay until
// those tests have passed on a GPU. Returns the value before.
bool AllowCudaVariantsForTesting(bool allowed);

// AllowCudaVariantsForTesting(true) for the object's lifetime (a test's),
// then the value before it.
class ScopedCudaVariantsForTesting {
 public:
  ScopedCudaVariantsForTesting() : before_(AllowCudaVariantsForTesting(true)) {}
  ~ScopedCudaVariantsForTesting() { AllowCudaVariantsForTesting(before_); }
  ScopedCudaVariantsForTesting(const ScopedCudaVariantsForTesting&) = delete;
  ScopedCudaVariantsForTesting& operator=(const ScopedCudaVariantsForTesting&) =
      delete;

 private:
  const bool before_;
};

// QK-clip with layers on CUDA parameters: refused (InvalidArgument naming
// the rank and device) until its CUDA row scaling (StepKernels::Scale) has
// run on a GPU; OK otherwise. Muon::Create (through ResolveOptions) and
// Muon::SetQkClip check it.
absl::Status CheckQkClipDevice(const QkClipOptions& qk_clip,
                               const OptionContext& context);

// `options` checked against each other, the execution options and
// `context`, with the defaults that depend on them filled in: every check
// across options made once, on every rank alike, before any collective
// (Muon::Create). In order:
//   - ValidateMuonOptions (torch.optim.Muon.__init__'s messages);
//   - `execution` (ValidateExecutionOptions); its device and gpu_precision
//     (the job spec's spelling) become MuonOptions.device and gpu_precision,
//     which, set to another value there, is refused;
//   - execution.exchange_dtype "bfloat16" with a custom exchange;
//   - normuon with the bf16 or a custom exchange, or on CUDA parameters;
//   - qk_clip with layers on CUDA parameters;
//   - a custom exchange with CUDA parameters;
//   - overlap_backward with transactional_step, or parameters off the
//     host;
// then check_finite unset becomes !execution.overlap_backward() (set true
// under overlap_backward, it keeps a snapshot of parameters and state).
// Errors: InvalidArgument naming the options and values ("rank R: ..."
//   after ValidateMuonOptions' torch messages).
absl::StatusOr<MuonOptions> ResolveOptions(
    const MuonOptions& options, const v1::ExecutionOptions& execution,
    const OptionContext& context);

}  // namespace muon

#endif  // MUON_CLIENT_MUON_OPTIONS_H_
