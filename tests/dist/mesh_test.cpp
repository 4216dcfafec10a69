// Mesh layouts: contiguous sequence-parallel groups, strided data-parallel groups,
// coordinates, the printed layout, and the sizes it refuses.
#include <catch2/catch.hpp>

#include "core/error.h"
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
