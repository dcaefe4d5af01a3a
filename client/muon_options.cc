#include "client/muon_options.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "common/status_macros.h"

namespace muon {

namespace {

// `v` as Python's repr(float) prints it (the shortest text that reads back
// as v; "1.0" not "1"; "nan", "inf"), so that messages read as torch's,
// which format the Python float.
std::string PythonFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string text;
  for (int digits = 1; digits <= 17; ++digits) {
    text = absl::StrFormat("%.*g", digits, v);
    if (std::strtod(text.c_str(), nullptr) == v) break;
  }
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

// The job spec's spelling of MuonOptions.device and gpu_precision
// (ExecutionOptions.device, .gpu_precision) merged into `options`: set in
// the execution options, each wins over MuonOptions' default and must
// agree with a value set there.
// Errors: InvalidArgument naming the field and both values.
absl::Status MergeExecutionDevice(const v1::ExecutionOptions& execution,
                                  MuonOptions* options) {
  MuonOptionNames names;
  names.device = execution.device();
  names.gpu_precision = execution.gpu_precision();
  MuonOptions spec = *options;
  if (absl::Status s = ApplyMuonOptionNames(names, &spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("execution.", s.message()));
  }
  const MuonOptions defaults;
  if (!names.device.empty() && options->device != defaults.device &&
      spec.device != options->device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "execution.device \"", names.device,
        "\" disagrees with MuonOptions.device (cuda); set one of them"));
  }
  if (!names.gpu_precision.empty() &&
      options->gpu_precision != defaults.gpu_precision &&
      spec.gpu_precision != options->gpu_precision) {
    return absl::InvalidArgumentError(absl::StrCat(
        "execution.gpu_precision \"", names.gpu_precision,
        "\" disagrees with MuonOptions.gpu_precision; set one of them"));
  }
  options->device = spec.device;
  options->gpu_precision = spec.gpu_precision;
  return absl::OkStatus();
}

std::atomic<bool> cuda_variants_allowed_for_testing{false};

// Whether a variant whose CUDA path has not yet run on a GPU is refused
// on `device` (CUDA, unless AllowCudaVariantsForTesting).
bool RefusesUntestedCudaVariant(const device::Device& device) {
  return device.is_cuda() && !cuda_variants_allowed_for_testing.load();
}

// NorMuon's row state is float32 and travels with the built-in exchange,
// on the host. Errors: InvalidArgument naming what it cannot run with.
absl::Status CheckNorMuon(const MuonOptions& o, bool bf16_exchange,
                          const OptionContext& context) {
  if (!o.normuon) return absl::OkStatus();
  if (bf16_exchange || context.custom_exchange) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", context.rank, ": normuon keeps its row state in float32 ",
        "and sends it with the built-in exchange: it cannot run with ",
        bf16_exchange ? "execution.exchange_dtype \"bfloat16\""
                      : "custom gather_fn / redistribute_fn"));
  }
  if (RefusesUntestedCudaVariant(context.device)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", context.rank,
        ": normuon runs on CPU parameters in this version; the parameters "
        "are on ",
        context.device.ToString()));
  }
  return absl::OkStatus();
}

// What overlap_backward cannot run with.
// Errors: InvalidArgument naming the option.
absl::Status CheckOverlap(const MuonOptions& o, const OptionContext& context) {
  std::string refused;
  if (o.transactional_step) {
    refused =
        "transactional_step (its snapshot precedes the momentum "
        "pass): set it to false";
  } else if (RefusesUntestedCudaVariant(context.device)) {
    refused = absl::StrCat("parameters on ", context.device.ToString(),
                           " (CPU parameters in this version)");
  }
  if (refused.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", context.rank,
                   ": execution.overlap_backward cannot run with ", refused));
}

}  // namespace

absl::Status ValidateLearningRate(double lr) {
  if (lr >= 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("Learning rate should be >= 0 but is: ", PythonFloat(lr)));
}

absl::Status ValidateMomentum(double momentum) {
  if (momentum >= 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("momentum should be >= 0 but is: ", PythonFloat(momentum)));
}

absl::Status ValidateWeightDecay(double weight_decay) {
  if (weight_decay >= 0.0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "weight decay should be >= 0 but is: ", PythonFloat(weight_decay)));
}

absl::Status ValidateMuonOptions(const MuonOptions& o) {
  // Messages follow torch.optim.Muon.__init__, in its order.
  MUON_RETURN_IF_ERROR(ValidateLearningRate(o.lr));
  MUON_RETURN_IF_ERROR(ValidateMomentum(o.momentum));
  MUON_RETURN_IF_ERROR(ValidateWeightDecay(o.weight_decay));
  if (o.ns_steps >= 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Number of steps must be less than 100 for computational efficiency "
        "but ns_steps is: ",
        o.ns_steps));
  }
  if (o.ns_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ns_steps should be >= 0 but is: ", o.ns_steps));
  }
  if (!(o.eps >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("eps should be >= 0 but is: ", PythonFloat(o.eps)));
  }
  MUON_RETURN_IF_ERROR(ValidateQkClipOptions(o.qk_clip));
  if (!(o.normuon_beta2 >= 0.0 && o.normuon_beta2 < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normuon_beta2 should be in [0, 1) but is: ",
                     PythonFloat(o.normuon_beta2)));
  }
  if (!(o.normuon_eps > 0.0 && std::isfinite(o.normuon_eps))) {
    return absl::InvalidArgumentError(
        absl::StrCat("normuon_eps should be a finite value > 0 but is: ",
                     PythonFloat(o.normuon_eps)));
  }
  return absl::OkStatus();
}

namespace {

// InvalidArgument: `option` "value" is not supported (use `choices`).
absl::Status UnsupportedName(const char* option, const std::string& value,
                             const char* choices) {
  return absl::InvalidArgumentError(absl::StrCat(
      option, " \"", value, "\" is not supported (use ", choices, ")"));
}

// ApplyMuonOptionNames' update-rule names: adjust_lr_fn, ns_schedule and
// ns_method, into *o.
absl::Status ApplyRuleNames(const MuonOptionNames& names, MuonOptions* o) {
  if (!names.adjust_lr_fn.empty()) {
    absl::StatusOr<kernels::AdjustLrFn> fn =
        kernels::ParseAdjustLrFn(names.adjust_lr_fn);
    // torch.optim.Muon.__init__'s message, with dion's spectral_norm.
    if (!fn.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Adjust learning rate function ", names.adjust_lr_fn,
          " is not supported (use \"original\", \"match_rms_adamw\" or "
          "\"spectral_norm\")"));
    }
    o->adjust_lr_fn = *fn;
  }
  if (!names.ns_schedule.empty()) {
    absl::StatusOr<kernels::CoefficientSchedule> schedule =
        kernels::ParseCoefficientScheduleName(names.ns_schedule);
    if (!schedule.ok()) {
      return UnsupportedName("ns_schedule", names.ns_schedule,
                             "\"quintic\" or \"polar_express\"");
    }
    o->ns_schedule = *schedule;
  }
  if (!names.ns_method.empty()) {
    absl::StatusOr<kernels::NewtonSchulzMethod> method =
        kernels::ParseNewtonSchulzMethod(names.ns_method);
    if (!method.ok()) {
      return UnsupportedName("ns_method", names.ns_method,
                             "\"standard\", \"gram\" or \"auto\"");
    }
    o->ns_method = *method;
  }
  return absl::OkStatus();
}

// ApplyMuonOptionNames' device and dtype names: device, gpu_precision and
// momentum_dtype, into *o.
absl::Status ApplyDeviceNames(const MuonOptionNames& names, MuonOptions* o) {
  if (!names.device.empty()) {
    if (names.device != "cpu" && names.device != "cuda") {
      return UnsupportedName("device", names.device, "\"cpu\" or \"cuda\"");
    }
    o->device = names.device == "cuda" ? device::DeviceKind::kCuda
                                       : device::DeviceKind::kHost;
  }
  if (!names.gpu_precision.empty()) {
    absl::StatusOr<kernels::GpuPrecision> precision =
        kernels::ParseGpuPrecision(names.gpu_precision);
    if (!precision.ok()) {
      return UnsupportedName("gpu_precision", names.gpu_precision,
                             "\"bf16\", \"tf32\" or \"fp32\"");
    }
    o->gpu_precision = *precision;
  }
  if (!names.momentum_dtype.empty()) {
    const std::string& d = names.momentum_dtype;
    if (d == "param") {
      o->momentum_dtype = MomentumDType::kParam;
    } else if (d == "float32") {
      o->momentum_dtype = MomentumDType::kFloat32;
    } else if (d == "bfloat16") {
      o->momentum_dtype = MomentumDType::kBFloat16;
    } else {
      return UnsupportedName("momentum_dtype", d,
                             "\"param\", \"float32\" or \"bfloat16\"");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyMuonOptionNames(const MuonOptionNames& names,
                                  MuonOptions* options) {
  MuonOptions o = *options;
  MUON_RETURN_IF_ERROR(ApplyRuleNames(names, &o));
  MUON_RETURN_IF_ERROR(ApplyDeviceNames(names, &o));
  *options = o;
  return absl::OkStatus();
}

absl::StatusOr<MuonOptions> MuonOptionsFromProto(
    const v1::OptimizerOptions& p) {
  MuonOptions o;
  if (p.has_lr()) o.lr = p.lr();
  if (p.has_weight_decay()) o.weight_decay = p.weight_decay();
  if (p.has_momentum()) o.momentum = p.momentum();
  if (p.has_nesterov()) o.nesterov = p.nesterov();
  if (p.ns_coefficients_size() == 3) {
    o.ns_a = p.ns_coefficients(0);
    o.ns_b = p.ns_coefficients(1);
    o.ns_c = p.ns_coefficients(2);
  }
  if (p.has_eps()) o.eps = p.eps();
  if (p.has_ns_steps()) o.ns_steps = p.ns_steps();
  if (p.has_normuon()) o.normuon = p.normuon();
  if (p.has_normuon_beta2()) o.normuon_beta2 = p.normuon_beta2();
  if (p.has_normuon_eps()) o.normuon_eps = p.normuon_eps();
  if (p.has_qk_clip()) o.qk_clip = QkClipOptionsFromProto(p.qk_clip());
  if (p.has_check_finite()) o.check_finite = p.check_finite();
  if (p.has_transactional_step()) {
    o.transactional_step = p.transactional_step();
  }
  MuonOptionNames names;
  names.adjust_lr_fn = p.adjust_lr_fn();
  names.ns_schedule = p.ns_schedule();
  names.ns_method = p.ns_method();
  names.momentum_dtype = p.momentum_dtype();
  MUON_RETURN_IF_ERROR(ApplyMuonOptionNames(names, &o));
  return o;
}

bool AllowCudaVariantsForTesting(bool allowed) {
  return cuda_variants_allowed_for_testing.exchange(allowed);
}

absl::Status CheckQkClipDevice(const QkClipOptions& qk_clip,
                               const OptionContext& context) {
  if (!qk_clip.enabled() || !RefusesUntestedCudaVariant(context.device)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank ", context.rank,
      ": qk_clip scales rows of CPU parameters in this version; the "
      "parameters are on ",
      context.device.ToString()));
}

absl::StatusOr<MuonOptions> ResolveOptions(
    const MuonOptions& options, const v1::ExecutionOptions& execution,
    const OptionContext& context) {
  MUON_RETURN_IF_ERROR(ValidateMuonOptions(options));
  const std::string rank = absl::StrCat("rank ", context.rank, ": ");
  MuonOptions resolved = options;
  absl::Status execution_ok = ValidateExecutionOptions(execution);
  if (execution_ok.ok()) {
    execution_ok = MergeExecutionDevice(execution, &resolved);
  }
  if (!execution_ok.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(rank, execution_ok.message()));
  }
  const bool bf16_exchange = ExchangeIsBf16(execution);
  if (bf16_exchange && context.custom_exchange) {
    return absl::InvalidArgumentError(absl::StrCat(
        rank,
        "execution.exchange_dtype \"bfloat16\" applies to the built-in "
        "exchange; custom gather_fn / redistribute_fn carry float32 (leave "
        "exchange_dtype empty or \"float32\")"));
  }
  MUON_RETURN_IF_ERROR(CheckNorMuon(options, bf16_exchange, context));
  MUON_RETURN_IF_ERROR(CheckQkClipDevice(options.qk_clip, context));
  if (context.device.is_cuda() && context.custom_exchange) {
    return absl::InvalidArgumentError(absl::StrCat(
        rank, "custom gather_fn / redistribute_fn take host memory; the ",
        "parameters are on ", context.device.ToString(),
        ", which the process group exchanges"));
  }
  if (execution.overlap_backward()) {
    MUON_RETURN_IF_ERROR(CheckOverlap(options, context));
  }
  // Unset: on, except under overlap_backward, where it costs a snapshot of
  // parameters and state (the step begins before every gradient is known).
  if (!resolved.check_finite.has_value()) {
    resolved.check_finite = !execution.overlap_backward();
  }
  return resolved;
}

}  // namespace muon
