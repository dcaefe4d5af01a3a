#include "client/distributed_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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
          placements[i].placements.size(), " placements for the ", mesh.ndim(),
          "-D mesh ", mesh.ToString()));
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
  return CreateAutoConfig(ViewsOf(params), options);
}

namespace {

// A process group and the mesh dim it spans.
struct Group {
  std::string name;
  Communicator* comm;
};

// The groups given, in the mesh's dim order (pp, dp_replicate, dp_shard,
// cp, ep, tp).
absl::StatusOr<std::vector<Group>> GroupsInMeshOrder(
    const AutoConfigOptions& options) {
  if (options.ddp != nullptr && options.replicate != nullptr) {
    return absl::InvalidArgumentError(
        "CreateAutoConfig: give the DDP group as either ddp or replicate, not "
        "both");
  }
  std::vector<Group> groups;
  for (const Group& g :
       {Group{"pp", options.pp},
        Group{"dp_replicate",
              options.replicate != nullptr ? options.replicate : options.ddp},
        Group{"dp_shard", options.fsdp}, Group{"cp", options.cp},
        Group{"ep", options.ep}, Group{"tp", options.tp}}) {
    if (g.comm != nullptr) groups.push_back(g);
  }
  if (groups.empty()) {
    return absl::InvalidArgumentError(
        "CreateAutoConfig: no process group given (fsdp, replicate/ddp, tp, "
        "cp, ep or pp)");
  }
  return groups;
}

// The group spanning every rank: options.world, or the only group when it
// is the whole world.
absl::StatusOr<Communicator*> WorldGroup(const std::vector<Group>& groups,
                                         const AutoConfigOptions& options) {
  if (options.world != nullptr) return options.world;
  if (groups.size() > 1) {
    return absl::InvalidArgumentError(
        "CreateAutoConfig: several groups given; set `world` to the process "
        "group spanning every rank");
  }
  Communicator* world = groups[0].comm;
  const std::vector<int> ranks = world->global_ranks();
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    if (ranks[r] != r) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", ranks[world->rank()], ": the ", groups[0].name,
                       " group [", absl::StrJoin(ranks, ", "),
                       "] is a sub-group of a larger world; "
                       "set `world` to the process group spanning every rank"));
    }
  }
  return world;
}

// This rank's coordinate in `mesh`: its position in each group, checked
// to be the row-major mesh's (each group is this rank's row of its dim).
absl::StatusOr<std::vector<int>> MeshCoordinate(
    const std::vector<Group>& groups, const Mesh& mesh,
    const Communicator& world) {
  const int rank = world.rank();
  if (mesh.world_size() != world.world_size()) {
    std::string sizes;
    for (const Group& g : groups) {
      absl::StrAppend(&sizes, sizes.empty() ? "" : " x ", g.name, "=",
                      g.comm->world_size());
    }
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": the groups ", sizes, " hold ",
                     mesh.world_size(), " ranks but the world size is ",
                     world.world_size(), "; the groups must tile the world"));
  }
  std::vector<int> coord(mesh.ndim());
  for (int d = 0; d < mesh.ndim(); ++d) {
    const std::vector<int> ranks = groups[d].comm->global_ranks();
    const auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, ": the ", groups[d].name, " group [",
          absl::StrJoin(ranks, ", "), "] does not contain this rank"));
    }
    coord[d] = static_cast<int>(it - ranks.begin());
  }
  if (mesh.RankOf(coord) != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": its positions in the groups give mesh coordinate (",
        absl::StrJoin(coord, ", "), ") of ", mesh.ToString(),
        ", which is rank ", mesh.RankOf(coord),
        "; groups must be laid out row-major in the order ",
        "pp, dp_replicate, dp_shard, cp, ep, tp"));
  }
  for (int d = 0; d < mesh.ndim(); ++d) {
    std::vector<int> expected;
    std::vector<int> c = coord;
    for (int i = 0; i < mesh.sizes[d]; ++i) {
      c[d] = i;
      expected.push_back(mesh.RankOf(c));
    }
    const std::vector<int> actual = groups[d].comm->global_ranks();
    if (actual != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, ": the ", groups[d].name, " group is [",
                       absl::StrJoin(actual, ", "), "] but in the mesh ",
                       mesh.ToString(), " this rank's ", groups[d].name,
                       " group is [", absl::StrJoin(expected, ", "),
                       "]; groups overlap or do not tile the world"));
    }
  }
  return coord;
}

// This rank's pipeline stage (-1 without a pp dim), checked against the
// options' pp_stage and pp_num_stages.
absl::StatusOr<int> PipelineStage(const Mesh& mesh,
                                  const std::vector<int>& coord, int rank,
                                  const AutoConfigOptions& options) {
  const int pp_dim = mesh.DimIndex("pp");
  if (pp_dim < 0) return -1;
  const int stage = options.pp_stage >= 0 ? options.pp_stage : coord[pp_dim];
  const int stages =
      options.pp_num_stages > 0 ? options.pp_num_stages : mesh.sizes[pp_dim];
  if (stage >= stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": pp stage ", stage, " is out of range for ", stages,
        " stages (0..", stages - 1, ")"));
  }
  if (stages != mesh.sizes[pp_dim]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": ", stages, " pipeline stages but the pp group has ",
        mesh.sizes[pp_dim], " ranks"));
  }
  if (stage != coord[pp_dim]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": pp stage ", stage, " but this rank is at position ",
        coord[pp_dim], " of its pp group"));
  }
  return stage;
}

// Parameter `i`'s placements over `mesh` from the options' shard dims
// (dp_shard: fsdp_shard_dim; tp: tp_dim_per_param or tp_shard_dim; ep:
// whole experts of a stack), its sub-mesh the pp stage, checked against
// the local shape the rank holds.
absl::StatusOr<ParamPlacement> AutoPlacement(const ParamView& p, int i,
                                             const Mesh& mesh,
                                             const std::vector<int>& coord,
                                             int stage, int rank,
                                             const AutoConfigOptions& options) {
  const int shift = p.expert_stack ? 1 : 0;
  ParamPlacement pl;
  for (int d = 0; d < mesh.ndim(); ++d) {
    const std::string& name = mesh.names[d];
    Placement x = Placement::Replicate();
    // Matrix dim (0 rows, 1 cols) sharded by dp_shard / tp; -1 = none.
    int matrix_dim = -1;
    if (name == "dp_shard") {
      matrix_dim = options.fsdp_shard_dim;
    } else if (name == "ep" && p.expert_stack) {
      x = Placement::Shard(0);  // whole experts per ep rank
    } else if (name == "tp") {
      auto it = options.tp_dim_per_param.find(i);
      matrix_dim = it != options.tp_dim_per_param.end() ? it->second
                                                        : options.tp_shard_dim;
    }
    if (matrix_dim != -1 || name == "dp_shard" || name == "tp") {
      if (matrix_dim < 0 || matrix_dim > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, ": parameter \"", p.name, "\": ", name,
            " shard dim ", matrix_dim, " is out of range (0 rows or 1 cols)"));
      }
      x = Placement::Shard(matrix_dim + shift);
    }
    pl.placements.push_back(x);
  }
  if (stage >= 0) {
    pl.sub_mesh.dims = {mesh.DimIndex("pp")};
    pl.sub_mesh.coords = {stage};
  }
  // The local shape must be what these placements give this rank.
  MUON_ASSIGN_OR_RETURN(
      std::vector<Range> ranges,
      LocalRanges(p.shape(), pl.placements, mesh, coord, pl.sub_mesh));
  std::vector<int64_t> expected;
  for (const Range& r : ranges) expected.push_back(r.size());
  if (expected != p.local_shape) {
    std::vector<std::string> names;
    for (const Placement& x : pl.placements) names.push_back(x.ToString());
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": parameter \"", p.name,
                     "\" has local shape [", absl::StrJoin(p.local_shape, ", "),
                     "] but [", absl::StrJoin(names, ", "), "] over ",
                     mesh.ToString(), " of [", absl::StrJoin(p.shape(), ", "),
                     "] gives [", absl::StrJoin(expected, ", "),
                     "]; check the shard dims (fsdp_shard_dim, tp_shard_dim, "
                     "tp_dim_per_param)"));
  }
  return pl;
}

}  // namespace

absl::StatusOr<DistributedConfig> CreateAutoConfig(
    const std::vector<ParamView>& params, const AutoConfigOptions& options) {
  MUON_ASSIGN_OR_RETURN(std::vector<Group> groups, GroupsInMeshOrder(options));
  Mesh mesh;
  for (const Group& g : groups) {
    mesh.names.push_back(g.name);
    mesh.sizes.push_back(g.comm->world_size());
  }
  MUON_ASSIGN_OR_RETURN(Communicator * world, WorldGroup(groups, options));
  const int rank = world->rank();
  MUON_ASSIGN_OR_RETURN(std::vector<int> coord,
                        MeshCoordinate(groups, mesh, *world));
  MUON_ASSIGN_OR_RETURN(const int stage,
                        PipelineStage(mesh, coord, rank, options));
  std::vector<ParamPlacement> placements;
  for (size_t i = 0; i < params.size(); ++i) {
    MUON_ASSIGN_OR_RETURN(ParamPlacement pl,
                          AutoPlacement(params[i], static_cast<int>(i), mesh,
                                        coord, stage, rank, options));
    placements.push_back(std::move(pl));
  }
  return CreateMeshConfig(mesh, placements, world, options.coordinator,
                          options.incarnation);
}

}  // namespace muon
