// nn/cuda/dropout.cu against the CPU path: the mask, the values and the gradient are the
// CPU's bit for bit (the kernel computes the same Philox words and compares them with
// the same threshold), for any offset, first row, stride and grid.
#include <catch2/catch.hpp>

#include <random>

#include "autograd/variable.h"
#include "core/device.h"
#include "core/generator.h"
#include "nn/cuda/dropout.h"
#include "nn/dropout.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;

namespace {

void check_dropout_case(int64_t rows, int64_t columns, float p, uint64_t offset, int64_t first_row,
                        bool strided) {
  const uint64_t seed = std::random_device{}();
  INFO(rows << " x " << columns << " p " << p << " offset " << offset << " first_row "
            << first_row << (strided ? ", strided" : "") << " seed " << seed);
  const Device gpu = Device::cuda();
  Generator generator(seed);
  const Tensor wide = generator.randn({rows, strided ? columns + 7 : columns});
  const Tensor x = wide.narrow(1, strided ? 3 : 0, columns);
  const Tensor x_gpu = wide.to(gpu).narrow(1, strided ? 3 : 0, columns);
  const nn::DropoutMask mask{p, seed, offset, first_row};
  test::poison_pool(gpu);
  CHECK(test::bitwise_equal(nn::dropout_forward(x_gpu, mask), nn::dropout_forward(x, mask)));
  test::poison_pool(gpu);
  CHECK(test::bitwise_equal(nn::dropout_keep_mask(rows, columns, mask, gpu),
                            nn::dropout_keep_mask(rows, columns, mask)));
  const Tensor g = generator.randn({rows, columns});
  test::poison_pool(gpu);
  CHECK(test::bitwise_equal(nn::dropout_backward(g.to(gpu), mask), nn::dropout_backward(g, mask)));
#ifdef SEQPAR_WITH_CUDA
  // The launcher directly, into a poisoned output: every element written.
  const Tensor out = test::poisoned({rows, columns}, gpu);
  const nn::detail::DropoutLaunch launch{seed, offset + static_cast<uint64_t>(first_row * columns),
                                         nn::dropout_keep_threshold(p), nn::dropout_scale(p)};
  nn::detail::dropout_cuda(x_gpu, rows, columns, launch, out);
  CHECK(test::bitwise_equal(out, nn::dropout_forward(x, mask)));
#endif
}

}  // namespace

TEST_CASE("dropout on the GPU equals the CPU bit for bit", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  check_dropout_case(1, 1, 0.1f, 0, 0, false);
  check_dropout_case(7, 5, 0.5f, 3, 2, true);
  check_dropout_case(333, 37, 0.25f, 1, 1000, false);
  check_dropout_case(12000, 16, 0.1f, 0, 0, false);        // the output shape
  check_dropout_case(3000, 16, 0.1f, 0, 9000, true);       // its last sp-4 shard
  check_dropout_case(1000, 1000, 0.9f, 262143, 5, false);  // past the stream's first step
  check_dropout_case(5, 3, 0.0f, (uint64_t{1} << 40) + 2, 7, false);
  check_dropout_case(64, 1, 0.3f, 2, 0, true);
}

TEST_CASE("a GPU shard with its first row draws the sequence's mask for its rows", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(std::random_device{}());
  const Tensor x = generator.randn({1001, 37}, gpu);
  const Tensor whole = nn::dropout_forward(x, {0.1f, 11, 6, 0});
  int64_t first_row = 0;
  for (const Tensor& shard : x.tensor_split(4)) {
    CHECK(test::bitwise_equal(nn::dropout_forward(shard, {0.1f, 11, 6, first_row}),
                              whole.narrow(0, first_row, shard.size(0))));
    first_row += shard.size(0);
  }
}

TEST_CASE("dropout's autograd on the GPU equals the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(std::random_device{}());
  const Tensor x = generator.randn({129, 33});
  const Tensor g = generator.randn({129, 33});
  autograd::Variable x_cpu(x, true), x_gpu(x.to(gpu), true);
  nn::dropout(x_cpu, 0.4f, 5, 7, 3).backward(g);
  nn::dropout(x_gpu, 0.4f, 5, 7, 3).backward(g.to(gpu));
  CHECK(test::bitwise_equal(x_gpu.grad(), x_cpu.grad()));
}
