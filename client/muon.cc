#include "client/muon.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/normuon.h"
#include "comm/local_communicator.h"
#include "comm/staging_communicator.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "kernels/muon_update.h"
#include "kernels/staged_ns_engine.h"
#include "plan/plan_job.h"
#include "plan/planner.h"

namespace muon {

namespace {

// Rank r's manifest, derived from this rank's view: the parameters whose
// sub-mesh contains r, with the local shape the torch.chunk rule gives it
// (this rank's own local shape for itself, so the coordinator checks it).
// `owners[i]` are the requested owners of parameter i's matrices (empty =
// none). O(parameters).
absl::StatusOr<v1::RankManifest> ManifestOfRank(
    int r, const std::vector<ParamView>& params, const DistributedState& state,
    const v1::ExecutionOptions& execution,
    const std::vector<std::vector<int>>& owners) {
  const std::vector<int> coord = state.mesh.Coord(r);
  v1::RankManifest m;
  m.set_rank(r);
  m.set_world_size(state.world_size);
  *m.mutable_mesh() = MeshToProto(state.mesh);
  *m.mutable_execution() = execution;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& p = params[i];
    const ParamPlacement& pl = state.param_placements[i];
    if (!pl.sub_mesh.Contains(coord)) continue;
    v1::ParamManifest* pm = m.add_params();
    pm->set_name(p.name);
    pm->set_dtype(std::string(DTypeName(p.dtype)));
    for (int64_t d : p.shape()) pm->add_global_shape(d);
    for (const Placement& x : pl.placements) pm->add_placements(x.ToString());
    for (int64_t n : p.row_splits) pm->add_row_splits(n);
    for (size_t k = 0; k < pl.sub_mesh.dims.size(); ++k) {
      (*pm->mutable_sub_mesh())[state.mesh.names[pl.sub_mesh.dims[k]]] =
          pl.sub_mesh.coords[k];
    }
    if (r == state.rank) {
      for (int64_t d : p.local_shape) pm->add_local_shape(d);
    } else {
      MUON_ASSIGN_OR_RETURN(std::vector<Range> ranges,
                            LocalRanges(p.shape(), pl.placements, state.mesh,
                                        coord, pl.sub_mesh));
      for (const Range& x : ranges) pm->add_local_shape(x.size());
    }
    if (!owners.empty()) {
      for (int o : owners[i]) m.add_requested_owners(o);
    }
  }
  return m;
}

// The manifest's description of `t`: its name, hyperparameters and row
// state, which the plan checks are the same on every rank.
v1::OwnerTransformSpec OwnerTransformSpecOf(const OwnerTransform& t) {
  v1::OwnerTransformSpec spec;
  spec.set_name(t.name());
  for (const auto& [key, value] : t.params()) {
    (*spec.mutable_params())[key] = value;
  }
  spec.add_row_state(t.row_state().name);
  return spec;
}

}  // namespace

namespace {

// The dtype of a momentum buffer of a `param_dtype` parameter.
kernels::ParamDType MomentumDTypeOf(MomentumDType option, DType param_dtype) {
  switch (option) {
    case MomentumDType::kFloat32:
      return kernels::ParamDType::kFloat32;
    case MomentumDType::kBFloat16:
      return kernels::ParamDType::kBFloat16;
    case MomentumDType::kParam:
      break;
  }
  return param_dtype == DType::kBFloat16 ? kernels::ParamDType::kBFloat16
                                         : kernels::ParamDType::kFloat32;
}

// `local`, a check of this rank that failed before it joined, also sent
// to the coordinator (ReportFailedJoin), so that the other ranks' joins
// fail at once naming this rank; returned as is.
absl::Status ReportedBeforeJoin(const DistributedState& state,
                                absl::Status local) {
  (void)ReportFailedJoin(state.coordinator, state.rank, state.world_size,
                         state.incarnation, local);
  return local;
}

// This rank's matrices with their geometry (a 2-D parameter is one matrix,
// an expert stack one per slice), and whether any parameter lives on a
// sub-mesh.
struct LocalMatrices {
  std::vector<MatrixGeometry> geometry;
  std::vector<MatrixInfo> infos;
  bool uses_sub_mesh = false;
};

absl::StatusOr<LocalMatrices> MakeLocalMatrices(
    const std::vector<ParamView>& ps, const DistributedState& state) {
  const int rank = state.rank;
  const std::vector<int> my_coord = state.mesh.Coord(rank);
  LocalMatrices out;
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamPlacement& pl = state.param_placements[i];
    out.uses_sub_mesh |= !pl.sub_mesh.empty();
    if (!pl.sub_mesh.Contains(my_coord)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": parameter \"", ps[i].name,
          "\" belongs to a sub-mesh (pipeline stage or expert group) that does "
          "not contain this rank; pass only the parameters this rank holds"));
    }
    absl::StatusOr<std::vector<MatrixBoxes>> mats =
        ParamMatrices(ps[i].shape(), pl.placements, state.mesh, pl.sub_mesh,
                      ps[i].row_splits);
    if (!mats.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": parameter \"", ps[i].name,
                       "\": ", mats.status().message()));
    }
    MUON_ASSIGN_OR_RETURN(std::vector<Range> mine,
                          LocalRanges(ps[i].shape(), pl.placements, state.mesh,
                                      my_coord, pl.sub_mesh));
    for (MatrixBoxes& mb : *mats) {
      MatrixGeometry g;
      g.param = ps[i].name;
      g.param_index = static_cast<int>(i);
      g.slice = mb.slice;
      g.rows = mb.rows;
      g.cols = mb.cols;
      const Box& my_box = mb.boxes[rank];
      if (ps[i].expert_stack && !my_box.empty()) {
        g.offset = (mb.slice - mine[0].begin) * my_box.numel();
        g.row_offset = (mb.slice - mine[0].begin) * my_box.rows.size();
      }
      if (!ps[i].row_splits.empty() && !my_box.empty()) {
        // The block's rows held here are contiguous in the local shard.
        int64_t block_begin = 0;
        for (int b = 0; b < mb.slice; ++b) block_begin += ps[i].row_splits[b];
        g.row_offset = block_begin + my_box.rows.begin - mine[0].begin;
        g.offset = g.row_offset * mine[1].size();
      }
      g.boxes = std::move(mb.boxes);
      out.infos.push_back(MatrixInfo{static_cast<int>(out.infos.size()),
                                     static_cast<int>(i), g.slice, g.param,
                                     g.rows, g.cols});
      out.geometry.push_back(std::move(g));
    }
  }
  return out;
}

// Owners a user's assign_fn asks for, per parameter (empty without one).
// Deterministic, so every rank raises the same error.
absl::StatusOr<std::vector<std::vector<int>>> RequestedOwners(
    const DistributedConfig& config, const std::vector<ParamView>& ps,
    const std::vector<MatrixInfo>& infos) {
  std::vector<std::vector<int>> requested;
  if (!config.assign_fn) return requested;
  const DistributedState& state = config.state;
  std::vector<std::string> matrix_names;
  for (const MatrixInfo& m : infos) {
    matrix_names.push_back(ps[m.param_index].expert_stack
                               ? absl::StrCat(m.name, "[", m.slice, "]")
                               : m.name);
  }
  absl::StatusOr<std::vector<int>> owners = OwnersFromAssignment(
      config.assign_fn(infos, state.world_size), static_cast<int>(infos.size()),
      state.world_size, matrix_names);
  if (!owners.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", state.rank, ": ", owners.status().message()));
  }
  requested.resize(ps.size());
  for (size_t k = 0; k < infos.size(); ++k) {
    requested[infos[k].param_index].push_back((*owners)[k]);
  }
  return requested;
}

// The plan without a coordinator: from this rank's view, which is every
// rank's view only when all ranks hold all parameters.
absl::StatusOr<v1::Plan> PlanLocally(
    const std::vector<v1::RankManifest>& manifests,
    const DistributedConfig& config, bool uses_sub_mesh) {
  const int rank = config.state.rank;
  if (uses_sub_mesh) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank,
        ": parameters on sub-meshes (pipeline stages, expert "
        "groups) need a coordinator to plan: set state.coordinator"));
  }
  // The same entry point as the coordinator's (manifest checks, planner,
  // ValidatePlan, hash); the manifests carry the execution options and
  // ns_steps.
  absl::StatusOr<JobPlan> job = PlanJob(manifests, /*job_id=*/"");
  if (!job.ok()) {
    return absl::Status(
        job.status().code(),
        absl::StrCat("rank ", rank, ": ", job.status().message()));
  }
  return std::move(job->plan);
}

// The Newton-Schulz engine on `options.device`.
absl::StatusOr<std::unique_ptr<kernels::NsEngine>> MakeNsEngine(
    const MuonOptions& options, int rank) {
  if (options.device != device::DeviceKind::kCuda) {
    return kernels::MakeCpuNsEngine();
  }
  absl::StatusOr<std::unique_ptr<kernels::NsEngine>> engine =
      kernels::MakeCudaNsEngine(options.cuda_device, options.gpu_precision);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(),
                        absl::StrCat("rank ", rank, ": device \"cuda\": ",
                                     engine.status().message()));
  }
  return engine;
}

// torch.optim.Muon's hyper-parameters as the executor applies them.
absl::StatusOr<UpdateRule> MakeUpdateRule(const MuonOptions& options) {
  UpdateRule rule;
  rule.adjust_lr_fn = options.adjust_lr_fn;
  rule.lr = options.lr;
  rule.weight_decay = options.weight_decay;
  rule.momentum = options.momentum;
  rule.nesterov = options.nesterov;
  rule.ns = kernels::CoefficientScheduleFor(options.ns_schedule, options.ns_a,
                                            options.ns_b, options.ns_c,
                                            options.ns_steps);
  rule.ns.eps = options.eps;
  rule.ns.method = options.ns_method;
  return rule;
}

// The device every parameter is on (the host for none).
// Errors: InvalidArgument naming two parameters on different devices.
absl::StatusOr<device::Device> CommonDevice(const std::vector<ParamView>& ps,
                                            int rank) {
  if (ps.empty()) return device::Device::Host();
  for (const ParamView& p : ps) {
    if (p.device == ps[0].device) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": parameter \"", ps[0].name, "\" is on ",
        ps[0].device.ToString(), " but parameter \"", p.name, "\" is on ",
        p.device.ToString(), "; one optimizer steps parameters of one device"));
  }
  return ps[0].device;
}

// The options a CUDA step does not support, and the step's communicators
// (`comm` the data path's, already staged for CUDA parameters over a host
// group; `control` the host group for the control values, or null): the
// data path's on the parameters' device, a host group for the control
// values. Errors: InvalidArgument naming the option or group.
absl::Status CheckDeviceSupport(const device::Device& dev, const MuonOptions& o,
                                const DistributedState& state,
                                const Communicator* comm,
                                const Communicator* control) {
  const int rank = state.rank;
  if (state.world_size == 1) return absl::OkStatus();
  if (comm != nullptr && comm->buffer_device() != dev) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": the parameters are on ", dev.ToString(),
        " but the process group (", comm->backend(), ") exchanges ",
        comm->buffer_device().ToString(), " memory; use ",
        dev.is_cuda() ? "an NCCL group on that device, or a Gloo group"
                      : "a Gloo group"));
  }
  if (control != nullptr) {
    if (!control->buffer_device().is_host() ||
        control->world_size() != state.world_size || control->rank() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": the control group (", control->backend(), ", rank ",
          control->rank(), " of ", control->world_size(), ", on ",
          control->buffer_device().ToString(),
          ") must be a host-memory group over the same ranks"));
    }
  } else if ((*o.check_finite || o.transactional_step) && comm != nullptr &&
             !comm->buffer_device().is_host()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": check_finite and transactional_step agree across ",
        "ranks through a host-memory group, and the process group is ",
        comm->backend(), ": set DistributedState::control_communicator to a ",
        "Gloo group over the same ranks (InitProcessGroup makes one), or ",
        "turn both options off"));
  }
  return absl::OkStatus();
}

// Checks the views and the config against each other (identical on every
// rank of an SPMD program); fills a world of one when not distributed.
absl::Status CheckLocal(const std::vector<ParamView>& ps, bool distributed,
                        DistributedState* state) {
  if (!distributed) {
    state->rank = 0;
    state->world_size = 1;
    state->mesh = Mesh::OneDim(1, "dp_shard");
    state->param_placements.assign(ps.size(),
                                   ParamPlacement{{Placement::Replicate()}});
  }
  const int rank = state->rank;
  for (const ParamView& p : ps)
    MUON_RETURN_IF_ERROR(ValidateParamView(p, rank));
  if (state->param_placements.size() != ps.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": the distributed config describes ",
                     state->param_placements.size(),
                     " parameters but the optimizer has ", ps.size()));
  }
  MUON_RETURN_IF_ERROR(state->mesh.Validate());
  if (state->mesh.world_size() != state->world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": mesh ", state->mesh.ToString(),
                     " holds ", state->mesh.world_size(),
                     " ranks but the world size is ", state->world_size));
  }
  return absl::OkStatus();
}

// StepExecutor::Create's error as Create returns it: InvalidArgument (the
// plan and this rank's matrices disagree) becomes FailedPrecondition; other
// codes are the device's (its kernels could not be made there) and keep
// theirs, prefixed with the rank and device.
absl::Status ExecutorCreateError(int rank, const device::Device& dev,
                                 const absl::Status& e) {
  if (e.code() != absl::StatusCode::kInvalidArgument) {
    return absl::Status(
        e.code(),
        absl::StrCat("rank ", rank, ": ", dev.ToString(), ": ", e.message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank,
      ": the plan does not fit this rank's parameters: ", e.message()));
}

}  // namespace

absl::Status Muon::JoinOrPlan(const DistributedConfig& config,
                              const ManifestOf& manifest_of, bool uses_sub_mesh,
                              v1::Plan* plan_out) {
  const DistributedState& state = config.state;
  if (state.coordinator == nullptr) {
    std::vector<v1::RankManifest> manifests;
    for (int r = 0; r < state.mesh.world_size(); ++r) {
      MUON_ASSIGN_OR_RETURN(v1::RankManifest m, manifest_of(r));
      manifests.push_back(std::move(m));
    }
    MUON_ASSIGN_OR_RETURN(*plan_out,
                          PlanLocally(manifests, config, uses_sub_mesh));
    return absl::OkStatus();
  }
  // The coordinator checks every rank's manifest against the others and
  // answers every rank with the same plan or the same error.
  agent_ = std::make_unique<Agent>(state.coordinator, state.rank,
                                   state.incarnation, Agent::Options{});
  absl::StatusOr<v1::RankManifest> manifest = manifest_of(state.rank);
  if (!manifest.ok()) return ReportedBeforeJoin(state, manifest.status());
  absl::StatusOr<v1::Plan> plan =
      agent_->Join(*manifest, state.join_timeout_ms);
  if (!plan.ok()) return plan.status();
  *plan_out = *std::move(plan);
  MUON_RETURN_IF_ERROR(
      agent_->ConfirmPlanHash(plan_out->hash(), state.world_size,
                              absl::Milliseconds(state.join_timeout_ms)));
  agent_->Start();
  return absl::OkStatus();
}

absl::Status Muon::ChooseCommunicators(const DistributedState& state,
                                       Communicator** comm,
                                       Communicator** control) {
  const int rank = state.rank;
  *comm = state.communicator;
  *control = state.control_communicator;
  if (*comm == nullptr) {
    if (state.world_size != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": world size ", state.world_size,
                       " needs a communicator (process group)"));
    }
    owned_comm_ = LocalCommunicator::Create();
    *comm = owned_comm_.get();
  } else if ((*comm)->world_size() != state.world_size ||
             (*comm)->rank() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": the process group is rank ", (*comm)->rank(), " of ",
        (*comm)->world_size(), " but the config says rank ", rank, " of ",
        state.world_size));
  }
  if (device_.is_cuda() && state.world_size > 1 &&
      (*comm)->buffer_device().is_host()) {
    // CUDA parameters over a host group (Gloo), as c10d's Gloo backend
    // takes CUDA tensors: each collective is staged through host memory;
    // the host group itself carries the control values.
    MUON_ASSIGN_OR_RETURN(owned_comm_,
                          StagingCommunicator::Create(*comm, runtime_));
    if (*control == nullptr) *control = *comm;
    *comm = owned_comm_.get();
  }
  return CheckDeviceSupport(device_, options_, state, *comm, *control);
}

ExecutorOptions Muon::MakeExecutorOptions(
    const v1::ExecutionOptions& execution) const {
  ExecutorOptions exec_options;
  exec_options.device = device_;
  exec_options.precision = options_.gpu_precision;
  exec_options.bf16_exchange = ExchangeIsBf16(execution);
  exec_options.owner_transform = owner_transform_;
  exec_options.ns = rule_.ns;
  exec_options.allocator = &memory_->buffers;
  // U is formed per bucket for Nesterov and for bf16 momentum buffers.
  exec_options.form_update = options_.nesterov;
  for (const ParamView& p : params_) {
    exec_options.form_update |=
        MomentumDTypeOf(options_.momentum_dtype, p.dtype) !=
        kernels::ParamDType::kFloat32;
  }
  return exec_options;
}

absl::Status Muon::MakeDataPath(const DistributedConfig& config,
                                std::vector<MatrixGeometry> geometry,
                                StepPipelineRun* run) {
  const DistributedState& state = config.state;
  const int rank = state.rank;
  Communicator* comm = nullptr;
  Communicator* control = nullptr;
  MUON_RETURN_IF_ERROR(ChooseCommunicators(state, &comm, &control));
  const ExecutorOptions exec_options = MakeExecutorOptions(config.execution);
  run->device_wait_timeout = exec_options.step_timeout;
  // The executor owns the step's kernels: on the host over this engine,
  // on CUDA its own (Newton-Schulz in cuBLAS on its compute stream).
  std::shared_ptr<kernels::NsEngine> engine;
  if (device_.is_host()) {
    if (config.ns_engine_factory) {
      MUON_ASSIGN_OR_RETURN(engine, config.ns_engine_factory());
    } else {
      MUON_ASSIGN_OR_RETURN(engine, MakeNsEngine(options_, rank));
    }
  }
  run->replan_every_steps = config.execution.replan_every_steps();
  absl::StatusOr<std::unique_ptr<StepExecutor>> executor = StepExecutor::Create(
      rank, state.world_size, run->plan, std::move(geometry), comm,
      config.gather_fn, config.redistribute_fn, std::move(engine),
      exec_options);
  if (!executor.ok()) {
    return ExecutorCreateError(rank, device_, executor.status());
  }
  run->executor = *std::move(executor);
  comm_ = comm;
  run->rank_flags = std::make_unique<RankFlags>(
      rank, state.world_size,
      control != nullptr ? control
                         : (comm->buffer_device().is_host() ? comm : nullptr));
  // The coordinator's job error (a rank lost or failed) aborts pending
  // collectives so blocked calls return at once; without a coordinator, a
  // failure of this rank's own does.
  Communicator* flags = run->rank_flags->control();
  run->abort_communicators = [comm, flags] {
    if (comm != nullptr) comm->Abort();
    if (flags != nullptr && flags != comm) flags->Abort();
  };
  if (agent_ != nullptr) agent_->SetAbortCallback(run->abort_communicators);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Muon>> Muon::Create(
    std::vector<ParamView> params, const MuonOptions& options,
    std::optional<DistributedConfig> distributed_config) {
  const bool distributed = distributed_config.has_value();
  DistributedConfig config;
  if (distributed) config = *std::move(distributed_config);
  const DistributedState& state = config.state;
  // A check that fails here, before the join, is sent to the coordinator
  // too, so that the other ranks' joins fail at once naming this rank.
  auto refuse = [&](absl::Status local) {
    return ReportedBeforeJoin(state, std::move(local));
  };
  // torch's argument errors first, as torch.optim.Muon.__init__ raises
  // them (ResolveOptions, below, checks the options against the rest).
  absl::Status checked = ValidateMuonOptions(options);
  if (checked.ok()) checked = CheckLocal(params, distributed, &config.state);
  std::unique_ptr<Muon> muon(new Muon());
  if (checked.ok()) checked = muon->Bind(std::move(params), options, config);
  if (!checked.ok()) return refuse(checked);
  const v1::ExecutionOptions& execution = config.execution;
  absl::StatusOr<LocalMatrices> local = MakeLocalMatrices(muon->params_, state);
  if (!local.ok()) return refuse(local.status());
  absl::StatusOr<std::vector<std::vector<int>>> requested =
      RequestedOwners(config, muon->params_, local->infos);
  if (!requested.ok()) return refuse(requested.status());
  if (muon->options_.normuon) {
    muon->owner_transform_ =
        MakeNorMuon(muon->options_.normuon_beta2, muon->options_.normuon_eps);
  }
  auto manifest_of = [&](int r) -> absl::StatusOr<v1::RankManifest> {
    MUON_ASSIGN_OR_RETURN(
        v1::RankManifest m,
        ManifestOfRank(r, muon->params_, state, execution, *requested));
    m.set_ns_steps(options.ns_steps);
    if (muon->owner_transform_ != nullptr) {
      *m.mutable_owner_transform() =
          OwnerTransformSpecOf(*muon->owner_transform_);
    }
    return m;
  };
  StepPipelineRun run;
  MUON_RETURN_IF_ERROR(
      muon->JoinOrPlan(config, manifest_of, local->uses_sub_mesh, &run.plan));
  muon->uses_sub_mesh_ = local->uses_sub_mesh;
  MUON_ASSIGN_OR_RETURN(
      muon->qk_clipper_,
      QkClipper::Create(muon->options_.qk_clip, muon->QkClipView(),
                        local->uses_sub_mesh));
  muon->matrices_ = std::move(local->infos);
  MUON_RETURN_IF_ERROR(
      muon->MakePipeline(config, std::move(local->geometry), std::move(run)));
  return muon;
}

absl::Status Muon::Bind(std::vector<ParamView> params,
                        const MuonOptions& options,
                        const DistributedConfig& config) {
  const DistributedState& state = config.state;
  MUON_ASSIGN_OR_RETURN(device_, CommonDevice(params, state.rank));
  absl::StatusOr<device::Runtime*> runtime = device::GetRuntime(device_);
  if (!runtime.ok()) {
    return absl::Status(
        runtime.status().code(),
        absl::StrCat("rank ", state.rank, ": the parameters are on ",
                     device_.ToString(), ": ", runtime.status().message()));
  }
  runtime_ = *runtime;
  MUON_ASSIGN_OR_RETURN(
      options_, ResolveOptions(
                    options, config.execution,
                    OptionContext{device_, state.rank,
                                  config.gather_fn || config.redistribute_fn}));
  memory_ = std::make_unique<MemoryCounters>(runtime_->allocator());
  params_ = std::move(params);
  rank_ = state.rank;
  world_size_ = state.world_size;
  mesh_ = state.mesh;
  placements_ = state.param_placements;
  return absl::OkStatus();
}

absl::Status Muon::MakePipeline(const DistributedConfig& config,
                                std::vector<MatrixGeometry> geometry,
                                StepPipelineRun run) {
  run.overlap_backward = config.execution.overlap_backward();
  // The rule first: the executor reserves its scratch for the rule's
  // Newton-Schulz.
  MUON_ASSIGN_OR_RETURN(rule_, MakeUpdateRule(options_));
  MUON_RETURN_IF_ERROR(MakeDataPath(config, std::move(geometry), &run));
  qk_clipper_.set_control(run.rank_flags->control());
  // The snapshot a step is undone to: transactional_step's, and
  // check_finite's under overlap_backward (the step begins before every
  // gradient is known).
  MUON_RETURN_IF_ERROR(AllocateState(
      run.executor.get(),
      options_.transactional_step ||
          ChecksFiniteUnderOverlap(options_, run.overlap_backward)));
  pipeline_ = std::make_unique<StepPipeline>(PipelineParts(), std::move(run));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Muon>> Muon::Create(
    std::vector<Parameter*> params, const MuonOptions& options,
    std::optional<DistributedConfig> distributed_config) {
  const DistributedState none;
  const DistributedState& state =
      distributed_config.has_value() ? distributed_config->state : none;
  for (const Parameter* p : params) {
    if (static_cast<int64_t>(p->data.size()) != p->local_numel() &&
        p->local_shape.size() == (p->expert_stack ? 3u : 2u)) {
      return ReportedBeforeJoin(
          state,
          absl::InvalidArgumentError(absl::StrCat(
              "rank ", state.rank, ": parameter \"", p->name, "\" holds ",
              p->data.size(), " values but its local shape ",
              ShapeToString(p->local_shape), " needs ", p->local_numel())));
    }
  }
  MUON_ASSIGN_OR_RETURN(
      std::unique_ptr<Muon> muon,
      Create(ViewsOf(params), options, std::move(distributed_config)));
  muon->bound_ = std::move(params);
  return muon;
}

Muon::~Muon() {
  if (agent_ != nullptr) agent_->Stop();
}

absl::Status Muon::SetGrad(int index, const void* grad) {
  if (index < 0 || index >= static_cast<int>(params_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank_, ": SetGrad: parameter index ", index,
                     " is outside [0, ", params_.size(), ")"));
  }
  params_[index].grad = grad;
  return absl::OkStatus();
}

QkClipRank Muon::QkClipView() const {
  QkClipRank r;
  r.rank = rank_;
  r.world_size = world_size_;
  r.params = &params_;
  r.placements = &placements_;
  r.mesh = &mesh_;
  r.control =
      pipeline_ != nullptr ? pipeline_->rank_flags().control() : nullptr;
  return r;
}

absl::Status Muon::SetQkClip(const QkClipOptions& qk_clip) {
  MUON_RETURN_IF_ERROR(
      CheckQkClipDevice(qk_clip, OptionContext{device_, rank_, false}));
  MUON_ASSIGN_OR_RETURN(
      QkClipper clipper,
      QkClipper::Create(qk_clip, QkClipView(), uses_sub_mesh_));
  options_.qk_clip = qk_clip;
  qk_clipper_ = std::move(clipper);
  return absl::OkStatus();
}

absl::Status Muon::ClipQk(const std::vector<float>& max_logits,
                          QkClipStats* stats) {
  return ClipQkOnStream(max_logits, nullptr, stats);
}

absl::Status Muon::ClipQkOnStream(const std::vector<float>& max_logits,
                                  void* stream, QkClipStats* stats) {
  kernels::StepKernels& kernels = pipeline_->executor().kernels();
  // A refusal of this rank's own still joins the clip's collective, with
  // no maxima (which fails it on every rank before anything is scaled),
  // so that the other ranks fail too instead of waiting for this one.
  bool joined = false;
  auto refuse = [&](const absl::Status& own) {
    if (!joined) (void)qk_clipper_.Clip({}, kernels, nullptr, nullptr);
    return own;
  };
  if (pipeline_->in_overlapped_step()) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     ": QK-clip during a step begun by MarkReady (the "
                     "executor is writing the parameters): call it after "
                     "Step")));
  }
  absl::StatusOr<device::Stream*> caller =
      pipeline_->ResolveStream(stream, "QK-clip");
  if (!caller.ok()) return refuse(caller.status());
  // Host: the host kernels scale at once, on no stream.
  if (*caller == nullptr) {
    return qk_clipper_.Clip(max_logits, kernels, nullptr, stats);
  }
  // CUDA: inside the stream's Launch, with its device current; the
  // collectives run on this thread, the kernels are enqueued on `caller`.
  const absl::Status s = (*caller)->Launch([&] {
    joined = true;
    return qk_clipper_.Clip(max_logits, kernels, *caller, stats);
  });
  return s.ok() ? s : refuse(s);
}

absl::Status Muon::SetParamHyperparameters(int index, double lr,
                                           double weight_decay,
                                           double momentum) {
  if (index < 0 || index >= static_cast<int>(params_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("rank ", rank_, ": parameter index ", index,
                     " is outside [0, ", params_.size(), ")"));
  }
  for (absl::Status s : {ValidateLearningRate(lr), ValidateMomentum(momentum),
                         ValidateWeightDecay(weight_decay)}) {
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.message(), " (parameter \"", params_[index].name, "\")"));
    }
  }
  if (pipeline_->in_overlapped_step()) {
    // The executor's threads read the rule for buckets already running.
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": parameter \"", params_[index].name,
                     "\": hyperparameters cannot change during a step begun by "
                     "MarkReady; set them before the first MarkReady"));
  }
  rule_.SetParamHyperparameters(index, static_cast<int>(params_.size()), lr,
                                weight_decay, momentum);
  return absl::OkStatus();
}

absl::Status Muon::Step() { return pipeline_->Step(nullptr); }

absl::Status Muon::RefuseStep(absl::string_view reason) {
  return pipeline_->Refuse(absl::FailedPreconditionError(
      absl::StrCat("rank ", rank_, ": ", reason)));
}

absl::Status Muon::StepOnStream(void* stream) {
  return pipeline_->Step(stream);
}

absl::Status Muon::MarkReady(int index) {
  return pipeline_->MarkReady(index, nullptr);
}

absl::Status Muon::MarkReadyOnStream(int index, void* stream) {
  return pipeline_->MarkReady(index, stream);
}

StepPipelineParts Muon::PipelineParts() {
  StepPipelineParts parts;
  parts.rank = rank_;
  parts.params = &params_;
  parts.bound = &bound_;
  parts.options = &options_;
  parts.rule = &rule_;
  parts.state = state_.get();
  parts.device = device_;
  parts.runtime = runtime_;
  parts.agent = agent_.get();
  parts.fill_report = [this](v1::StepReport* report) {
    FillStepReport(report);
  };
  return parts;
}

absl::Status Muon::AllocateState(StepExecutor* executor, bool snapshot) {
  OptimizerStateSpec spec;
  for (const ParamView& p : params_) {
    spec.momentum_dtypes.push_back(
        MomentumDTypeOf(options_.momentum_dtype, p.dtype));
  }
  spec.row_state = owner_transform_ != nullptr;
  spec.snapshot = snapshot;
  MUON_ASSIGN_OR_RETURN(
      state_, OptimizerState::Create(params_, spec, runtime_, &memory_->state,
                                     &memory_->snapshot));
  if (spec.row_state) executor->BindRowState(state_->RowStatePointers());
  return absl::OkStatus();
}

std::vector<float> Muon::row_state(int i) const {
  return state_->ReadRowState(i);
}

std::string Muon::row_state_name() const {
  return owner_transform_ != nullptr ? owner_transform_->row_state().name
                                     : std::string();
}

std::vector<float> Muon::momentum_buffer(int i) const {
  std::vector<float> out(state_->momentum(i).size());
  if (!state_->ReadMomentum(i, out.data()).ok()) out.clear();
  return out;
}

OptimizerMemory Muon::memory() const {
  OptimizerMemory m;
  m.momentum_bytes = state_ != nullptr ? state_->momentum_bytes() : 0;
  m.state_bytes = memory_->state.bytes_in_use();
  m.snapshot_bytes = memory_->snapshot.bytes_in_use();
  m.buffer_bytes = memory_->buffers.bytes_in_use();
  m.scratch_bytes =
      pipeline_ != nullptr ? pipeline_->executor().kernel_scratch_bytes() : 0;
  m.peak_bytes = memory_->total.peak_bytes() + m.scratch_bytes;
  return m;
}

void Muon::FillStepReport(v1::StepReport* report) const {
  const StepStats& stats = pipeline_->stats();
  const StepExecutor& executor = pipeline_->executor();
  report->set_rank(rank_);
  report->set_step(pipeline_->step_count());
  report->set_step_time_s(stats.step_time_s);
  report->set_matrices_orthogonalized(stats.matrices_orthogonalized);
  report->set_ns_flops(stats.ns_flops);
  report->set_bytes_sent(stats.bytes_sent);
  report->set_bytes_received(stats.bytes_received);
  report->set_mode(executor.async() ? v1::SCHEDULE_MODE_ASYNC
                                    : v1::SCHEDULE_MODE_SEQUENTIAL);
  report->set_prefetch_count(executor.prefetch_count());
  report->set_buffer_bytes(stats.buffer_bytes);
  report->set_buffer_bound_bytes(stats.buffer_bound_bytes);
  const OptimizerMemory mem = memory();
  report->set_momentum_bytes(mem.momentum_bytes);
  report->set_state_bytes(mem.state_bytes);
  report->set_snapshot_bytes(mem.snapshot_bytes);
  report->set_peak_bytes(mem.peak_bytes);
  report->set_scratch_bytes(mem.scratch_bytes);
  report->clear_ops();
  for (const OpRecord& op : stats.ops) {
    v1::OpTiming* t = report->add_ops();
    t->set_op(op.op);
    t->set_stream(op.stream);
    t->set_bucket(op.bucket);
    t->set_start_s(op.start_s);
    t->set_end_s(op.end_s);
    t->set_bytes(op.bytes);
    t->set_flops(op.flops);
  }
}

void Muon::ZeroGrad() {
  for (Parameter* p : bound_) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
}

std::map<int, std::vector<int>> Muon::assignments() const {
  std::map<std::pair<std::string, int>, int> local;
  for (const MatrixInfo& m : matrices_) local[{m.name, m.slice}] = m.index;
  std::map<int, std::vector<int>> out;
  for (const v1::MatrixPlan& m : pipeline_->plan().matrices()) {
    auto it = local.find({m.param(), m.slice()});
    if (it != local.end()) out[m.owner()].push_back(it->second);
  }
  for (auto& [rank, indices] : out) std::sort(indices.begin(), indices.end());
  return out;
}

}  // namespace muon
