// Mesh: how world = sp x dp ranks are laid out, as in the script and in
// DeepSpeed / Megatron:
//
//   sequence-parallel groups: contiguous ranks   sp[0-3] sp[4-7]          (world 8, sp 4)
//   data-parallel groups:     strided ranks      dp[0,4] dp[1,5] dp[2,6] dp[3,7]
//   the sp x dp group:        everyone           sp_dp[0-7]
//
// Rank r sits at sp_rank = r % sp (its place in its sequence-parallel group, which
// picks its shard of the sequence) and dp_rank = r / sp (which replica it belongs to).
// Every rank holding a replica of the parameters is in the sp x dp group, which is
// the group gradients must be reduced over (docs/deepspeed-6868.md).
//
// The Mesh is a pure layout (lists of ranks); build_mesh_groups turns it into
// process groups.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/process_group.h"

namespace seqpar::dist {

struct MeshCoordinates {
  int sp_rank = 0;
  int dp_rank = 0;
};

class Mesh {
 public:
  // Rejects sizes that are not positive, an sp that does not divide the world, and
  // sp x dp != world, naming the values.
  Mesh(int world_size, int sp_size, int dp_size);

  int world_size() const { return world_size_; }
  int sp_size() const { return sp_size_; }
  int dp_size() const { return dp_size_; }

  MeshCoordinates coordinates(int rank) const;
  // dp_size groups of sp_size consecutive ranks.
  const std::vector<std::vector<int>>& sp_groups() const { return sp_groups_; }
  // sp_size groups of dp_size ranks, sp_size apart.
  const std::vector<std::vector<int>>& dp_groups() const { return dp_groups_; }
  const std::vector<int>& sp_dp_group() const { return sp_dp_group_; }
  const std::vector<int>& sp_group_of(int rank) const;
  const std::vector<int>& dp_group_of(int rank) const;

  // A few lines: the sizes, every group, and each rank's coordinates.
  std::string str() const;

 private:
  void check_rank(int rank) const;

  int world_size_, sp_size_, dp_size_;
  std::vector<std::vector<int>> sp_groups_;
  std::vector<std::vector<int>> dp_groups_;
  std::vector<int> sp_dp_group_;
};

// Group names as they appear in messages: "sp[0-3]", "dp[1,5]", "sp_dp[0-7]".
std::string sp_group_name(const std::vector<int>& ranks);
std::string dp_group_name(const std::vector<int>& ranks);
std::string sp_dp_group_name(const std::vector<int>& ranks);

// This rank's groups of a mesh.
struct MeshGroups {
  MeshCoordinates coordinates;
  std::shared_ptr<ProcessGroup> sp_group;
  std::shared_ptr<ProcessGroup> dp_group;
  std::shared_ptr<ProcessGroup> sp_dp_group;
};

// Collective over `world` (whose ranks must be the mesh's world ranks 0..N-1):
// creates every group of the mesh, one ProcessGroup::split per kind of group, in one
// fixed order on every rank (the sp groups, then the dp groups, then the sp x dp group),
// because it is collective and must be called identically everywhere. Returns the three
// this rank belongs to. What a split costs is the group's: the threads group makes all
// of a kind's groups in one meeting of the ranks; NCCL's uses the default split, one
// new_group (one ncclCommSplit over the whole world) per group, so a mesh of sp x dp
// ranks makes dp + sp + 1 of them.
MeshGroups build_mesh_groups(const Mesh& mesh, ProcessGroup& world);

}  // namespace seqpar::dist
