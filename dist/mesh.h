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
// Sequence parallelism may itself be two-level (USP, as yunchang lays it out:
// sp = ulysses x cp). Within each sequence-parallel group the Ulysses groups are
// neighbouring ranks and the context-parallel groups strided by the Ulysses degree:
//
//   world 16 = sp 8 x dp 2, sp 8 = ulysses 2 x cp 4
//   ulysses groups:          ulysses[0-1] ulysses[2-3] ... ulysses[14-15]
//   context-parallel groups: cp[0,2,4,6] cp[1,3,5,7] cp[8,10,12,14] cp[9,11,13,15]
//
// so rank r sits at ulysses_rank = r % ulysses, cp_rank = (r / ulysses) % cp, and
// sp_rank = r % sp = cp_rank * ulysses + ulysses_rank. The all-to-alls of Ulysses, the
// heavier traffic per byte of sequence, stay among neighbours (inside a node); the
// all-gathers of context parallelism cross them. A mesh of sp x dp is ulysses sp x cp 1.
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
  int ulysses_rank = 0;  // sp_rank % ulysses
  int cp_rank = 0;       // sp_rank / ulysses
};

class Mesh {
 public:
  // Rejects sizes that are not positive, an sp that does not divide the world, and
  // sp x dp != world, naming the values.
  Mesh(int world_size, int sp_size, int dp_size);
  // world = ulysses x cp x dp (sp = ulysses x cp). Rejects sizes that are not positive
  // and a product that is not the world, naming the values.
  Mesh(int world_size, int ulysses_size, int cp_size, int dp_size);

  int world_size() const { return world_size_; }
  int sp_size() const { return sp_size_; }
  int dp_size() const { return dp_size_; }
  int ulysses_size() const { return ulysses_size_; }
  int cp_size() const { return cp_size_; }

  MeshCoordinates coordinates(int rank) const;
  // dp_size groups of sp_size consecutive ranks.
  const std::vector<std::vector<int>>& sp_groups() const { return sp_groups_; }
  // sp_size groups of dp_size ranks, sp_size apart.
  const std::vector<std::vector<int>>& dp_groups() const { return dp_groups_; }
  const std::vector<int>& sp_dp_group() const { return sp_dp_group_; }
  // dp x cp groups of ulysses neighbouring ranks.
  const std::vector<std::vector<int>>& ulysses_groups() const { return ulysses_groups_; }
  // dp x ulysses groups of cp ranks, ulysses apart, inside one sequence-parallel group.
  const std::vector<std::vector<int>>& cp_groups() const { return cp_groups_; }
  const std::vector<int>& sp_group_of(int rank) const;
  const std::vector<int>& dp_group_of(int rank) const;
  const std::vector<int>& ulysses_group_of(int rank) const;
  const std::vector<int>& cp_group_of(int rank) const;

  // A few lines: the sizes, every group, and each rank's coordinates (the Ulysses and
  // context-parallel ones only when cp > 1: an sp x dp mesh prints as it always has).
  std::string str() const;

 private:
  void check_rank(int rank) const;

  int world_size_, sp_size_, dp_size_, ulysses_size_, cp_size_;
  std::vector<std::vector<int>> sp_groups_;
  std::vector<std::vector<int>> dp_groups_;
  std::vector<int> sp_dp_group_;
  std::vector<std::vector<int>> ulysses_groups_;
  std::vector<std::vector<int>> cp_groups_;
};

// Group names as they appear in messages: "sp[0-3]", "dp[1,5]", "sp_dp[0-7]".
std::string sp_group_name(const std::vector<int>& ranks);
std::string dp_group_name(const std::vector<int>& ranks);
std::string sp_dp_group_name(const std::vector<int>& ranks);
std::string ulysses_group_name(const std::vector<int>& ranks);  // "ulysses[0-1]"
std::string cp_group_name(const std::vector<int>& ranks);       // "cp[0,2,4,6]"

// This rank's groups of a mesh.
struct MeshGroups {
  MeshCoordinates coordinates;
  std::shared_ptr<ProcessGroup> sp_group;
  std::shared_ptr<ProcessGroup> dp_group;
  std::shared_ptr<ProcessGroup> sp_dp_group;
  // Sequence parallelism's two levels. A level of degree 1 has no group (nullptr: its
  // layer takes nn::single_rank_group()); a level that is the whole of sp is sp_group.
  std::shared_ptr<ProcessGroup> ulysses_group;
  std::shared_ptr<ProcessGroup> cp_group;
};

// Collective over `world` (whose ranks must be the mesh's world ranks 0..N-1):
// creates every group of the mesh, one ProcessGroup::split per kind of group, in one
// fixed order on every rank (the sp groups; the Ulysses and then the context-parallel
// groups when both degrees exceed 1; the dp groups; the sp x dp group), because it is
// collective and must be called identically everywhere: which kinds are made depends on
// the mesh alone, the same on every rank. Returns the groups this rank belongs to. What
// a split costs is the group's: the threads group makes all of a kind's groups in one
// meeting of the ranks; NCCL's uses the default split, one new_group (one ncclCommSplit
// over the whole world) per group, so a mesh of sp x dp ranks makes dp + sp + 1 of them,
// and one of ulysses x cp x dp with both levels above 1 dp · (cp + ulysses) more.
MeshGroups build_mesh_groups(const Mesh& mesh, ProcessGroup& world);

}  // namespace seqpar::dist
