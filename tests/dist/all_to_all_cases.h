// The all-to-all's checks, written once for any device: the [cpu] tests run them on the
// CPU, the [cuda] tests on cuda:0 (all ranks sharing it), against the plain model of the
// permutation in tests/dist/all_to_all_model.h.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "dist/local_process_group.h"
#include "tests/dist/all_to_all_model.h"
#include "tests/dist/dist_test_util.h"

namespace seqpar::test {

// Every rank's result against the model, bit for bit; then the same exchange again,
// which must give every rank its own input back (the all-to-all is its own inverse).
inline void check_all_to_all(int world_size, const Shape& shape, Device device) {
  const auto inputs = rank_inputs(world_size, shape, 500 + static_cast<uint64_t>(world_size));
  std::vector<std::vector<float>> once(static_cast<size_t>(world_size));
  std::vector<std::vector<float>> twice(static_cast<size_t>(world_size));
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const size_t rank = static_cast<size_t>(world->rank());
    const Tensor mine = inputs[rank].to(device);
    Tensor exchanged = Tensor::full(shape, -1.0f, device);
    world->all_to_all(exchanged, mine);
    once[rank] = exchanged.to_vector();
    Tensor back = Tensor::full(shape, -1.0f, device);
    world->all_to_all(back, exchanged);
    twice[rank] = back.to_vector();
  });
  for (int rank = 0; rank < world_size; ++rank) {
    INFO("world " << world_size << ", " << shape.size()
                  << "-D, rank " << rank);
    CHECK(same_bits(once[static_cast<size_t>(rank)], all_to_all_model(inputs, rank)));
    CHECK(same_bits(twice[static_cast<size_t>(rank)], inputs[static_cast<size_t>(rank)].to_vector()));
  }
}

}  // namespace seqpar::test
