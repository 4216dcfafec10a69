#include "dist/mesh.h"

#include <numeric>
#include <sstream>
#include <string>

#include "core/error.h"

namespace seqpar::dist {

Mesh::Mesh(int world_size, int sp_size, int dp_size) : Mesh(world_size, sp_size, 1, dp_size) {}

Mesh::Mesh(int world_size, int ulysses_size, int cp_size, int dp_size)
    : world_size_(world_size),
      sp_size_(ulysses_size * cp_size),
      dp_size_(dp_size),
      ulysses_size_(ulysses_size),
      cp_size_(cp_size) {
  // An sp x dp mesh names sp as it always has; a two-level one names both levels.
  const std::string levels =
      cp_size == 1 ? "sp " + std::to_string(ulysses_size)
                   : "ulysses " + std::to_string(ulysses_size) + ", cp " + std::to_string(cp_size);
  SEQPAR_CHECK(world_size > 0 && ulysses_size > 0 && cp_size > 0 && dp_size > 0,
               "mesh: sizes must be positive, got world ", world_size, ", ", levels, ", dp ", dp_size);
  const int sp_size = sp_size_;
  const std::string sp_text = "sp (" + std::to_string(sp_size) +
                              (cp_size == 1 ? "" : " = ulysses " + std::to_string(ulysses_size) + " x cp " +
                                                       std::to_string(cp_size)) + ")";
  SEQPAR_CHECK(world_size % sp_size == 0, "mesh: ", sp_text, " does not divide the world size (", world_size, ")");
  SEQPAR_CHECK(sp_size * dp_size == world_size, "mesh: ", sp_text, " x dp (", dp_size, ") = ", sp_size * dp_size,
               " does not equal the world size (", world_size, ")");
  for (int replica = 0; replica < dp_size; ++replica) {
    std::vector<int> group(static_cast<size_t>(sp_size));
    std::iota(group.begin(), group.end(), replica * sp_size);
    sp_groups_.push_back(group);
  }
  for (int position = 0; position < sp_size; ++position) {
    std::vector<int> group;
    for (int replica = 0; replica < dp_size; ++replica) group.push_back(position + replica * sp_size);
    dp_groups_.push_back(group);
  }
  sp_dp_group_.resize(static_cast<size_t>(world_size));
  std::iota(sp_dp_group_.begin(), sp_dp_group_.end(), 0);
  for (int replica = 0; replica < dp_size; ++replica) {
    const int first = replica * sp_size;
    for (int c = 0; c < cp_size; ++c) {
      std::vector<int> group(static_cast<size_t>(ulysses_size));
      std::iota(group.begin(), group.end(), first + c * ulysses_size);
      ulysses_groups_.push_back(group);
    }
    for (int u = 0; u < ulysses_size; ++u) {
      std::vector<int> group;
      for (int c = 0; c < cp_size; ++c) group.push_back(first + c * ulysses_size + u);
      cp_groups_.push_back(group);
    }
  }
}

void Mesh::check_rank(int rank) const {
  SEQPAR_CHECK(rank >= 0 && rank < world_size_, "mesh: rank ", rank,
               " is outside a world of ", world_size_);
}

MeshCoordinates Mesh::coordinates(int rank) const {
  check_rank(rank);
  const int sp_rank = rank % sp_size_;
  return {sp_rank, rank / sp_size_, sp_rank % ulysses_size_, sp_rank / ulysses_size_};
}

const std::vector<int>& Mesh::sp_group_of(int rank) const {
  return sp_groups_[static_cast<size_t>(coordinates(rank).dp_rank)];
}

const std::vector<int>& Mesh::dp_group_of(int rank) const {
  return dp_groups_[static_cast<size_t>(coordinates(rank).sp_rank)];
}

const std::vector<int>& Mesh::ulysses_group_of(int rank) const {
  const MeshCoordinates at = coordinates(rank);
  return ulysses_groups_[static_cast<size_t>(at.dp_rank * cp_size_ + at.cp_rank)];
}

const std::vector<int>& Mesh::cp_group_of(int rank) const {
  const MeshCoordinates at = coordinates(rank);
  return cp_groups_[static_cast<size_t>(at.dp_rank * ulysses_size_ + at.ulysses_rank)];
}

std::string ulysses_group_name(const std::vector<int>& ranks) {
  return "ulysses[" + rank_list_label(ranks) + "]";
}
std::string cp_group_name(const std::vector<int>& ranks) {
  return "cp[" + rank_list_label(ranks) + "]";
}

std::string sp_group_name(const std::vector<int>& ranks) {
  return "sp[" + rank_list_label(ranks) + "]";
}
std::string dp_group_name(const std::vector<int>& ranks) {
  return "dp[" + rank_list_label(ranks) + "]";
}
std::string sp_dp_group_name(const std::vector<int>& ranks) {
  return "sp_dp[" + rank_list_label(ranks) + "]";
}

std::string Mesh::str() const {
  std::ostringstream out;
  out << "mesh: world " << world_size_ << " = sp " << sp_size_ << " x dp " << dp_size_;
  if (cp_size_ > 1) out << ", sp " << sp_size_ << " = ulysses " << ulysses_size_ << " x cp " << cp_size_;
  out << "\n  sequence-parallel groups (contiguous):";
  for (const auto& group : sp_groups_) out << ' ' << sp_group_name(group);
  if (cp_size_ > 1) {
    out << "\n  ulysses groups (neighbouring):";
    for (const auto& group : ulysses_groups_) out << ' ' << ulysses_group_name(group);
    out << "\n  context-parallel groups (strided by ulysses):";
    for (const auto& group : cp_groups_) out << ' ' << cp_group_name(group);
  }
  out << "\n  data-parallel groups (strided):";
  for (const auto& group : dp_groups_) out << ' ' << dp_group_name(group);
  out << "\n  sp x dp group (gradients are reduced here): " << sp_dp_group_name(sp_dp_group_);
  out << "\n  rank (sp_rank, dp_rank):";
  for (int rank = 0; rank < world_size_; ++rank) {
    const MeshCoordinates at = coordinates(rank);
    out << ' ' << rank << " (" << at.sp_rank << ", " << at.dp_rank << ")";
  }
  if (cp_size_ > 1) {
    out << "\n  rank (ulysses_rank, cp_rank):";
    for (int rank = 0; rank < world_size_; ++rank) {
      const MeshCoordinates at = coordinates(rank);
      out << ' ' << rank << " (" << at.ulysses_rank << ", " << at.cp_rank << ")";
    }
  }
  out << "\n";
  return out.str();
}

// One split per kind of group: a group that can create many groups at once does so
// (the threads group); the others make one new_group per group (dist/mesh.h). split
// takes ranks of the group it is called on; those are world ranks here.
static std::shared_ptr<ProcessGroup> create_groups(ProcessGroup& world,
                                                   const std::vector<std::vector<int>>& groups,
                                                   std::string (*name_of)(const std::vector<int>&)) {
  std::vector<std::string> names;
  for (const auto& group : groups) names.push_back(name_of(group));
  return world.split(groups, names);
}

MeshGroups build_mesh_groups(const Mesh& mesh, ProcessGroup& world) {
  SEQPAR_CHECK(world.size() == mesh.world_size(), "build_mesh_groups: the mesh is for a world of ",
               mesh.world_size(), " ranks but group ", world.name(), " has ", world.size());
  for (int rank = 0; rank < world.size(); ++rank) {
    SEQPAR_CHECK(world.global_ranks()[static_cast<size_t>(rank)] == rank,
                 "build_mesh_groups: group ", world.name(), " is not the world (ranks ",
                 world.global_ranks(), ")");
  }
  MeshGroups groups;
  groups.coordinates = mesh.coordinates(world.rank());
  groups.sp_group = create_groups(world, mesh.sp_groups(), sp_group_name);
  // The two levels of sequence parallelism: a level of degree 1 needs no group, and a
  // level that is all of sp is the sp group (no second communicator of the same ranks).
  if (mesh.ulysses_size() > 1 && mesh.cp_size() > 1) {
    groups.ulysses_group = create_groups(world, mesh.ulysses_groups(), ulysses_group_name);
    groups.cp_group = create_groups(world, mesh.cp_groups(), cp_group_name);
  } else if (mesh.ulysses_size() > 1) {
    groups.ulysses_group = groups.sp_group;
  } else if (mesh.cp_size() > 1) {
    groups.cp_group = groups.sp_group;
  }
  groups.dp_group = create_groups(world, mesh.dp_groups(), dp_group_name);
  groups.sp_dp_group = create_groups(world, {mesh.sp_dp_group()}, sp_dp_group_name);
  return groups;
}

}  // namespace seqpar::dist
