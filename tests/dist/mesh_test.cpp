// Mesh layouts: contiguous sequence-parallel groups, strided data-parallel groups, the
// two levels of sequence parallelism (ulysses x cp), coordinates, the printed layout,
// the sizes it refuses, and the groups build_mesh_groups makes.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "dist/local_process_group.h"
#include "dist/mesh.h"

using namespace seqpar;
using Catch::Matchers::Contains;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("mesh of 8 ranks, sp 4 x dp 2", "[dist]") {
  const dist::Mesh mesh(8, 4, 2);
  CHECK(mesh.sp_groups() == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(mesh.dp_groups() == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(mesh.sp_dp_group() == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(mesh.coordinates(5).sp_rank == 1);
  CHECK(mesh.coordinates(5).dp_rank == 1);
  CHECK(mesh.coordinates(3).sp_rank == 3);
  CHECK(mesh.coordinates(3).dp_rank == 0);
  CHECK(mesh.sp_group_of(5) == std::vector<int>{4, 5, 6, 7});
  CHECK(mesh.dp_group_of(5) == std::vector<int>{1, 5});
  const std::string layout = mesh.str();
  CHECK_THAT(layout, Contains("world 8 = sp 4 x dp 2"));
  CHECK_THAT(layout, Contains("sp[0-3] sp[4-7]"));
  CHECK_THAT(layout, Contains("dp[0,4] dp[1,5] dp[2,6] dp[3,7]"));
  CHECK_THAT(layout, Contains("sp_dp[0-7]"));
  CHECK_THAT(layout, Contains("5 (1, 1)"));
}

TEST_CASE("mesh of the bug report: 4 ranks, sp 4, dp 1", "[dist]") {
  const dist::Mesh mesh(4, 4, 1);
  CHECK(mesh.sp_groups() == Groups{{0, 1, 2, 3}});
  // The data-parallel groups hold one rank each: the group DeepSpeed 0.16 reduced over.
  CHECK(mesh.dp_groups() == Groups{{0}, {1}, {2}, {3}});
  CHECK(dist::dp_group_name(mesh.dp_group_of(2)) == "dp[2]");
  CHECK(dist::sp_group_name(mesh.sp_group_of(2)) == "sp[0-3]");
}

TEST_CASE("mesh with sp 1 has one-rank sequence-parallel groups", "[dist]") {
  const dist::Mesh mesh(2, 1, 2);
  CHECK(mesh.sp_groups() == Groups{{0}, {1}});
  CHECK(mesh.dp_groups() == Groups{{0, 1}});
  CHECK(mesh.coordinates(1).sp_rank == 0);
  CHECK(mesh.coordinates(1).dp_rank == 1);
}

TEST_CASE("mesh rejects sizes that do not fit, naming the values", "[dist]") {
  CHECK_THROWS_WITH(dist::Mesh(8, 3, 2), Contains("sp (3) does not divide the world size (8)"));
  CHECK_THROWS_WITH(dist::Mesh(8, 2, 2),
                    Contains("sp (2) x dp (2) = 4 does not equal the world size (8)"));
  CHECK_THROWS_WITH(dist::Mesh(0, 1, 1), Contains("sizes must be positive, got world 0"));
  CHECK_THROWS_WITH(dist::Mesh(4, 0, 4), Contains("sp 0"));
  CHECK_THROWS_WITH(dist::Mesh(4, 4, -1), Contains("dp -1"));
  CHECK_THROWS_WITH(dist::Mesh(4, 2, 2).coordinates(4), Contains("rank 4 is outside a world of 4"));
}

TEST_CASE("rank lists are labelled as runs or lists", "[dist]") {
  CHECK(dist::rank_list_label({0, 1, 2, 3}) == "0-3");
  CHECK(dist::rank_list_label({1, 5}) == "1,5");
  CHECK(dist::rank_list_label({2}) == "2");
  CHECK(dist::rank_list_label({0, 2, 3}) == "0,2,3");
}

// USP's layout (yunchang's, Ulysses' degree innermost): Ulysses groups of neighbouring
// ranks, context-parallel groups strided by the Ulysses degree inside each sp group.
TEST_CASE("mesh of 16 ranks, ulysses 2 x cp 4 x dp 2", "[dist]") {
  const dist::Mesh mesh(16, 2, 4, 2);
  CHECK(mesh.sp_size() == 8);
  CHECK(mesh.sp_groups() == Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}});
  CHECK(mesh.ulysses_groups() == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(mesh.cp_groups() == Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(mesh.dp_groups() == Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  // Rank 13: replica 1, sp_rank 5 = cp_rank 2 x ulysses 2 + ulysses_rank 1.
  const dist::MeshCoordinates at = mesh.coordinates(13);
  CHECK(at.sp_rank == 5);
  CHECK(at.dp_rank == 1);
  CHECK(at.ulysses_rank == 1);
  CHECK(at.cp_rank == 2);
  CHECK(mesh.ulysses_group_of(13) == std::vector<int>{12, 13});
  CHECK(mesh.cp_group_of(13) == std::vector<int>{9, 11, 13, 15});
  // Every rank is in exactly the groups whose lists name it.
  for (int rank = 0; rank < 16; ++rank) {
    const dist::MeshCoordinates c = mesh.coordinates(rank);
    CHECK(mesh.ulysses_group_of(rank)[static_cast<size_t>(c.ulysses_rank)] == rank);
    CHECK(mesh.cp_group_of(rank)[static_cast<size_t>(c.cp_rank)] == rank);
    CHECK(c.sp_rank == c.cp_rank * 2 + c.ulysses_rank);
  }
  const std::string layout = mesh.str();
  CHECK_THAT(layout, Contains("world 16 = sp 8 x dp 2, sp 8 = ulysses 2 x cp 4"));
  CHECK_THAT(layout, Contains("ulysses groups (neighbouring): ulysses[0-1] ulysses[2-3]"));
  CHECK_THAT(layout, Contains("context-parallel groups (strided by ulysses): cp[0,2,4,6] cp[1,3,5,7] cp[8,10,12,14]"));
  CHECK_THAT(layout, Contains("rank (ulysses_rank, cp_rank): 0 (0, 0) 1 (1, 0) 2 (0, 1)"));
}

TEST_CASE("an sp x dp mesh is ulysses sp x cp 1, printed as before", "[dist]") {
  const dist::Mesh mesh(8, 4, 2);
  CHECK(mesh.ulysses_size() == 4);
  CHECK(mesh.cp_size() == 1);
  CHECK(mesh.ulysses_groups() == mesh.sp_groups());
  CHECK(mesh.cp_groups() == Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK_THAT(mesh.str(), !Contains("ulysses"));
  const dist::Mesh cp_only(8, 1, 4, 2);
  CHECK(cp_only.cp_groups() == cp_only.sp_groups());
  CHECK(cp_only.coordinates(6).cp_rank == 2);
}

TEST_CASE("a two-level mesh rejects sizes that do not fit, naming both levels", "[dist]") {
  CHECK_THROWS_WITH(dist::Mesh(8, 2, 3, 1), Contains("sp (6 = ulysses 2 x cp 3) does not divide the world size (8)"));
  CHECK_THROWS_WITH(dist::Mesh(16, 2, 2, 2), Contains("sp (4 = ulysses 2 x cp 2) x dp (2) = 8 does not equal"));
  CHECK_THROWS_WITH(dist::Mesh(8, 2, 0, 4), Contains("got world 8, ulysses 2, cp 0, dp 4"));
}

// build_mesh_groups on threads: every rank gets the groups the mesh lists for it, made in
// one order on every rank (else the threads group refuses the mismatched splits).
TEST_CASE("build_mesh_groups makes the Ulysses and context-parallel groups of each rank", "[dist][cpu]") {
  for (const auto& [ulysses, cp] : std::vector<std::pair<int, int>>{{2, 2}, {4, 1}, {1, 4}, {1, 1}}) {
    const dist::Mesh mesh(ulysses * cp * 2, ulysses, cp, 2);
    std::vector<std::string> seen(static_cast<size_t>(mesh.world_size()));
    dist::run_local_world(mesh.world_size(), [&](std::shared_ptr<dist::ProcessGroup> world) {
      const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
      const auto describe = [](const std::shared_ptr<dist::ProcessGroup>& g) {
        return g ? g->name() + "@" + std::to_string(g->rank()) : std::string("none");
      };
      seen[static_cast<size_t>(world->rank())] = describe(groups.ulysses_group) + " " + describe(groups.cp_group);
    });
    for (int rank = 0; rank < mesh.world_size(); ++rank) {
      INFO("ulysses " << ulysses << ", cp " << cp << ", rank " << rank);
      const dist::MeshCoordinates at = mesh.coordinates(rank);
      const std::string ulysses_name = ulysses == 1 ? "none"
                                       : cp == 1    ? dist::sp_group_name(mesh.sp_group_of(rank))
                                                    : dist::ulysses_group_name(mesh.ulysses_group_of(rank));
      const std::string cp_name = cp == 1         ? "none"
                                  : ulysses == 1 ? dist::sp_group_name(mesh.sp_group_of(rank))
                                                 : dist::cp_group_name(mesh.cp_group_of(rank));
      const auto seat = [](const std::string& name, int rank) {
        return name == "none" ? name : name + "@" + std::to_string(rank);
      };
      const std::string want = seat(ulysses_name, at.ulysses_rank) + " " + seat(cp_name, at.cp_rank);
      CHECK(seen[static_cast<size_t>(rank)] == want);
    }
  }
}
