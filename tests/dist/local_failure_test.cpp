// The threads group when something goes wrong: a rank that throws, never arrives,
// or returns early; ranks that disagree on the collective. Each must end in an error
// naming the group and the operation, within the timeout: never a hang.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "dist/local_process_group.h"
#include "dist/mesh.h"

using namespace seqpar;
using Catch::Matchers::Contains;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs `call` and returns the message of the seqpar::Error it throws ("" if none).
template <typename Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

dist::LocalOptions timeout_of(int milliseconds) {
  dist::LocalOptions options;
  options.timeout = std::chrono::milliseconds(milliseconds);
  return options;
}

}  // namespace

TEST_CASE("a rank that throws releases the others at once, naming group, operation and rank",
          "[dist][cpu]") {
  std::vector<std::string> errors(4), later(4);
  std::vector<double> waited(4, 0.0);
  const auto start = Clock::now();
  // A long timeout: the release must come from the failure, not from the clock.
  REQUIRE_THROWS_WITH(
      dist::run_local_world(
          4,
          [&](std::shared_ptr<dist::ProcessGroup> world) {
            const size_t rank = static_cast<size_t>(world->rank());
            if (rank == 2) {
              std::this_thread::sleep_for(std::chrono::milliseconds(50));
              SEQPAR_FAIL("boom on purpose");
            }
            Tensor values = Tensor::ones({8});
            errors[rank] = error_of([&] { world->all_reduce(values); });
            waited[rank] = seconds_since(start);
            later[rank] = error_of([&] { world->barrier(); });  // fails at once too
          },
          timeout_of(20000)),
      Contains("rank 2 failed") && Contains("boom on purpose"));
  for (size_t rank : {0u, 1u, 3u}) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK_THAT(errors[rank], Contains("all_reduce on group world: rank 2 failed") &&
                                 Contains("boom on purpose"));
    CHECK_THAT(later[rank], Contains("barrier on group world: rank 2 failed"));
    CHECK(waited[rank] < 5.0);
  }
}

TEST_CASE("a failure inside one sub-group releases the ranks waiting in other groups",
          "[dist][cpu]") {
  std::vector<std::string> errors(4);
  std::atomic<int> first_pair_done{0};
  CHECK_THROWS(dist::run_local_world(
      4,
      [&](std::shared_ptr<dist::ProcessGroup> world) {
        const dist::Mesh mesh(4, 2, 2);
        const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
        const size_t rank = static_cast<size_t>(world->rank());
        if (rank == 2) {  // gives up once ranks 0 and 1 are through their own group
          while (first_pair_done < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          throw std::runtime_error("rank 2 gave up");
        }
        Tensor values = Tensor::ones({3});
        errors[rank] = error_of([&] {
          groups.sp_group->all_reduce(values);  // sp[0-1] completes; sp[2-3] cannot
          if (rank < 2) ++first_pair_done;
          world->barrier();  // nobody gets past this one
        });
      },
      timeout_of(20000)));
  CHECK_THAT(errors[3], Contains("all_reduce on group sp[2-3]: rank 2 failed: rank 2 gave up"));
  CHECK_THAT(errors[0], Contains("barrier on group world: rank 2 failed"));
  CHECK_THAT(errors[1], Contains("barrier on group world: rank 2 failed"));
}

TEST_CASE("a rank that never arrives: the collective times out naming it", "[dist][cpu]") {
  std::vector<std::string> errors(4);
  std::atomic<int> done{0};
  const auto start = Clock::now();
  CHECK_THROWS_WITH(
      dist::run_local_world(
          4,
          [&](std::shared_ptr<dist::ProcessGroup> world) {
            const size_t rank = static_cast<size_t>(world->rank());
            if (rank == 3) {  // stuck elsewhere: waits until the others gave up (or 10 s)
              while (done < 3 && seconds_since(start) < 10.0) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
              }
              return;
            }
            Tensor values = Tensor::ones({4});
            errors[rank] = error_of([&] { world->all_reduce(values); });
            ++done;
          },
          timeout_of(400)),
      Contains("timed out") && Contains("rank 3 never arrived"));
  const double elapsed = seconds_since(start);
  CHECK(elapsed >= 0.35);
  CHECK(elapsed < 5.0);
  for (size_t rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK_THAT(errors[rank], Contains("all_reduce on group world") &&
                                 Contains("rank 3 never arrived"));
  }
}

TEST_CASE("a rank that returns without joining releases the others at once", "[dist][cpu]") {
  std::vector<std::string> errors(3);
  const auto start = Clock::now();
  CHECK_THROWS_WITH(dist::run_local_world(
                        3,
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
                          const size_t rank = static_cast<size_t>(world->rank());
                          if (rank == 1) return;
                          errors[rank] = error_of([&] { world->barrier(); });
                        },
                        timeout_of(20000)),
                    Contains("rank 1 returned without calling barrier"));
  CHECK(seconds_since(start) < 5.0);
  CHECK_THAT(errors[0], Contains("barrier on group world") && Contains("rank 1 returned"));
  CHECK_THAT(errors[2], Contains("barrier on group world") && Contains("rank 1 returned"));
}

TEST_CASE("ranks calling different collectives get a mismatch error", "[dist][cpu]") {
  std::vector<std::string> errors(2);
  // Every rank gets the same error and the group stays usable: the ranks caught it.
  dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor values = Tensor::ones({2});
    const size_t rank = static_cast<size_t>(world->rank());
    errors[rank] = error_of([&] {
      if (rank == 0) world->all_reduce(values);
      if (rank == 1) world->broadcast(values, 0);
    });
    world->barrier();
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Contains("collective mismatch on group world") &&
                          Contains("rank 0 called all_reduce") &&
                          Contains("rank 1 called broadcast"));
  }
}

TEST_CASE("ranks passing different shapes get an error naming both", "[dist][cpu]") {
  std::vector<std::string> errors(2);
  dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor values = Tensor::ones({world->rank() + 2});
    errors[static_cast<size_t>(world->rank())] = error_of([&] { world->all_reduce(values); });
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Contains("all_reduce on group world: rank 1 passed [3]") &&
                          Contains("rank 0 passed [2]"));
  }
}

TEST_CASE("bad arguments to a collective are rejected before it starts", "[dist][cpu]") {
  dist::run_local_world(1, [](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor values = Tensor::ones({2});
    CHECK_THROWS_WITH(world->broadcast(values, 1), Contains("root 1 is not a rank"));
    CHECK_THROWS_WITH(world->new_group({0, 0}, ""), Contains("rank 0 is listed twice"));
    CHECK_THROWS_WITH(world->new_group({1}, ""), Contains("rank 1 is out of range"));
    CHECK_THROWS_WITH(world->new_group({}, ""), Contains("empty"));
    Tensor wrong = Tensor::zeros({3});
    CHECK_THROWS_WITH(world->all_gather(wrong, values), Contains("should be [2]"));
  });
  CHECK_THROWS_WITH(dist::run_local_world(0, [](auto) {}), Contains("at least 1"));
}
