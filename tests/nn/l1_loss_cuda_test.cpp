// nn/cuda/l1_loss.cu against the CPU path, every reduction, strided inputs: the forward is
// an exact sum (nn/l1_loss.h), so the GPU's loss is bitwise the CPU's.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/cuda/l1_loss.h"
#include "nn/l1_loss.h"
#include "tests/cuda_test_util.h"
#include "tests/nn/l1_loss_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;

namespace {

void check_l1_case(int64_t rows, int64_t cols, bool strided) {
  INFO(rows << " x " << cols << (strided ? ", strided" : ""));
  const Device gpu = Device::cuda();
  Generator generator(rows * 131 + cols);
  // Strided: windows of wider tensors, as the target x[:, :16] of x [n, 640].
  const Tensor input_wide = generator.randn({rows, strided ? cols + 9 : cols});
  Tensor target_wide = generator.randn({rows, strided ? 2 * cols + 1 : cols});
  const Tensor input = input_wide.narrow(1, 0, cols);
  Tensor target = target_wide.narrow(1, strided ? cols : 0, cols);
  // A tie (input == target) at [0, 0]: its gradient is 0.
  target.narrow(0, 0, 1).narrow(1, 0, 1).copy_(input.narrow(0, 0, 1).narrow(1, 0, 1));
  const Tensor input_gpu = input_wide.to(gpu).narrow(1, 0, cols);
  const Tensor target_gpu = target_wide.to(gpu).narrow(1, strided ? cols : 0, cols);

  for (const nn::Reduction reduction :
       {nn::Reduction::mean(), nn::Reduction::sum(), nn::Reduction::sum_divided_by(7)}) {
    INFO("reduction kind " << static_cast<int>(reduction.kind));
    const float scale = static_cast<float>(reduction.scale(rows * cols));
    const Tensor loss_expected = nn::l1_loss_forward(input, target, reduction);
    const Tensor grad_loss = Tensor::from_data({}, {0.37f});
    const Tensor grad_expected = nn::l1_loss_backward(grad_loss, input, target, reduction);
#ifdef SEQPAR_WITH_CUDA
    const Tensor loss = test::poisoned({}, gpu);
    nn::detail::l1_loss_forward_cuda(input_gpu, target_gpu, scale, loss);
    CHECK(test::bitwise_equal(loss, loss_expected));
    const Tensor grad = test::poisoned({rows, cols}, gpu);
    nn::detail::l1_loss_backward_cuda(grad_loss.to(gpu), input_gpu, target_gpu, scale, grad);
    // ± one float, grad_loss * scale rounded once: the CPU forms it from the double
    // scale, the launcher gets the scale as a float, so 1/numel and 1/7 may round to
    // a neighbouring float (at most 1 ulp); with scale 1 (sum) it is bitwise.
    CHECK(test::max_ulp_distance(grad, grad_expected) <= 1);
    CHECK(grad.at({0, 0}) == 0.0f);
#endif
    test::poison_pool(gpu);
    CHECK(test::bitwise_equal(nn::l1_loss_forward(input_gpu, target_gpu, reduction), loss_expected));
    CHECK(test::max_ulp_distance(nn::l1_loss_backward(grad_loss.to(gpu), input_gpu, target_gpu,
                                                      reduction),
                                 grad_expected) <= 1);
  }
}

}  // namespace

TEST_CASE("l1 loss forward and backward on the GPU match the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (int64_t rows : {1, 17, 333, 12000}) {
    for (int64_t cols : {1, 16, 1000}) {
      if (rows * cols > 12000 * 16) continue;  // keep the suite fast
      check_l1_case(rows, cols, false);
    }
  }
  check_l1_case(12000, 16, true);  // the loss
  check_l1_case(17, 16, true);
  check_l1_case(1, 1, true);
}

TEST_CASE("l1 loss on the GPU: contiguous rows at any offset, read four at a time or one",
          "[cuda]") {
  // Rows [first, first + rows) of contiguous tensors: a 16-byte-aligned start (the
  // float4 walks) or not (the element walks), and counts not a multiple of 4 (their
  // tails); the forward and the backward.
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(23);
  for (const int64_t cols : {1, 3, 4, 7, 640}) {
    const Tensor input = generator.randn({301, cols}), target = generator.randn({301, cols});
    const Tensor input_gpu = input.to(gpu), target_gpu = target.to(gpu);
    for (const int64_t first : {0, 1, 4, 5}) {
      for (const int64_t rows : {1, 2, 3, 9, 257, 296}) {
        CAPTURE(cols, first, rows);
        const Tensor want = nn::l1_loss_forward(input.narrow(0, first, rows),
                                                target.narrow(0, first, rows), nn::Reduction::mean());
        const Tensor got = nn::l1_loss_forward(input_gpu.narrow(0, first, rows),
                                               target_gpu.narrow(0, first, rows), nn::Reduction::mean());
        CHECK(test::bitwise_equal(got, want));
        // each operand at its own offset: one aligned, the other not
        const Tensor mixed = nn::l1_loss_forward(input_gpu.narrow(0, first, rows),
                                                 target_gpu.narrow(0, 5 - first, rows),
                                                 nn::Reduction::sum());
        CHECK(test::bitwise_equal(mixed, nn::l1_loss_forward(input.narrow(0, first, rows),
                                                             target.narrow(0, 5 - first, rows),
                                                             nn::Reduction::sum())));
        // the backward's walks likewise (sum: the gradient's factor is exact on both sides)
        const Tensor grad_loss = Tensor::from_data({}, {0.37f});
        CHECK(test::bitwise_equal(
            nn::l1_loss_backward(grad_loss.to(gpu), input_gpu.narrow(0, first, rows),
                                 target_gpu.narrow(0, 5 - first, rows), nn::Reduction::sum()),
            nn::l1_loss_backward(grad_loss, input.narrow(0, first, rows),
                                 target.narrow(0, 5 - first, rows), nn::Reduction::sum())));
      }
    }
  }
}

TEST_CASE("l1 loss on the GPU is bitwise reproducible", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(5);
  const Tensor input = generator.randn({12000, 16}, gpu);
  const Tensor target = generator.randn({12000, 640}, gpu).narrow(1, 0, 16);
  const Tensor first = nn::l1_loss_forward(input, target, nn::Reduction::mean());
  test::poison_pool(gpu);
  CHECK(test::bitwise_equal(nn::l1_loss_forward(input, target, nn::Reduction::mean()), first));
}

TEST_CASE("l1 loss on the GPU is bitwise the CPU's for wide ranges and special values (seed 11)",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-60, 60);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t rows = trial < 4 ? 1 + 37 * trial : 70001, cols = 1 + trial % 3 * 7;
    std::vector<float> a(static_cast<size_t>(rows * cols)), b(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = std::ldexp(normal(rng), exponent(rng));
      b[i] = i % 3 == 0 ? std::ldexp(static_cast<float>(i % 1000), -149)  // subnormals
                        : std::ldexp(normal(rng), exponent(rng));
      if (i % 3 == 0) a[i] = std::ldexp(static_cast<float>(i % 777), -149);
    }
    if (trial == 5) a[a.size() / 2] = inf;
    if (trial == 6) b[7] = nan;
    if (trial == 7) a[3] = b[3] = -inf;  // inf - inf
    CAPTURE(trial, rows, cols);
    const Tensor input = Tensor::from_data({rows, cols}, a), target = Tensor::from_data({rows, cols}, b);
    for (const nn::Reduction reduction :
         {nn::Reduction::mean(), nn::Reduction::sum(), nn::Reduction::sum_divided_by(3)}) {
      const Tensor expected = nn::l1_loss_forward(input, target, reduction);
      test::poison_pool(gpu);
      const Tensor loss = nn::l1_loss_forward(input.to(gpu), target.to(gpu), reduction);
      const float x = loss.item(), y = expected.item();
      CAPTURE(static_cast<int>(reduction.kind), x, y);
      CHECK((test::bitwise_equal(loss.to(Device::cpu()), expected) || (std::isnan(x) && std::isnan(y))));
    }
  }
}

TEST_CASE("l1 loss through autograd on the GPU keeps the forward's signs: the CPU's gradients bitwise (seed 37)",
          "[cuda]") {
  // The signs are written by the forward's flat walk (contiguous, aligned: codes four at
  // a time, and a tail) or its element walk (an unaligned start, a strided target), and
  // read back by the backward's; the corner cases (zeros of either sign, infinities,
  // NaN) are among ordinary values. Input's and target's gradients, and the compute
  // functions', against the CPU's.
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  std::mt19937_64 rng(37);
  for (const int64_t cols : {1, 3, 16, 640}) {
    for (const int64_t first : {0, 1}) {
      for (const int64_t rows : {1, 9, 257}) {
        for (const bool strided : {false, true}) {
          CAPTURE(cols, first, rows, strided);
          const auto [input_all, target_all] =
              test::l1::with_sign_corners(rng, {first + rows, strided ? cols + 5 : cols});
          const Tensor input = input_all.narrow(1, 0, cols).narrow(0, first, rows);
          const Tensor target = target_all.narrow(1, strided ? 5 : 0, cols).narrow(0, first, rows);
          const Tensor input_gpu = input_all.to(gpu).narrow(1, 0, cols).narrow(0, first, rows);
          const Tensor target_gpu =
              target_all.to(gpu).narrow(1, strided ? 5 : 0, cols).narrow(0, first, rows);
          for (const nn::Reduction reduction :
               {nn::Reduction::mean(), nn::Reduction::sum(), nn::Reduction::sum_divided_by(7)}) {
            CAPTURE(static_cast<int>(reduction.kind));
            autograd::Variable in_cpu(input, true), tg_cpu(target, true);
            autograd::mul(nn::l1_loss(in_cpu, tg_cpu, reduction), -0.37f).backward();
            test::poison_pool(gpu);
            autograd::Variable in_gpu(input_gpu, true), tg_gpu(target_gpu, true);
            autograd::mul(nn::l1_loss(in_gpu, tg_gpu, reduction), -0.37f).backward();
            CHECK(test::same_bits(in_gpu.grad().to(Device::cpu()), in_cpu.grad()));
            CHECK(test::same_bits(tg_gpu.grad().to(Device::cpu()), tg_cpu.grad()));

            nn::L1Signs signs;
            const Tensor loss = nn::l1_loss_forward(input_gpu, target_gpu, reduction, &signs);
            CHECK(test::same_bits(loss.to(Device::cpu()), nn::l1_loss_forward(input, target, reduction)));
            const Tensor grad_loss = Tensor::from_data({}, {0.37f});
            CHECK(test::same_bits(nn::l1_loss_backward(grad_loss.to(gpu), signs, reduction).to(Device::cpu()),
                                  nn::l1_loss_backward(grad_loss, input, target, reduction)));
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- row mask

namespace {

// The masked loss and its gradients (the compute functions and autograd, input and
// target) on the GPU against the CPU's, bit for bit: which rows count decides the
// terms, and the CPU and GPU form and sum the same terms.
void check_masked_case(int64_t rows, int64_t cols, bool strided, double keep, uint64_t seed) {
  INFO(rows << " x " << cols << (strided ? ", strided" : "") << ", keep " << keep);
  const Device gpu = Device::cuda();
  Generator generator(seed);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution kept(keep);
  std::vector<float> mask_values(static_cast<size_t>(rows));
  for (float& value : mask_values) value = kept(rng) ? 1.0f : 0.0f;
  const Tensor mask = Tensor::from_data({rows}, mask_values);
  const Tensor input_wide = generator.randn({rows, strided ? cols + 9 : cols});
  const Tensor target_wide = generator.randn({rows, strided ? 2 * cols + 1 : cols});
  const Tensor input = input_wide.narrow(1, 0, cols);
  const Tensor target = target_wide.narrow(1, strided ? cols : 0, cols);
  // A NaN in the first masked row, if any: it must not reach the loss on either device.
  for (int64_t row = 0; row < rows; ++row) {
    if (mask_values[static_cast<size_t>(row)] == 0.0f) {
      input.set({row, 0}, std::numeric_limits<float>::quiet_NaN());
      break;
    }
  }
  const Tensor input_gpu = input_wide.to(gpu).narrow(1, 0, cols);
  const Tensor target_gpu = target_wide.to(gpu).narrow(1, strided ? cols : 0, cols);
  const Tensor mask_gpu = mask.to(gpu);
  const Tensor grad_loss = Tensor::from_data({}, {0.37f});

  for (const nn::Reduction reduction :
       {nn::Reduction::mean(), nn::Reduction::sum(), nn::Reduction::sum_divided_by(7)}) {
    INFO("reduction kind " << static_cast<int>(reduction.kind));
    const Tensor loss_expected = nn::l1_loss_forward(input, target, reduction, mask);
    const Tensor grad_expected = nn::l1_loss_backward(grad_loss, input, target, reduction, mask);
    test::poison_pool(gpu);
    const Tensor loss = nn::l1_loss_forward(input_gpu, target_gpu, reduction, mask_gpu);
    const float x = loss.item(), y = loss_expected.item();
    CAPTURE(x, y);
    CHECK((test::bitwise_equal(loss.to(Device::cpu()), loss_expected) ||
           (std::isnan(x) && std::isnan(y))));
    test::poison_pool(gpu);
    CHECK(test::bitwise_equal(
        nn::l1_loss_backward(grad_loss.to(gpu), input_gpu, target_gpu, reduction, mask_gpu)
            .to(Device::cpu()),
        grad_expected));

    // Through autograd, both gradients.
    autograd::Variable in_cpu(input.contiguous(), true), tg_cpu(target.contiguous(), true);
    autograd::Variable in_gpu(input_gpu.contiguous(), true), tg_gpu(target_gpu.contiguous(), true);
    nn::l1_loss(in_cpu, tg_cpu, reduction, mask).backward();
    test::poison_pool(gpu);
    nn::l1_loss(in_gpu, tg_gpu, reduction, mask_gpu).backward();
    CHECK(test::bitwise_equal(in_gpu.grad().to(Device::cpu()), in_cpu.grad()));
    CHECK(test::bitwise_equal(tg_gpu.grad().to(Device::cpu()), tg_cpu.grad()));
  }
}

}  // namespace

TEST_CASE("l1 loss with a row mask on the GPU is bitwise the CPU's", "[cuda][mask]") {
  SEQPAR_REQUIRE_CUDA();
  uint64_t seed = 70;
  for (int64_t rows : {1, 17, 333, 12000}) {
    for (int64_t cols : {1, 16, 1000}) {
      if (rows * cols > 12000 * 16) continue;  // keep the suite fast
      for (double keep : {1.0, 0.7, 0.1}) check_masked_case(rows, cols, false, keep, ++seed);
    }
  }
  check_masked_case(12000, 16, true, 0.8, ++seed);
  check_masked_case(17, 16, true, 0.5, ++seed);
  check_masked_case(5, 3, false, 0.0, ++seed);  // every row masked: NaN mean, +0 gradients
}

TEST_CASE("l1 loss on the GPU rejects a row mask on another device or of another shape",
          "[cuda][mask]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  const Tensor a = Tensor::zeros({4, 3}, gpu);
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, nn::Reduction::sum(), Tensor::ones({4})),
                    Catch::Contains("row_mask is on cpu but the inputs are on cuda"));
  CHECK_THROWS_WITH(nn::l1_loss_forward(a, a, nn::Reduction::sum(), Tensor::ones({3}, gpu)),
                    Catch::Contains("row_mask must have shape [4] (one value per row), got shape [3]"));
  CHECK_THROWS_WITH(
      nn::l1_loss_forward(a, a, nn::Reduction::sum(), Tensor::from_data({4}, {1, 0, 3, 1}, gpu)),
      Catch::Contains("holds 3 at row 2"));
}

TEST_CASE("l1 loss on the GPU past 2^28 terms equals its closed form", "[cuda][large]") {
  // More terms than the exact sums held before their bins were nine of 31 bits (2^28,
  // which check_term_count enforced): a loss this long was refused. Column j holds
  // j / 256 in every row, so the sum is rows * (0 + 1 + ... + 256) / 256, exact in
  // double; and the mean's terms, (float)(1/n) * j / 256, sum to that times the float.
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  const int64_t rows = (int64_t{1} << 20) + 1, cols = 257;
  REQUIRE(rows * cols > (int64_t{1} << 28));
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % cols) / 256.0f;
  const Tensor input = Tensor::from_data({rows, cols}, values).to(gpu);
  std::vector<float>().swap(values);
  const Tensor target = Tensor::zeros({rows, cols}, gpu);
  const double sum = static_cast<double>(rows) * (256.0 * 257.0 / 2.0) / 256.0;
  CHECK(nn::l1_loss_forward(input, target, nn::Reduction::sum()).to(Device::cpu()).item() ==
        static_cast<float>(sum));
  // (float)(1/n) has 24 significant bits and sum 29: their product is exact in double.
  const float scale = static_cast<float>(nn::Reduction::mean().scale(rows * cols));
  CHECK(nn::l1_loss_forward(input, target, nn::Reduction::mean()).to(Device::cpu()).item() ==
        static_cast<float>(static_cast<double>(scale) * sum));
}
