#include "client/distributed_config.h"

#include "absl/strings/str_cat.h"

namespace muon {

absl::StatusOr<DistributedConfig> CreateMeshConfig(
    const Mesh& mesh, const std::vector<ParamPlacement>& placements,
    Communicator* communicator, CoordinationClient* coordinator,
    uint64_t incarnation) {
  if (communicator == nullptr) {
    return absl::InvalidArgumentError("CreateMeshConfig: communicator is null");
  }
  if (absl::Status s = mesh.Validate(); !s.ok()) return s;
  if (mesh.world_size() != communicator->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", communicator->rank(), ": mesh ", mesh.ToString(), " holds ",
        mesh.world_size(), " ranks but the process group's world size is ",
        communicator->world_size()));
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    if (static_cast<int>(placements[i].placements.size()) != mesh.ndim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", communicator->rank(), ": parameter ", i, " has ",
          placements[i].placements.size(), " placements for the ",
          mesh.ndim(), "-D mesh ", mesh.ToString()));
    }
  }
  DistributedConfig config;
  config.state.rank = communicator->rank();
  config.state.world_size = communicator->world_size();
  config.state.mesh = mesh;
  config.state.param_placements = placements;
  config.state.communicator = communicator;
  config.state.coordinator = coordinator;
  config.state.incarnation = incarnation;
  return config;
}

absl::StatusOr<DistributedConfig> CreateAutoConfig(
    const std::vector<Parameter*>& params, const AutoConfigOptions& options) {
  if ((options.fsdp == nullptr) == (options.ddp == nullptr)) {
    return absl::InvalidArgumentError(
        "CreateAutoConfig: give exactly one of fsdp and ddp process groups");
  }
  Communicator* group = options.fsdp != nullptr ? options.fsdp : options.ddp;
  if (options.fsdp != nullptr && options.fsdp_shard_dim != 0 &&
      options.fsdp_shard_dim != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", group->rank(), ": fsdp_shard_dim is ",
                     options.fsdp_shard_dim, "; must be 0 or 1"));
  }
  const Placement placement = options.fsdp != nullptr
                                  ? Placement::Shard(options.fsdp_shard_dim)
                                  : Placement::Replicate();
  const Mesh mesh = Mesh::OneDim(group->world_size(),
                                 options.fsdp != nullptr ? "dp_shard"
                                                         : "dp_replicate");
  std::vector<ParamPlacement> placements(params.size(),
                                         ParamPlacement{{placement}});
  return CreateMeshConfig(mesh, placements, group, options.coordinator,
                          options.incarnation);
}

}  // namespace muon
