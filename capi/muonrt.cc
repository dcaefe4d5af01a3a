// The C ABI of capi/muonrt.h over muon::Muon, muon::InitProcessGroup and
// muon::CreateMeshConfig.
//
// Every entry point runs its body through Guard: a C++ exception never
// crosses the boundary (it becomes MUONRT_INTERNAL with its message), an
// error status becomes its absl::StatusCode value and the thread's last
// error message, and success clears that message. Every pointer and size
// from the caller is checked before it is read (INVALID_ARGUMENT naming the
// argument, the parameter and the value).
#include "capi/muonrt.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/distributed_config.h"
#include "client/muon.h"
#include "client/tensor_view.h"
#include "common/checked_math.h"
#include "common/layout.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "control/agent.h"
#include "control/process_group.h"
#include "google/protobuf/map.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/blas_tiles.h"
#include "server/embedded_coordinator.h"

struct muonrt_process_group {
  std::unique_ptr<muon::ProcessGroup> pg;
  absl::Duration timeout;  // rendezvous, join and collectives
};

struct muonrt_optimizer {
  // Holds raw pointers to its process group's communicator and coordinator
  // (not owned): destroyed before the group (see the header).
  std::unique_ptr<muon::Muon> muon;
  // Host copies of the momentum buffers muonrt_optimizer_momentum handed
  // out (one per parameter, sized once: the pointers stay valid).
  std::vector<std::vector<float>> momentum_copies;
  // The same for muonrt_optimizer_row_state.
  std::vector<std::vector<float>> row_state_copies;
  // The row state's name muonrt_optimizer_row_state hands out ("" without
  // a variant); set at creation, so the pointer stays valid.
  std::string row_state_name;
};

namespace {

// Largest ndim accepted before the shape arrays are read (Muon itself takes
// 2 or 3; anything up to this bound reaches its own, more precise, message).
constexpr int kMaxNdim = 8;
// Largest element count of one tensor (its momentum buffer, up to fp32, must be
// addressable in bytes).
constexpr int64_t kMaxNumel = std::numeric_limits<int64_t>::max() / 8;

thread_local std::string last_error;

void SetLastError(const absl::Status& s) {
  last_error = s.ok() ? std::string() : std::string(s.message());
}

// Runs `body` (returning absl::Status) at the ABI boundary: maps the status
// to its code and the last error; exceptions become INTERNAL.
template <typename Body>
int Guard(const char* function, Body&& body) {
  absl::Status s;
  try {
    s = body();
  } catch (const std::bad_alloc& e) {
    s = absl::InternalError(
        absl::StrCat(function, ": out of memory (", e.what(), ")"));
  } catch (const std::exception& e) {
    s = absl::InternalError(
        absl::StrCat(function, ": unexpected C++ exception: ", e.what()));
  } catch (...) {
    s = absl::InternalError(
        absl::StrCat(function, ": unexpected non-standard C++ exception"));
  }
  try {
    SetLastError(s);
  } catch (...) {
    // Out of memory while copying the message: keep the code.
  }
  return static_cast<int>(s.code());
}

absl::Status NullArgument(const char* function, const char* argument) {
  return absl::InvalidArgumentError(
      absl::StrCat(function, ": ", argument, " is NULL"));
}

// Copies a caller's int64 array of `ndim` dims (ndim already checked),
// rejecting negative dims and element counts that overflow.
absl::StatusOr<std::vector<int64_t>> CopyShape(const int64_t* dims, int ndim,
                                               absl::string_view what,
                                               absl::string_view param) {
  std::vector<int64_t> out(dims, dims + ndim);
  int64_t numel = 1;
  for (int k = 0; k < ndim; ++k) {
    if (out[k] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param, "\": ", what, "[", k,
                       "] = ", out[k], " is negative"));
    }
    if (out[k] != 0 && numel > kMaxNumel / out[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param, "\": ", what, " holds more than ",
                       kMaxNumel, " elements"));
    }
    numel *= out[k];
  }
  return out;
}

absl::StatusOr<muon::DType> ToDType(int dtype, absl::string_view what,
                                    absl::string_view param) {
  switch (dtype) {
    case MUONRT_FLOAT32:
      return muon::DType::kFloat32;
    case MUONRT_BFLOAT16:
      return muon::DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", param, "\": ", what, " ", dtype,
          " is neither MUONRT_FLOAT32 (0) nor MUONRT_BFLOAT16 (1)"));
  }
}

// The device of parameter `param` from its device_type and device_index.
// Errors: InvalidArgument (an unknown type, a negative CUDA index).
absl::StatusOr<muon::Device> ToDevice(const muonrt_param& p,
                                      absl::string_view param) {
  switch (p.device_type) {
    case MUONRT_CPU:
      return muon::Device::Host();
    case MUONRT_CUDA:
      if (p.device_index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter \"", param, "\": CUDA device index ",
                         p.device_index, " is negative"));
      }
      return muon::Device::Cuda(p.device_index);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param, "\": device_type ", p.device_type,
                       " is neither MUONRT_CPU (0) nor MUONRT_CUDA (1)"));
  }
}

// The view of parameter `i` (no placement).
absl::StatusOr<muon::ParamView> ToView(const muonrt_param& p, int i) {
  if (p.name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("muonrt_optimizer_create: params[", i, "].name is NULL"));
  }
  muon::ParamView v;
  v.name = p.name;
  if (v.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("muonrt_optimizer_create: params[", i, "].name is empty"));
  }
  if (p.ndim < 1 || p.ndim > kMaxNdim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", v.name, "\": ndim ", p.ndim,
        " is out of range; Muon only supports 2D parameters (3-D with "
        "expert_stack)"));
  }
  if (p.local_shape == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter \"", v.name, "\": local_shape is NULL"));
  }
  MUON_ASSIGN_OR_RETURN(
      v.local_shape, CopyShape(p.local_shape, p.ndim, "local_shape", v.name));
  if (p.global_shape != nullptr) {
    MUON_ASSIGN_OR_RETURN(v.global_shape, CopyShape(p.global_shape, p.ndim,
                                                    "global_shape", v.name));
  }
  if (p.strides != nullptr) v.strides.assign(p.strides, p.strides + p.ndim);
  v.data = p.data;
  v.grad = p.grad;
  MUON_ASSIGN_OR_RETURN(v.dtype, ToDType(p.dtype, "dtype", v.name));
  MUON_ASSIGN_OR_RETURN(v.grad_dtype,
                        ToDType(p.grad_dtype, "grad_dtype", v.name));
  if (p.expert_stack != 0 && p.expert_stack != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter \"", v.name, "\": expert_stack ",
                     p.expert_stack, " is neither 0 nor 1"));
  }
  v.expert_stack = p.expert_stack == 1;
  if (p.num_row_splits < 0 || p.num_row_splits > muon::kMaxExperts ||
      (p.num_row_splits > 0 && p.row_splits == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter \"", v.name, "\": num_row_splits ", p.num_row_splits,
        " with row_splits ", p.row_splits == nullptr ? "NULL" : "set",
        " (0 to ", muon::kMaxExperts, ")"));
  }
  if (p.num_row_splits > 0) {
    v.row_splits.assign(p.row_splits, p.row_splits + p.num_row_splits);
  }
  MUON_ASSIGN_OR_RETURN(v.device, ToDevice(p, v.name));
  return v;
}

// Parses "pp=1" or "pp=1,ep=0" (spaces allowed around items) against
// `mesh` with common/spec.h's CheckSubMesh: names must be mesh dims,
// coordinates in range, the placement on those dims Replicate().
absl::StatusOr<muon::SubMesh> ParseSubMesh(
    absl::string_view param, absl::string_view text,
    const std::vector<muon::Placement>& placements, const muon::Mesh& mesh) {
  google::protobuf::Map<std::string, int32_t> entries;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    int value = 0;
    const absl::string_view name =
        eq == absl::string_view::npos
            ? item
            : absl::StripAsciiWhitespace(item.substr(0, eq));
    if (eq == absl::string_view::npos || name.empty() ||
        !absl::SimpleAtoi(item.substr(eq + 1), &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", param, "\": sub_mesh \"", text, "\": item \"", item,
          "\" is not <mesh dim>=<coordinate> (e.g. \"pp=1,ep=0\")"));
    }
    if (!entries.insert({std::string(name), value}).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", param, "\": sub_mesh \"", text,
                       "\" names mesh dim \"", name, "\" twice"));
    }
  }
  return muon::CheckSubMesh(param, entries, placements, mesh);
}

// Parameter `i`'s placements and sub-mesh on `mesh`.
absl::StatusOr<muon::ParamPlacement> ToPlacement(const muonrt_param& p,
                                                 const std::string& name,
                                                 const muon::Mesh& mesh) {
  muon::ParamPlacement out;
  for (int d = 0; d < mesh.ndim(); ++d) {
    if (p.placements == nullptr) {
      out.placements.push_back(muon::Placement::Replicate());
      continue;
    }
    const char* text = p.placements[d];
    if (text == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", name, "\": placements[", d,
                       "] (mesh dim \"", mesh.names[d], "\") is NULL"));
    }
    absl::StatusOr<muon::Placement> parsed = muon::Placement::Parse(text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", name, "\": placement \"", text, "\" on mesh dim \"",
          mesh.names[d], "\": ", parsed.status().message()));
    }
    out.placements.push_back(*parsed);
  }
  if (p.sub_mesh != nullptr && *p.sub_mesh != '\0') {
    MUON_ASSIGN_OR_RETURN(out.sub_mesh,
                          ParseSubMesh(name, p.sub_mesh, out.placements, mesh));
  }
  return out;
}

// A 0/1 field of muonrt_options, or InvalidArgument naming it.
absl::StatusOr<bool> Flag(const char* name, int value) {
  if (value != 0 && value != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "muonrt_options: ", name, " ", value, " is neither 0 nor 1"));
  }
  return value == 1;
}

// The optimizer fields of `o` as the job spec's message: the one schema
// (muon::MuonOptionsFromProto reads it, as it reads a job spec's).
// Errors: InvalidArgument naming a flag that is neither 0 nor 1 (-1, 0 or
// 1 for check_finite).
absl::StatusOr<muon::v1::OptimizerOptions> ToOptimizerOptions(
    const muonrt_options& o) {
  muon::v1::OptimizerOptions p;
  p.set_lr(o.lr);
  p.set_weight_decay(o.weight_decay);
  p.set_momentum(o.momentum);
  MUON_ASSIGN_OR_RETURN(const bool nesterov, Flag("nesterov", o.nesterov));
  p.set_nesterov(nesterov);
  for (double c : {o.ns_a, o.ns_b, o.ns_c}) p.add_ns_coefficients(c);
  p.set_eps(o.eps);
  p.set_ns_steps(o.ns_steps);
  if (o.adjust_lr_fn != nullptr) p.set_adjust_lr_fn(o.adjust_lr_fn);
  if (o.ns_schedule != nullptr) p.set_ns_schedule(o.ns_schedule);
  if (o.ns_method != nullptr) p.set_ns_method(o.ns_method);
  if (o.momentum_dtype != nullptr) p.set_momentum_dtype(o.momentum_dtype);
  MUON_ASSIGN_OR_RETURN(const bool transactional,
                        Flag("transactional_step", o.transactional_step));
  p.set_transactional_step(transactional);
  MUON_ASSIGN_OR_RETURN(const bool normuon, Flag("normuon", o.normuon));
  p.set_normuon(normuon);
  p.set_normuon_beta2(o.normuon_beta2);
  p.set_normuon_eps(o.normuon_eps);
  MUON_RETURN_IF_ERROR(Flag("overlap_backward", o.overlap_backward).status());
  MUON_RETURN_IF_ERROR(
      Flag("async_gpu_parallelism", o.async_gpu_parallelism).status());
  if (o.check_finite < -1 || o.check_finite > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("muonrt_options: check_finite ", o.check_finite,
                     " is none of -1 (default), 0 and 1"));
  }
  // -1 leaves it unset: muon::ResolveOptions decides.
  if (o.check_finite != -1) p.set_check_finite(o.check_finite == 1);
  return p;
}

// The optimizer fields of `o` as MuonOptions, through the job spec's
// message. Errors: as ToOptimizerOptions and muon::MuonOptionsFromProto.
absl::StatusOr<muon::MuonOptions> ToMuonOptions(const muonrt_options& o) {
  MUON_ASSIGN_OR_RETURN(const muon::v1::OptimizerOptions p,
                        ToOptimizerOptions(o));
  return muon::MuonOptionsFromProto(p);
}

// The execution fields of `o` as the job spec's message.
muon::v1::ExecutionOptions ToExecutionOptions(const muonrt_options& o) {
  muon::v1::ExecutionOptions e;
  if (o.assignment_policy != nullptr) {
    e.set_assignment_policy(o.assignment_policy);
  }
  e.set_bucket_size_bytes(o.bucket_size_bytes);
  e.set_async_gpu_parallelism(o.async_gpu_parallelism != 0);
  e.set_prefetch_count(o.prefetch_count);
  e.set_replan_every_steps(o.replan_every_steps);
  if (o.exchange_dtype != nullptr) e.set_exchange_dtype(o.exchange_dtype);
  if (o.gpu_precision != nullptr) e.set_gpu_precision(o.gpu_precision);
  e.set_overlap_backward(o.overlap_backward == 1);
  return e;
}

absl::Status CheckIndex(const muon::Muon& muon, int index,
                        const char* function) {
  const int n = static_cast<int>(muon.params().size());
  if (index < 0 || index >= n) {
    return absl::OutOfRangeError(absl::StrCat(
        function, ": parameter index ", index, " is outside [0, ", n, ")"));
  }
  return absl::OkStatus();
}

// The buffer protocol of muonrt_optimizer_plan_json and friends.
absl::Status WriteText(const char* function, const std::string& text, char* buf,
                       size_t cap, size_t* len) {
  if (len == nullptr) return NullArgument(function, "len");
  if (buf == nullptr && cap > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, ": buf is NULL but cap is ", cap));
  }
  *len = text.size();
  if (cap < text.size() + 1) {
    return absl::OutOfRangeError(
        absl::StrCat(function, ": the text needs ", text.size() + 1,
                     " bytes (with the NUL) but cap is ", cap,
                     "; call again with *len + 1"));
  }
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  return absl::OkStatus();
}

// The optimizer's DistributedConfig: from the process group and the mesh,
// a world of one for a process without a group that sets overlap_backward,
// bucket_size_bytes, async_gpu_parallelism or prefetch_count, else none
// (the single-device path). Errors: InvalidArgument (the mesh
// arguments, a placement), those of CreateMeshConfig.
absl::StatusOr<std::optional<muon::DistributedConfig>> ConfigOf(
    muonrt_process_group* pg, int mesh_ndim, const char* const* mesh_names,
    const int* mesh_sizes, const muonrt_param* params,
    const std::vector<muon::ParamView>& views, const muonrt_options& o) {
  constexpr char kFn[] = "muonrt_optimizer_create";
  const int num_params = static_cast<int>(views.size());
  std::optional<muon::DistributedConfig> config;
  if (pg != nullptr) {
    if (mesh_ndim < 1 || mesh_ndim > kMaxNdim) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFn, ": mesh_ndim ", mesh_ndim, " is outside [1, ",
                       kMaxNdim, "] (a process group needs a mesh)"));
    }
    if (mesh_names == nullptr) return NullArgument(kFn, "mesh_names");
    if (mesh_sizes == nullptr) return NullArgument(kFn, "mesh_sizes");
    muon::Mesh mesh;
    for (int d = 0; d < mesh_ndim; ++d) {
      if (mesh_names[d] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(kFn, ": mesh_names[", d, "] is NULL"));
      }
      mesh.names.push_back(mesh_names[d]);
      mesh.sizes.push_back(mesh_sizes[d]);
    }
    MUON_RETURN_IF_ERROR(mesh.Validate());
    std::vector<muon::ParamPlacement> placements;
    placements.reserve(num_params);
    for (int i = 0; i < num_params; ++i) {
      MUON_ASSIGN_OR_RETURN(muon::ParamPlacement pl,
                            ToPlacement(params[i], views[i].name, mesh));
      placements.push_back(std::move(pl));
    }
    MUON_ASSIGN_OR_RETURN(
        config,
        muon::CreateMeshConfig(mesh, placements, pg->pg->comm.get(),
                               pg->pg->coordinator.get(), pg->pg->incarnation));
    config->state.control_communicator = pg->pg->control();
    config->state.rank = pg->pg->rank;
    config->state.world_size = pg->pg->world_size;
    config->state.join_timeout_ms = absl::ToInt64Milliseconds(pg->timeout);
    config->execution = ToExecutionOptions(o);
  } else if (o.overlap_backward == 1 || o.bucket_size_bytes != 0 ||
             o.async_gpu_parallelism != 0 || o.prefetch_count != 0) {
    // One process that still plans its buckets and schedule (the overlap,
    // byte-bounded buckets whose same-shape matrices run as one batched
    // Newton-Schulz, the async schedule): a world of one with the
    // execution options, which the single-device path does not read.
    muon::DistributedConfig one;
    one.state.mesh = muon::Mesh::OneDim(1);
    one.state.param_placements.assign(
        num_params, muon::ParamPlacement{{muon::Placement::Replicate()}});
    one.execution = ToExecutionOptions(o);
    config = std::move(one);
  }
  return config;
}

// What muon::Muon::Create takes, from the C arguments.
struct CreateArgs {
  muon::MuonOptions options;
  std::vector<muon::ParamView> views;
  std::optional<muon::DistributedConfig> config;
};

// The C arguments checked and converted. Errors: InvalidArgument naming
// the argument (a NULL pointer, a negative count, an option, a parameter,
// the mesh); those of muon::ResolveOptions and CreateMeshConfig.
absl::StatusOr<CreateArgs> ToCreateArgs(muonrt_process_group* pg, int mesh_ndim,
                                        const char* const* mesh_names,
                                        const int* mesh_sizes,
                                        const muonrt_param* params,
                                        int num_params,
                                        const muonrt_options* options) {
  constexpr char kFn[] = "muonrt_optimizer_create";
  if (num_params < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": num_params ", num_params, " is negative"));
  }
  if (num_params > 0 && params == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": params is NULL but num_params is ", num_params));
  }
  muonrt_options defaults;
  muonrt_options_default(&defaults);
  const muonrt_options& o = options != nullptr ? *options : defaults;
  CreateArgs args;
  muon::MuonOptions& muon_options = args.options;
  MUON_ASSIGN_OR_RETURN(muon_options, ToMuonOptions(o));
  // Every option checked as muonrt_options_validate checks it, also where
  // the single-device path below reads no execution options; their device
  // and gpu_precision carried into the MuonOptions for that path.
  muon::OptionContext context;  // the device's checks come at Create
  context.rank = pg != nullptr ? pg->pg->rank : 0;
  MUON_ASSIGN_OR_RETURN(
      const muon::MuonOptions checked,
      muon::ResolveOptions(muon_options, ToExecutionOptions(o), context));
  muon_options.device = checked.device;
  muon_options.gpu_precision = checked.gpu_precision;

  args.views.reserve(num_params);
  for (int i = 0; i < num_params; ++i) {
    MUON_ASSIGN_OR_RETURN(muon::ParamView v, ToView(params[i], i));
    args.views.push_back(std::move(v));
  }
  MUON_ASSIGN_OR_RETURN(
      args.config,
      ConfigOf(pg, mesh_ndim, mesh_names, mesh_sizes, params, args.views, o));
  return args;
}

// Tells the coordinator of `pg` that this rank will not create its
// optimizer because of `error` (muon::ReportFailedJoin: best effort, nothing
// for a world of one), so that the other ranks' creates fail at once
// naming it.
void ReportCreateFailure(const muonrt_process_group& pg,
                         const absl::Status& error) {
  (void)muon::ReportFailedJoin(pg.pg->coordinator.get(), pg.pg->rank,
                               pg.pg->world_size, pg.pg->incarnation, error);
}

absl::Status CreateOptimizer(muonrt_process_group* pg, int mesh_ndim,
                             const char* const* mesh_names,
                             const int* mesh_sizes, const muonrt_param* params,
                             int num_params, const muonrt_options* options,
                             muonrt_optimizer** out) {
  if (out == nullptr) return NullArgument("muonrt_optimizer_create", "out");
  *out = nullptr;
  absl::StatusOr<CreateArgs> args = ToCreateArgs(
      pg, mesh_ndim, mesh_names, mesh_sizes, params, num_params, options);
  if (!args.ok()) {
    // The other ranks wait in their joins: they fail at once naming this
    // rank (muon::Muon::Create does the same for its own checks).
    if (pg != nullptr) ReportCreateFailure(*pg, args.status());
    return args.status();
  }
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<muon::Muon> muon,
      muon::Muon::Create(std::move(args->views), args->options,
                         std::move(args->config)));
  auto handle = std::make_unique<muonrt_optimizer>();
  handle->muon = std::move(muon);
  handle->row_state_name = handle->muon->row_state_name();
  *out = handle.release();
  return absl::OkStatus();
}

// Copies `n` host arrays into `dst` (per parameter), checking each size
// against dst's: the momentum buffers or the row states of a state_dict.
absl::Status CopyStateArrays(const char* fn, const char* what,
                             const char* arrays_name,
                             const float* const* arrays, const int64_t* numels,
                             std::vector<std::vector<float>*> dst,
                             const muon::OptimizerStateDict& sd) {
  for (size_t i = 0; i < dst.size(); ++i) {
    std::vector<float>& buf = *dst[i];
    const int64_t want = static_cast<int64_t>(buf.size());
    if (numels[i] != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          fn, ": parameter ", i, " (\"", sd.params[i].name, "\") has ",
          numels[i], " ", what, " values but its local shard holds ", want));
    }
    if (want > 0 && arrays[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": ", arrays_name, "[", i, "] (\"",
                       sd.params[i].name, "\") is NULL"));
    }
    if (want > 0) std::memcpy(buf.data(), arrays[i], want * sizeof(float));
  }
  return absl::OkStatus();
}

// Hands out a host copy (`now`, expected to hold `expected` values) of
// parameter `index`'s state through `copies` (one per parameter, sized
// once: the pointers handed out stay valid).
absl::Status HandOutCopy(const char* fn, const char* what,
                         std::vector<float> now, int64_t expected, int index,
                         std::vector<std::vector<float>>* copies,
                         const muon::Muon& m, const float** data,
                         int64_t* numel) {
  if (data == nullptr) return NullArgument(fn, "data");
  if (numel == nullptr) return NullArgument(fn, "numel");
  copies->resize(m.params().size());
  if (static_cast<int64_t>(now.size()) != expected) {
    return absl::InternalError(
        absl::StrCat(fn, ": the ", what, " of parameter ", index,
                     " could not be copied from ", m.device().ToString()));
  }
  std::vector<float>& buf = (*copies)[index];
  if (buf.empty()) {
    buf = std::move(now);  // the first copy fixes the storage
  } else {
    std::copy(now.begin(), now.end(), buf.begin());
  }
  *data = buf.data();
  *numel = static_cast<int64_t>(buf.size());
  return absl::OkStatus();
}

absl::Status LoadState(muonrt_optimizer* opt, int64_t step,
                       const float* const* buffers, const int64_t* numels,
                       const float* const* row_states,
                       const int64_t* row_state_numels, int num_params) {
  constexpr char kFn[] = "muonrt_optimizer_load_state";
  if (opt == nullptr) return NullArgument(kFn, "opt");
  muon::Muon& m = *opt->muon;
  MUON_RETURN_IF_ERROR(m.RefuseInOverlappedStep(kFn));
  const int n = static_cast<int>(m.params().size());
  if (num_params != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": num_params ", num_params,
                     " differs from the optimizer's ", n, " parameters"));
  }
  if (n > 0 && buffers == nullptr) return NullArgument(kFn, "buffers");
  if (n > 0 && numels == nullptr) return NullArgument(kFn, "numels");
  if ((row_states == nullptr) != (row_state_numels == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": row_states and row_state_numels must both be ",
                     "NULL or both be set"));
  }
  // Sized from the layout: the state being replaced is not copied from the
  // device, except row states kept unchanged (row_states NULL).
  muon::OptimizerStateDict sd = m.StateLayout();
  std::vector<std::vector<float>*> momentum, row_state;
  const bool variant = !m.row_state_name().empty();
  for (int i = 0; i < n; ++i) {
    muon::ParamState& ps = sd.params[i];
    ps.momentum_buffer.resize(m.params()[i].local_numel());
    const int64_t rows = variant ? m.params()[i].local_rows() : 0;
    if (row_states != nullptr) {
      ps.row_state.resize(rows);
    } else if (variant) {
      ps.row_state = m.row_state(i);
      if (static_cast<int64_t>(ps.row_state.size()) != rows) {
        return absl::InternalError(absl::StrCat(
            kFn, ": rank ", m.current_rank(), ": the ", m.row_state_name(),
            " of parameter ", i, " (\"", ps.name, "\") could not be copied ",
            "from ", m.device().ToString(), " to be kept"));
      }
    }
    momentum.push_back(&ps.momentum_buffer);
    row_state.push_back(&ps.row_state);
  }
  MUON_RETURN_IF_ERROR(CopyStateArrays(kFn, "momentum", "buffers", buffers,
                                       numels, momentum, sd));
  if (row_states != nullptr) {
    const std::string name = m.row_state_name();
    MUON_RETURN_IF_ERROR(CopyStateArrays(
        kFn, name.empty() ? "row state" : name.c_str(), "row_states",
        row_states, row_state_numels, row_state, sd));
  }
  sd.step = step;
  return m.load_state_dict(sd);
}

}  // namespace

extern "C" {

int muonrt_abi_version(void) {
  last_error.clear();
  return MUONRT_ABI_VERSION;
}

const char* muonrt_last_error(void) { return last_error.c_str(); }

int muonrt_compute_threads(void) {
  int threads = 1;
  Guard("muonrt_compute_threads", [&] {
    threads = muon::kernels::ComputeThreads();
    return absl::OkStatus();
  });
  return threads;
}

int muonrt_set_compute_threads(int threads) {
  return Guard("muonrt_set_compute_threads",
               [&] { return muon::kernels::SetComputeThreads(threads); });
}

const char* muonrt_cpu_kernels(void) {
  thread_local std::string name;
  Guard("muonrt_cpu_kernels", [&] {
    name = muon::kernels::BlasCoreName();
    return absl::OkStatus();
  });
  return name.c_str();
}

namespace {

// The exchange through the caller's store callbacks (muonrt_publish_fn,
// muonrt_lookup_fn).
muon::CoordinatorAddressExchange StoreExchange(muonrt_publish_fn publish,
                                               muonrt_lookup_fn lookup,
                                               void* ctx) {
  muon::CoordinatorAddressExchange exchange;
  exchange.publish = [publish, ctx](const std::string& address) {
    if (publish(ctx, address.c_str()) != 0) {
      return absl::UnavailableError(
          "the store's publish callback failed (see the exception above)");
    }
    return absl::OkStatus();
  };
  exchange.lookup =
      [lookup, ctx](absl::Duration timeout) -> absl::StatusOr<std::string> {
    constexpr int kSize = 1024;
    std::vector<char> buf(kSize, '\0');
    if (lookup(ctx, absl::ToDoubleSeconds(timeout), buf.data(), kSize) != 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank 0 did not publish its coordinator's address in the job's "
          "store within ",
          absl::FormatDuration(timeout),
          " (rank 0 has not started, or failed before its coordinator "
          "listened: see its output)"));
    }
    buf[kSize - 1] = '\0';
    const std::string address(buf.data());
    if (absl::Status s = muon::SplitHostPort(address).status(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the job's store holds \"", address,
                       "\" as the coordinator's address: ", s.message()));
    }
    return address;
  };
  return exchange;
}

absl::Status InitProcessGroupFromEnv(
    const char* fn, const char* backend, int cuda_device, double timeout_s,
    muonrt_process_group** out,
    std::optional<muon::CoordinatorAddressExchange> exchange = std::nullopt) {
  if (out == nullptr) return NullArgument(fn, "out");
  *out = nullptr;
  if (std::isnan(timeout_s) || std::isinf(timeout_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": timeout_s ", timeout_s, " is not finite (<= 0: 60 s)"));
  }
  MUON_ASSIGN_OR_RETURN(muon::ProcessGroupOptions options,
                        muon::ProcessGroupOptionsFromEnv());
  const char* fixed_port = std::getenv("MUON_COORDINATOR_PORT");
  if (exchange.has_value() && options.embed_coordinator &&
      (fixed_port == nullptr || *fixed_port == '\0')) {
    // A port the kernel picks, its address handed over through the store.
    options.embedded_port = 0;
    options.coordinator_address.clear();
    options.address_exchange = *std::move(exchange);
  }
  if (backend != nullptr) {
    absl::StatusOr<muon::ProcessGroupBackend> b =
        muon::ParseProcessGroupBackend(backend);
    if (!b.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": ", b.status().message()));
    }
    options.backend = *b;
  }
  if (cuda_device >= 0) options.cuda_device = cuda_device;
  options.timeout =
      timeout_s > 0 ? absl::Seconds(timeout_s) : absl::Seconds(60);
  options.start_embedded_coordinator = muon::StartEmbeddedCoordinator;
  auto handle = std::make_unique<muonrt_process_group>();
  handle->timeout = options.timeout;
  MUON_ASSIGN_OR_RETURN(handle->pg, muon::InitProcessGroup(options));
  *out = handle.release();
  return absl::OkStatus();
}

}  // namespace

int muonrt_pg_init_from_env(double timeout_s, muonrt_process_group** out) {
  return Guard("muonrt_pg_init_from_env", [&] {
    return InitProcessGroupFromEnv("muonrt_pg_init_from_env", nullptr, -1,
                                   timeout_s, out);
  });
}

int muonrt_pg_init_backend_from_env(const char* backend, int cuda_device,
                                    double timeout_s,
                                    muonrt_process_group** out) {
  return Guard("muonrt_pg_init_backend_from_env", [&] {
    return InitProcessGroupFromEnv("muonrt_pg_init_backend_from_env", backend,
                                   cuda_device, timeout_s, out);
  });
}

int muonrt_pg_init_with_store(const char* backend, int cuda_device,
                              double timeout_s, muonrt_publish_fn publish,
                              muonrt_lookup_fn lookup, void* ctx,
                              muonrt_process_group** out) {
  return Guard("muonrt_pg_init_with_store", [&]() -> absl::Status {
    if (publish == nullptr) {
      return NullArgument("muonrt_pg_init_with_store", "publish");
    }
    if (lookup == nullptr) {
      return NullArgument("muonrt_pg_init_with_store", "lookup");
    }
    return InitProcessGroupFromEnv("muonrt_pg_init_with_store", backend,
                                   cuda_device, timeout_s, out,
                                   StoreExchange(publish, lookup, ctx));
  });
}

int muonrt_pg_rank(const muonrt_process_group* pg) {
  int rank = -1;
  Guard("muonrt_pg_rank", [&]() -> absl::Status {
    if (pg == nullptr) return NullArgument("muonrt_pg_rank", "pg");
    rank = pg->pg->rank;
    return absl::OkStatus();
  });
  return rank;
}

int muonrt_pg_world_size(const muonrt_process_group* pg) {
  int world_size = -1;
  Guard("muonrt_pg_world_size", [&]() -> absl::Status {
    if (pg == nullptr) return NullArgument("muonrt_pg_world_size", "pg");
    world_size = pg->pg->world_size;
    return absl::OkStatus();
  });
  return world_size;
}

const char* muonrt_pg_coordinator_address(const muonrt_process_group* pg) {
  const char* address = nullptr;
  Guard("muonrt_pg_coordinator_address", [&]() -> absl::Status {
    if (pg == nullptr) {
      return NullArgument("muonrt_pg_coordinator_address", "pg");
    }
    address = pg->pg->coordinator_address.c_str();
    return absl::OkStatus();
  });
  return address;
}

int muonrt_pg_barrier(muonrt_process_group* pg) {
  return Guard("muonrt_pg_barrier", [&]() -> absl::Status {
    if (pg == nullptr) return NullArgument("muonrt_pg_barrier", "pg");
    return pg->pg->comm->Barrier();
  });
}

int muonrt_pg_report_create_failure(muonrt_process_group* pg,
                                    const char* message) {
  return Guard("muonrt_pg_report_create_failure", [&]() -> absl::Status {
    if (pg == nullptr) {
      return NullArgument("muonrt_pg_report_create_failure", "pg");
    }
    if (message == nullptr) {
      return NullArgument("muonrt_pg_report_create_failure", "message");
    }
    ReportCreateFailure(*pg, absl::InvalidArgumentError(message));
    return absl::OkStatus();
  });
}

void muonrt_pg_destroy(muonrt_process_group* pg) {
  Guard("muonrt_pg_destroy", [&]() -> absl::Status {
    delete pg;
    return absl::OkStatus();
  });
}

int muonrt_options_validate(const muonrt_options* options) {
  return Guard("muonrt_options_validate", [&]() -> absl::Status {
    if (options == nullptr)
      return NullArgument("muonrt_options_validate", "options");
    MUON_ASSIGN_OR_RETURN(muon::MuonOptions m, ToMuonOptions(*options));
    return muon::ResolveOptions(m, ToExecutionOptions(*options),
                                muon::OptionContext{})
        .status();
  });
}

void muonrt_options_default(muonrt_options* options) {
  if (options == nullptr) return;
  const muon::MuonOptions m;
  const muon::v1::ExecutionOptions d;  // the job spec's defaults
  options->lr = m.lr;
  options->weight_decay = m.weight_decay;
  options->momentum = m.momentum;
  options->nesterov = m.nesterov ? 1 : 0;
  options->ns_a = m.ns_a;
  options->ns_b = m.ns_b;
  options->ns_c = m.ns_c;
  options->eps = m.eps;
  options->ns_steps = m.ns_steps;
  options->adjust_lr_fn = nullptr;
  options->ns_schedule = nullptr;
  options->ns_method = nullptr;
  options->async_gpu_parallelism = d.async_gpu_parallelism() ? 1 : 0;
  options->prefetch_count = d.prefetch_count();
  options->assignment_policy = nullptr;
  options->bucket_size_bytes = d.bucket_size_bytes();
  options->transactional_step = m.transactional_step ? 1 : 0;
  options->replan_every_steps = d.replan_every_steps();
  options->exchange_dtype = nullptr;
  options->normuon = m.normuon ? 1 : 0;
  options->normuon_beta2 = m.normuon_beta2;
  options->normuon_eps = m.normuon_eps;
  options->overlap_backward = d.overlap_backward() ? 1 : 0;
  options->momentum_dtype = nullptr;
  options->check_finite = -1;
  options->gpu_precision = nullptr;
}

int muonrt_optimizer_create(muonrt_process_group* pg, int mesh_ndim,
                            const char* const* mesh_names,
                            const int* mesh_sizes, const muonrt_param* params,
                            int num_params, const muonrt_options* options,
                            muonrt_optimizer** out) {
  return Guard("muonrt_optimizer_create", [&] {
    return CreateOptimizer(pg, mesh_ndim, mesh_names, mesh_sizes, params,
                           num_params, options, out);
  });
}

void muonrt_optimizer_destroy(muonrt_optimizer* opt) {
  Guard("muonrt_optimizer_destroy", [&]() -> absl::Status {
    delete opt;
    return absl::OkStatus();
  });
}

int muonrt_optimizer_step(muonrt_optimizer* opt, void* stream) {
  return Guard("muonrt_optimizer_step", [&]() -> absl::Status {
    if (opt == nullptr) return NullArgument("muonrt_optimizer_step", "opt");
    // CPU parameters: `stream` must be NULL; CUDA ones: the caller's
    // cudaStream_t (NULL = the legacy default stream).
    return opt->muon->StepOnStream(stream);
  });
}

int muonrt_optimizer_set_grad(muonrt_optimizer* opt, int index,
                              const void* grad) {
  return Guard("muonrt_optimizer_set_grad", [&]() -> absl::Status {
    if (opt == nullptr) return NullArgument("muonrt_optimizer_set_grad", "opt");
    return opt->muon->SetGrad(index, grad);
  });
}

int muonrt_optimizer_refuse_step(muonrt_optimizer* opt, const char* reason) {
  return Guard("muonrt_optimizer_refuse_step", [&]() -> absl::Status {
    if (opt == nullptr)
      return NullArgument("muonrt_optimizer_refuse_step", "opt");
    if (reason == nullptr) {
      return NullArgument("muonrt_optimizer_refuse_step", "reason");
    }
    return opt->muon->RefuseStep(reason);
  });
}

int muonrt_optimizer_set_hyperparameters(muonrt_optimizer* opt, int index,
                                         double lr, double weight_decay,
                                         double momentum) {
  return Guard("muonrt_optimizer_set_hyperparameters", [&]() -> absl::Status {
    if (opt == nullptr) {
      return NullArgument("muonrt_optimizer_set_hyperparameters", "opt");
    }
    return opt->muon->SetParamHyperparameters(index, lr, weight_decay,
                                              momentum);
  });
}

int64_t muonrt_optimizer_step_count(const muonrt_optimizer* opt) {
  int64_t step = -1;
  Guard("muonrt_optimizer_step_count", [&]() -> absl::Status {
    if (opt == nullptr) {
      return NullArgument("muonrt_optimizer_step_count", "opt");
    }
    step = opt->muon->step_count();
    return absl::OkStatus();
  });
  return step;
}

int muonrt_optimizer_momentum(muonrt_optimizer* opt, int index,
                              const float** data, int64_t* numel) {
  return Guard("muonrt_optimizer_momentum", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_momentum";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    MUON_RETURN_IF_ERROR(CheckIndex(*opt->muon, index, kFn));
    MUON_RETURN_IF_ERROR(opt->muon->RefuseInOverlappedStep(kFn));
    return HandOutCopy(kFn, "momentum", opt->muon->momentum_buffer(index),
                       opt->muon->params()[index].local_numel(), index,
                       &opt->momentum_copies, *opt->muon, data, numel);
  });
}

int muonrt_optimizer_row_state_name(muonrt_optimizer* opt, const char** name) {
  return Guard("muonrt_optimizer_row_state_name", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_row_state_name";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    if (name == nullptr) return NullArgument(kFn, "name");
    *name = opt->row_state_name.c_str();
    return absl::OkStatus();
  });
}

int muonrt_optimizer_row_state(muonrt_optimizer* opt, int index,
                               const float** data, int64_t* numel) {
  return Guard("muonrt_optimizer_row_state", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_row_state";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    MUON_RETURN_IF_ERROR(CheckIndex(*opt->muon, index, kFn));
    const muon::Muon& m = *opt->muon;
    MUON_RETURN_IF_ERROR(m.RefuseInOverlappedStep(kFn));
    const int64_t want =
        opt->row_state_name.empty() ? 0 : m.params()[index].local_rows();
    return HandOutCopy(kFn, "row state", m.row_state(index), want, index,
                       &opt->row_state_copies, m, data, numel);
  });
}

int muonrt_optimizer_load_state(muonrt_optimizer* opt, int64_t step,
                                const float* const* buffers,
                                const int64_t* numels, int num_params) {
  return Guard("muonrt_optimizer_load_state", [&] {
    return LoadState(opt, step, buffers, numels, nullptr, nullptr, num_params);
  });
}

int muonrt_optimizer_mark_ready(muonrt_optimizer* opt, int index,
                                void* stream) {
  return Guard("muonrt_optimizer_mark_ready", [&]() -> absl::Status {
    if (opt == nullptr)
      return NullArgument("muonrt_optimizer_mark_ready", "opt");
    return opt->muon->MarkReadyOnStream(index, stream);
  });
}

int muonrt_optimizer_set_qk_clip(muonrt_optimizer* opt, double threshold,
                                 double alpha,
                                 const muonrt_qk_clip_layer* layers,
                                 int num_layers) {
  return Guard("muonrt_optimizer_set_qk_clip", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_set_qk_clip";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    if (num_layers < 0 || (num_layers > 0 && layers == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFn, ": num_layers ", num_layers, " with layers ",
                       layers == nullptr ? "NULL" : "set"));
    }
    muon::QkClipOptions o;
    o.threshold = threshold;
    o.alpha = alpha;
    for (int i = 0; i < num_layers; ++i) {
      const muonrt_qk_clip_layer& c = layers[i];
      muon::QkClipLayer l;
      l.q_param = c.q_param != nullptr ? c.q_param : "";
      l.q_row_begin = c.q_row_begin;
      l.k_param = c.k_param != nullptr ? c.k_param : "";
      l.k_row_begin = c.k_row_begin;
      l.num_heads = c.num_heads;
      l.num_kv_heads = c.num_kv_heads == 0 ? c.num_heads : c.num_kv_heads;
      l.head_dim = c.head_dim;
      l.k_head_dim = c.k_head_dim;
      l.q_rope_dim = c.q_rope_dim;
      o.layers.push_back(std::move(l));
    }
    return opt->muon->SetQkClip(o);
  });
}

int muonrt_optimizer_clip_qk(muonrt_optimizer* opt, const float* max_logits,
                             int64_t count, int64_t* groups_clipped,
                             float* max_logit, void* stream) {
  return Guard("muonrt_optimizer_clip_qk", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_clip_qk";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    // The count is checked against the layers by ClipQk on every rank;
    // only a size this process can copy is taken from outside. Bad
    // arguments still join the collective (as no maxima), so that every
    // rank fails together instead of waiting for this one.
    constexpr int64_t kMaxHeads = int64_t{1} << 24;
    if (count < 0 || count > kMaxHeads ||
        (count > 0 && max_logits == nullptr)) {
      const absl::Status joined = opt->muon->ClipQkOnStream({}, stream);
      return absl::InvalidArgumentError(
          absl::StrCat(kFn, ": count ", count, " with max_logits ",
                       max_logits == nullptr ? "NULL" : "set", " (0 to ",
                       kMaxHeads, "); ", joined.message()));
    }
    const std::vector<float> values(max_logits, max_logits + count);
    muon::QkClipStats stats;
    MUON_RETURN_IF_ERROR(opt->muon->ClipQkOnStream(values, stream, &stats));
    if (groups_clipped != nullptr) *groups_clipped = stats.groups_clipped;
    if (max_logit != nullptr) *max_logit = stats.max_logit;
    return absl::OkStatus();
  });
}

int muonrt_optimizer_load_full_state(muonrt_optimizer* opt, int64_t step,
                                     const float* const* buffers,
                                     const int64_t* numels,
                                     const float* const* row_states,
                                     const int64_t* row_state_numels,
                                     int num_params) {
  return Guard("muonrt_optimizer_load_full_state", [&] {
    return LoadState(opt, step, buffers, numels, row_states, row_state_numels,
                     num_params);
  });
}

int muonrt_optimizer_save(muonrt_optimizer* opt, const char* dir) {
  return Guard("muonrt_optimizer_save", [&]() -> absl::Status {
    if (opt == nullptr) return NullArgument("muonrt_optimizer_save", "opt");
    if (dir == nullptr) return NullArgument("muonrt_optimizer_save", "dir");
    return opt->muon->Save(dir);
  });
}

int muonrt_optimizer_load(muonrt_optimizer* opt, const char* dir) {
  return Guard("muonrt_optimizer_load", [&]() -> absl::Status {
    if (opt == nullptr) return NullArgument("muonrt_optimizer_load", "opt");
    if (dir == nullptr) return NullArgument("muonrt_optimizer_load", "dir");
    return opt->muon->Load(dir);
  });
}

namespace {

// `message` in protobuf's JSON mapping (proto field names) into buf.
absl::Status WriteProtoJson(const char* fn, const char* what,
                            const google::protobuf::Message& message, char* buf,
                            size_t cap, size_t* len) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  std::string json;
  const auto s =
      google::protobuf::util::MessageToJsonString(message, &json, print);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat(fn, ": printing ", what, ": ", s.ToString()));
  }
  return WriteText(fn, json, buf, cap, len);
}

}  // namespace

int muonrt_optimizer_plan_json(const muonrt_optimizer* opt, char* buf,
                               size_t cap, size_t* len) {
  return Guard("muonrt_optimizer_plan_json", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_plan_json";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    return WriteProtoJson(kFn, "the plan", opt->muon->plan(), buf, cap, len);
  });
}

int muonrt_optimizer_last_step_report_json(const muonrt_optimizer* opt,
                                           char* buf, size_t cap, size_t* len) {
  return Guard("muonrt_optimizer_last_step_report_json", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_last_step_report_json";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    muon::v1::StepReport report;
    opt->muon->FillStepReport(&report);
    return WriteProtoJson(kFn, "the step report", report, buf, cap, len);
  });
}

int muonrt_optimizer_assignments_json(const muonrt_optimizer* opt, char* buf,
                                      size_t cap, size_t* len) {
  return Guard("muonrt_optimizer_assignments_json", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_assignments_json";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    std::string json = "{";
    bool first_rank = true;
    for (const auto& [rank, indices] : opt->muon->assignments()) {
      absl::StrAppend(&json, first_rank ? "" : ", ", "\"", rank, "\": [");
      first_rank = false;
      for (size_t k = 0; k < indices.size(); ++k) {
        absl::StrAppend(&json, k == 0 ? "" : ", ", indices[k]);
      }
      absl::StrAppend(&json, "]");
    }
    absl::StrAppend(&json, "}");
    return WriteText(kFn, json, buf, cap, len);
  });
}

int muonrt_optimizer_last_step_stats(const muonrt_optimizer* opt,
                                     muonrt_step_stats* stats) {
  return Guard("muonrt_optimizer_last_step_stats", [&]() -> absl::Status {
    constexpr char kFn[] = "muonrt_optimizer_last_step_stats";
    if (opt == nullptr) return NullArgument(kFn, "opt");
    if (stats == nullptr) return NullArgument(kFn, "stats");
    const muon::StepStats& s = opt->muon->last_step_stats();
    stats->step = opt->muon->step_count();
    stats->matrices_orthogonalized = s.matrices_orthogonalized;
    stats->ns_flops = s.ns_flops;
    stats->bytes_sent = s.bytes_sent;
    stats->bytes_received = s.bytes_received;
    stats->step_time_s = s.step_time_s;
    stats->buffer_bytes = s.buffer_bytes;
    return absl::OkStatus();
  });
}

}  // extern "C"
