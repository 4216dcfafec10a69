// The few-outputs forward with the exact L1 loss in its epilogue
// (bench/fused/kernels/forward_exact_l1.cu), the exact step's first kernel, against the unfused path it stands
// for: the forward, then the exact step's L1 kernel reading y back
// (bench/fused/kernels/exact_step.h). Every output, on the GPU.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/cuda/linear.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"
#include "tests/fused/step_test_util.h"
#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "nn/one_magnitude.h"
#endif
#include "bench/fused/kernels/exact_step.h"

using namespace seqpar;

#ifdef SEQPAR_WITH_CUDA
namespace {

// Everything the few-outputs forward with the L1 epilogue writes, copied to the host.
struct ForwardL1Words {
  std::vector<float> y, grad_y;
  std::vector<int64_t> loss_digits, bias_digits;  // kDigits words a sum, sum j at [d * out + j]
  std::vector<unsigned int> x_largest, grad_y_largest;
  std::vector<uint8_t> sign_fragments;
};

// Sum `index` of `count` sums (digit d at words[d * count + index]) as its exact value:
// the digits carried into canonical form (two launches may cut one value into digits
// differently: a block's count of signs times s is cut where the block adds it) and
// the flags word.
std::vector<int64_t> exact_value(const std::vector<int64_t>& words, int64_t count, int64_t index) {
  int64_t digits[exact::kBins];
  for (int d = 0; d < exact::kBins; ++d) digits[d] = words[static_cast<size_t>(d * count + index)];
  exact::detail::carry_digits(digits);
  std::vector<int64_t> value(digits, digits + exact::kBins);
  value.push_back(words[static_cast<size_t>(exact::kSpecialDigit * count + index)]);
  return value;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

void check_same_outputs(const ForwardL1Words& fused, const ForwardL1Words& reference, int64_t out) {
  CHECK(same_floats(fused.y, reference.y));
  CHECK(same_floats(fused.grad_y, reference.grad_y));
  CHECK(exact_value(fused.loss_digits, 1, 0) == exact_value(reference.loss_digits, 1, 0));
  for (int64_t j = 0; j < out; ++j) {
    INFO("db's sum " << j);
    CHECK(exact_value(fused.bias_digits, out, j) == exact_value(reference.bias_digits, out, j));
  }
  CHECK(fused.x_largest == reference.x_largest);
  CHECK(fused.grad_y_largest == reference.grad_y_largest);
  CHECK(fused.sign_fragments == reference.sign_fragments);
}

template <typename T>
std::vector<T> to_host(const T* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  CUDA_CHECK(cudaMemcpy(host.data(), device, sizeof(T) * host.size(), cudaMemcpyDeviceToHost));
  return host;
}

// The forward and the L1 terms on the GPU, fused (the L1 loss in the forward's epilogue)
// or not (the forward, then the L1 kernel reading y back).
ForwardL1Words forward_l1(const test::StepData& data, const Tensor& target, bool fused) {
  const Device gpu = Device::cuda();
  const Tensor x = data.x.to(gpu), weight = data.weight.to(gpu), bias = data.bias.to(gpu);
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const Tensor y = test::poisoned({rows, out}, gpu), grad_y = test::poisoned({rows, out}, gpu);
  DeviceBuffer<int64_t> loss_digits(exact::kDigits, gpu), bias_digits(exact::kDigits * out, gpu);
  DeviceBuffer<unsigned int> x_largest(in, gpu), grad_y_largest(out + 2, gpu);
  DeviceBuffer<uint8_t> fragments(fused::kernels::sign_fragment_bytes(rows), gpu);
  for (auto* words : {&loss_digits, &bias_digits}) words->zero();
  x_largest.zero();
  grad_y_largest.zero();
  fragments.zero();
  const fused::kernels::ExactL1Outputs l1{grad_y.data(),        loss_digits.data(),    bias_digits.data(), out,
                                      grad_y_largest.data(), fragments.data()};
  const float scale = static_cast<float>(nn::Reduction::mean().scale(rows * out));
  const nn::detail::ConstRows x_rows = nn::detail::const_rows_of(x);
  if (fused) {
    REQUIRE(fused::kernels::few_outputs_forward_exact_l1_fits(x_rows, out));
    fused::kernels::few_outputs_forward_exact_l1_cuda(x_rows, weight.data(), weight.stride(0), bias.data(), out,
                                             y.data(), 0, x_largest.data(),
                                             {target.data(), target.stride(0), scale}, l1);
  } else {
    nn::detail::linear_forward_cuda(x, weight, bias, y, x_largest.data());
    fused::kernels::exact_l1_cuda(y.data(), target.data(), target.stride(0), rows, out, scale, l1,
                                  cuda::current_stream(0));
  }
  cuda::synchronize(0);  // the kernels ran on the device's stream, not the legacy one
  ForwardL1Words words;
  words.y = to_host(y.data(), rows * out);
  words.grad_y = to_host(grad_y.data(), rows * out);
  words.loss_digits = to_host(loss_digits.data(), loss_digits.size());
  words.bias_digits = to_host(bias_digits.data(), bias_digits.size());
  words.x_largest = to_host(x_largest.data(), in);
  words.grad_y_largest = to_host(grad_y_largest.data(), out + 2);
  words.sign_fragments = to_host(fragments.data(), fragments.size());
  return words;
}

}  // namespace
#endif

TEST_CASE("the forward with the L1 loss in its epilogue writes what the forward and the L1 "
          "kernel write",
          "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  // Fresh random data and a NaN target (a NaN dy); the reference is the unfused path:
  // the forward, then the L1 kernel over y read back (a grid-stride loop over the
  // elements: other threads, other blocks, each thread's terms in other groups). 8 and 4
  // outputs a thread in the forward (12,000 rows and the others).
  struct Shape {
    int64_t rows, in, out;
  };
  for (const Shape& p : {Shape{12000, 640, 16}, Shape{3000, 64, 16}, Shape{777, 128, 13},
                         Shape{40, 32, 3}}) {
    const test::StepData data = test::draw_model_and_x(p.rows + 31 * p.in + p.out, p.rows, p.in, p.out);
    Tensor target = Generator(p.rows + 7).randn({p.rows, p.out});
    target.data()[(p.rows / 3) * p.out] = std::numeric_limits<float>::quiet_NaN();
    const Tensor target_gpu = target.to(Device::cuda());
    INFO("rows " << p.rows << ", in " << p.in << ", out " << p.out);
    check_same_outputs(forward_l1(data, target_gpu, /*fused=*/true),
                       forward_l1(data, target_gpu, /*fused=*/false), p.out);
  }
#endif
}

TEST_CASE("dy's sign fragments take whole steps of 32 rows, 16 bytes a row", "[fused][cpu]") {
  CHECK(fused::kernels::sign_fragment_bytes(1) == 512);
  CHECK(fused::kernels::sign_fragment_bytes(32) == 512);
  CHECK(fused::kernels::sign_fragment_bytes(33) == 2 * 512);  // whole steps, padding zeroed
}
