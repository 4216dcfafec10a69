// core/elementwise.cu against the CPU loop: bitwise, since both round the two
// products and the sum separately (no FMA on either side).
#include <catch2/catch.hpp>

#include "core/elementwise.h"
#include "core/generator.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::bitwise_equal;

TEST_CASE("axpby on the GPU matches the CPU bitwise", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  const Device gpu = Device::cuda();
  Generator generator(7);
  // 1 and 17 take only the scalar kernel; the others the float4 kernel and a tail.
  for (int64_t count : {int64_t{1}, int64_t{17}, int64_t{4096}, int64_t{333 * 640 + 3}}) {
    // Offsets 0 and 1 element: aligned (vector path) and misaligned (scalar path) views.
    for (int64_t offset : {0, 1}) {
      const Tensor a = generator.randn({count + offset}).narrow(0, offset, count);
      const Tensor b = generator.randn({count + offset}).narrow(0, offset, count);
      const float alpha = 0.37f, beta = -1.9f;
      Tensor expected = Tensor::empty({count});
      detail::axpby(expected.data(), a.data(), alpha, b.data(), beta, count, Device::cpu());
      Tensor expected_scaled = Tensor::empty({count});
      detail::axpby(expected_scaled.data(), a.data(), alpha, nullptr, 0.0f, count,
                    Device::cpu());

      Tensor a_gpu = Tensor::zeros({count + offset}, gpu).narrow(0, offset, count);
      Tensor b_gpu = Tensor::zeros({count + offset}, gpu).narrow(0, offset, count);
      a_gpu.copy_(a);
      b_gpu.copy_(b);
      const Tensor out = test::poisoned({count + offset}, gpu).narrow(0, offset, count);
      detail::axpby_cuda(out.data(), a_gpu.data(), alpha, b_gpu.data(), beta, count, 0);
      CHECK(bitwise_equal(out, expected));
      detail::axpby_cuda(out.data(), a_gpu.data(), alpha, nullptr, 0.0f, count, 0);
      CHECK(bitwise_equal(out, expected_scaled));
      // In place, as add_ and mul_ use it: out aliases a.
      Tensor in_place = a_gpu.clone();
      detail::axpby_cuda(in_place.data(), in_place.data(), alpha, b_gpu.data(), beta, count, 0);
      CHECK(bitwise_equal(in_place, expected));
    }
  }
#endif
}

TEST_CASE("elementwise ops on GPU tensors match the CPU bitwise", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const Device gpu = Device::cuda();
  Generator generator(8);
  const Tensor a = generator.randn({333, 17}), b = generator.randn({333, 17});
  const Tensor a_gpu = a.to(gpu), b_gpu = b.to(gpu);
  test::poison_pool(gpu);
  CHECK(bitwise_equal(add(a_gpu, b_gpu), add(a, b)));
  CHECK(bitwise_equal(sub(a_gpu, b_gpu), sub(a, b)));
  CHECK(bitwise_equal(mul(a_gpu, 0.1f), mul(a, 0.1f)));
  // Strided views go through contiguous() first.
  CHECK(bitwise_equal(add(a_gpu.narrow(1, 3, 5), b_gpu.narrow(1, 2, 5)),
                      add(a.narrow(1, 3, 5), b.narrow(1, 2, 5))));
  Tensor accumulated = a.clone(), accumulated_gpu = a_gpu.clone();
  add_(accumulated, b);
  add_(accumulated_gpu, b_gpu);
  mul_(accumulated, 1.0f / 3.0f);
  mul_(accumulated_gpu, 1.0f / 3.0f);
  CHECK(bitwise_equal(accumulated_gpu, accumulated));
}
