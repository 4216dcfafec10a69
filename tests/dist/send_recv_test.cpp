// send_recv on the threads group: a ring step over 1 to 8 ranks, a pairing that is not a
// ring, sub-groups of a mesh, against each sender's own fresh random input, bit for bit;
// and the refusals (mismatched shapes, a peer out of range, pairs that do not match),
// each naming what was wrong.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "dist/local_process_group.h"
#include "tests/dist/dist_test_util.h"

using namespace seqpar;
using Catch::Matchers::Contains;

namespace {

// Every rank sends its input to send_to(rank, size) and receives from the rank that sends
// to it; returns what each received.
template <typename SendTo>
std::vector<std::vector<float>> exchange(const std::vector<Tensor>& inputs, SendTo send_to, Device device) {
  const int size = static_cast<int>(inputs.size());
  std::vector<std::vector<float>> received(inputs.size());
  dist::run_local_world(size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const int rank = world->rank();
    int from = -1;
    for (int r = 0; r < size; ++r) from = send_to(r, size) == rank ? r : from;
    const Tensor mine = inputs[static_cast<size_t>(rank)].to(device);
    Tensor output = Tensor::full(mine.shape(), -1.0f, device);
    world->send_recv(output, mine, send_to(rank, size), from);
    received[static_cast<size_t>(rank)] = output.to_vector();
  });
  return received;
}

void check_ring_and_reversal(Device device) {
  for (int size = 1; size <= 8; ++size) {
    const auto inputs = test::rank_inputs(size, {3, 7}, 300 + static_cast<uint64_t>(size));
    const auto ring = exchange(inputs, [](int r, int n) { return (r + 1) % n; }, device);
    const auto reversed = exchange(inputs, [](int r, int n) { return n - 1 - r; }, device);
    for (int rank = 0; rank < size; ++rank) {
      INFO("world " << size << ", rank " << rank);
      CHECK(test::same_bits(ring[static_cast<size_t>(rank)],
                            inputs[static_cast<size_t>((rank + size - 1) % size)].to_vector()));
      CHECK(test::same_bits(reversed[static_cast<size_t>(rank)],
                            inputs[static_cast<size_t>(size - 1 - rank)].to_vector()));
    }
  }
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("send_recv: a ring step and a reversal over 1 to 8 ranks deliver the sender's bits", "[dist][cpu]") {
  check_ring_and_reversal(Device::cpu());
}

TEST_CASE("ring_step: size steps carry every input around the ring, in place", "[dist][cpu]") {
  const int size = 5;
  const auto inputs = test::rank_inputs(size, {4, 2, 3}, 400);
  std::vector<std::vector<std::vector<float>>> seen(size);
  dist::run_local_world(size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor travelling = inputs[static_cast<size_t>(world->rank())].clone();
    for (int step = 0; step < size; ++step) {
      world->ring_step(travelling, travelling);
      seen[static_cast<size_t>(world->rank())].push_back(travelling.to_vector());
    }
  });
  for (int rank = 0; rank < size; ++rank) {
    for (int step = 0; step < size; ++step) {
      INFO("rank " << rank << ", step " << step + 1);
      const int origin = ((rank - step - 1) % size + size) % size;
      CHECK(test::same_bits(seen[static_cast<size_t>(rank)][static_cast<size_t>(step)],
                            inputs[static_cast<size_t>(origin)].to_vector()));
    }
  }
}

TEST_CASE("send_recv on a strided sub-group uses its group ranks; a strided output changes only the view",
          "[dist][cpu]") {
  const auto inputs = test::rank_inputs(6, {2, 5}, 500);
  std::vector<std::vector<float>> full(6);
  dist::run_local_world(6, [&](std::shared_ptr<dist::ProcessGroup> world) {
    // Two groups of three, strided: {0, 2, 4} and {1, 3, 5}.
    const auto group = world->split({{0, 2, 4}, {1, 3, 5}}, {"cp[0,2,4]", "cp[1,3,5]"});
    Tensor wide = Tensor::full({2, 9}, 7.0f);
    Tensor columns = wide.narrow(1, 2, 5);  // not contiguous
    group->ring_step(columns, inputs[static_cast<size_t>(world->rank())]);
    full[static_cast<size_t>(world->rank())] = wide.to_vector();
  });
  for (int rank = 0; rank < 6; ++rank) {
    INFO("rank " << rank);
    const int from = (rank + 6 - 2) % 6;  // the previous member of its group, two world ranks back
    const std::vector<float> source = inputs[static_cast<size_t>(from)].to_vector();
    const std::vector<float>& got = full[static_cast<size_t>(rank)];
    bool ok = true;
    for (int row = 0; row < 2; ++row) {
      for (int column = 0; column < 9; ++column) {
        const float want = column >= 2 && column < 7 ? source[static_cast<size_t>(row * 5 + column - 2)] : 7.0f;
        ok = ok && got[static_cast<size_t>(row * 9 + column)] == want;
      }
    }
    CHECK(ok);
  }
}

TEST_CASE("send_recv refuses mismatched shapes, peers out of range and pairs that do not match", "[dist][cpu]") {
  std::vector<std::string> errors(3);
  dist::run_local_world(3, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const Tensor mine = Tensor::ones({world->rank() == 1 ? 5 : 4, 2});
    Tensor output = Tensor::empty(mine.shape());
    errors[static_cast<size_t>(world->rank())] = error_of([&] { world->ring_step(output, mine); });
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Contains("send_recv on group world: rank 1 passed [5, 2]") && Contains("rank 0 passed [4, 2]"));
  }

  std::fill(errors.begin(), errors.end(), "");
  dist::run_local_world(3, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor output = Tensor::empty({2});
    // Rank 0 and 1 both send to 2, who receives from 0: rank 1's send has no receiver.
    const int to = world->rank() == 2 ? 0 : 2, from = world->rank() == 0 ? 2 : 0;
    errors[static_cast<size_t>(world->rank())] =
        error_of([&] { world->send_recv(output, Tensor::ones({2}), to, from); });
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Contains("rank 1 sends to group rank 2 (rank 2) but that rank receives from group rank 0"));
  }

  dist::run_local_world(1, [](std::shared_ptr<dist::ProcessGroup> world) {
    Tensor output = Tensor::empty({2});
    CHECK_THROWS_WITH(world->send_recv(output, Tensor::ones({2}), 1, 0),
                      Contains("send_recv on group world: send_to 1 is not a rank of a group of 1"));
    CHECK_THROWS_WITH(world->send_recv(output, Tensor::ones({2}), 0, -1),
                      Contains("receive_from -1 is not a rank of a group of 1"));
    CHECK_THROWS_WITH(world->send_recv(output, Tensor::ones({3}), 0, 0),
                      Contains("output [2] on cpu should be the input's [3]"));
  });
}

TEST_CASE("send_recv with the ranks sharing one GPU delivers the sender's bits", "[dist][cuda]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  check_ring_and_reversal(Device::cuda(0));
}
