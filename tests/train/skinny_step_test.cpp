// The one-pass step kernel (train/kernels/one_pass_step.cu: forward, L1 loss, dy, dW and db
// partials from one read of x) at odd shapes: against the two-launch route bit for
// bit (it sums in the same orders by design), against the CPU path to float32
// rounding, and against itself run to run. x and target are strided, misaligned
// windows in some cases; the target is either x's first columns (as in the issue) or
// a tensor of its own.
#include <catch2/catch.hpp>

#include <cmath>

#include "core/generator.h"
#include "nn/linear.h"
#include "train/kernels/skinny.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using test::relative_error;

namespace {

struct StepShape {
  int64_t rows, in, out;
  bool strided;
};

#ifdef SEQPAR_WITH_CUDA

// A [rows, cols] window of a wider buffer: row stride cols + 5, first element 3 floats in.
Tensor window_of(const Tensor& values, Device device) {
  Tensor wide = Tensor::zeros({values.size(0) + 1, values.size(1) + 5}, device);
  Tensor window = wide.narrow(0, 1, values.size(0)).narrow(1, 3, values.size(1));
  window.copy_(values);
  return window;
}

struct Gradients {
  Tensor weight, bias, loss, sign;  // sign: the two-launch route's only
};

train::kernels::RowsView rows_view(const Tensor& t) { return {t.data(), t.stride(0)}; }

// The two-launch route of LinearL1Step before the one-pass kernel.
Gradients two_launch(const Tensor& x, const Tensor& target, const Tensor& weight,
                     const Tensor& bias, float scale) {
  namespace nd = train::kernels;
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const Device gpu = x.device();
  const nd::SkinnyGradScratch scratch = nd::skinny_grad_scratch(rows, in, out);
  const int64_t count = nd::skinny_forward_partial_count(rows, out);
  Gradients g{test::poisoned({out, in}, gpu), test::poisoned({out}, gpu), test::poisoned({}, gpu),
              test::poisoned({rows, out}, gpu)};
  Tensor loss_partials = test::poisoned({2 * count}, gpu);
  Tensor weight_partials = test::poisoned({scratch.weight_floats}, gpu);
  Tensor bias_partials = test::poisoned({2 * scratch.bias_doubles}, gpu);
  auto doubles = [](const Tensor& t) { return reinterpret_cast<double*>(t.data()); };
  cuda::Stream stream = cuda::current_stream(gpu.index);
  nd::skinny_forward_l1_cuda(rows_view(x), weight.data(), bias.data(), rows, in, out,
                             nd::L1Outputs{rows_view(target), g.sign.data(), doubles(loss_partials)},
                             stream);
  nd::skinny_weight_grad_cuda(nd::GradSource{{nullptr, 0}, g.sign.data(), scale}, rows_view(x),
                              rows, in, out, g.weight.data(), g.bias.data(), weight_partials.data(),
                              doubles(bias_partials),
                              nd::LossFinish{doubles(loss_partials), count, scale, g.loss.data()},
                              stream);
  return g;
}

Gradients one_pass(const Tensor& x, const Tensor& target, const Tensor& weight,
                   const Tensor& bias, float scale) {
  namespace nd = train::kernels;
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  const Device gpu = x.device();
  const nd::SkinnyStepPlan plan = nd::skinny_step_plan(rows, in, out);
  REQUIRE(plan.supported);
  const nd::SkinnyGradScratch scratch = nd::skinny_grad_scratch(rows, in, out);
  Gradients g{test::poisoned({out, in}, gpu), test::poisoned({out}, gpu), test::poisoned({}, gpu),
              Tensor()};
  Tensor loss_partials = test::poisoned({2 * plan.loss_partials}, gpu);
  Tensor weight_partials = test::poisoned({scratch.weight_floats}, gpu);
  Tensor bias_partials = test::poisoned({2 * scratch.bias_doubles}, gpu);
  auto doubles = [](const Tensor& t) { return reinterpret_cast<double*>(t.data()); };
  cuda::Stream stream = cuda::current_stream(gpu.index);
  nd::skinny_step_partials_cuda(plan, rows_view(x), rows_view(target), weight.data(), bias.data(),
                                rows, in, out, scale, weight_partials.data(),
                                doubles(bias_partials), doubles(loss_partials), stream);
  nd::skinny_sum_partials_cuda(weight_partials.data(), doubles(bias_partials), rows, in, out,
                               g.weight.data(), g.bias.data(),
                               nd::LossFinish{doubles(loss_partials), plan.loss_partials, scale,
                                              g.loss.data()},
                               stream);
  return g;
}

// The CPU path from the GPU's signs (a difference within rounding of zero may take
// either sign; the CPU's own y must agree with each sign up to such ties).
void check_against_cpu(const Gradients& gpu, const Tensor& x, const Tensor& target,
                       const Tensor& weight, const Tensor& bias, float scale) {
  const Tensor y = nn::linear_forward(x, weight, bias);
  const std::vector<float> ys = y.to_vector(), ts = target.contiguous().to_vector();
  const std::vector<float> signs = gpu.sign.to_vector();
  std::vector<float> dy(signs.size());
  double abs_sum = 0.0;
  int64_t disagreements = 0;
  for (size_t i = 0; i < signs.size(); ++i) {
    const float difference = ys[i] - ts[i];
    abs_sum += std::fabs(double(difference));
    const float sign = difference > 0.0f ? 1.0f : difference < 0.0f ? -1.0f : 0.0f;
    if (sign != signs[i] && std::fabs(difference) > 1e-5f * (1.0f + std::fabs(ys[i]))) ++disagreements;
    dy[i] = scale * signs[i];
  }
  CHECK(disagreements == 0);
  const Tensor grad_y = Tensor::from_data(y.shape(), dy);
  const nn::LinearGradients cpu = nn::linear_backward(grad_y, x, weight, false, true, true);
  CHECK(relative_error(gpu.weight, cpu.weight) < 1e-5);
  CHECK(relative_error(gpu.bias, cpu.bias) < 1e-5);
  CHECK(std::fabs(gpu.loss.item() - abs_sum * scale) <= 1e-6 * abs_sum * scale + 1e-30);
}

void check_shape(const StepShape& s) {
  INFO("rows " << s.rows << ", in " << s.in << ", out " << s.out << (s.strided ? ", strided" : ""));
  const Device gpu = Device::cuda();
  Generator generator(s.rows * 7 + s.in * 131 + s.out);
  const Tensor x = generator.randn({s.rows, s.in}), weight = generator.randn({s.out, s.in});
  const Tensor bias = generator.randn({s.out});
  // the target (x's first columns) when there are enough; else its own tensor.
  const bool seed_like = s.in >= s.out && s.out % 2 == 0;
  const Tensor own_target = seed_like ? Tensor() : generator.randn({s.rows, s.out});
  const Tensor x_gpu = s.strided ? window_of(x, gpu) : x.to(gpu);
  const Tensor target = seed_like ? x.narrow(1, 0, s.out) : own_target;
  const Tensor target_gpu = seed_like ? x_gpu.narrow(1, 0, s.out)
                                      : (s.strided ? window_of(own_target, gpu) : own_target.to(gpu));
  const Tensor weight_gpu = weight.to(gpu), bias_gpu = bias.to(gpu);
  const float scale = 1.0f / static_cast<float>(s.rows * s.out);

  const Gradients reference = two_launch(x_gpu, target_gpu, weight_gpu, bias_gpu, scale);
  const Gradients first = one_pass(x_gpu, target_gpu, weight_gpu, bias_gpu, scale);
  CHECK(test::bitwise_equal(first.weight, reference.weight));
  CHECK(test::bitwise_equal(first.bias, reference.bias));
  CHECK(relative_error(first.loss, reference.loss) < 1e-6);
  Gradients with_sign = first;
  with_sign.sign = reference.sign;
  check_against_cpu(with_sign, x, target, weight, bias, scale);
  test::poison_pool(gpu);
  const Gradients second = one_pass(x_gpu, target_gpu, weight_gpu, bias_gpu, scale);
  CHECK(test::bitwise_equal(second.weight, first.weight));
  CHECK(test::bitwise_equal(second.bias, first.bias));
  CHECK(test::bitwise_equal(second.loss, first.loss));
}

#endif

}  // namespace

TEST_CASE("the one-pass step kernel matches the two-launch route and the CPU", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  const int64_t outs[] = {1, 5, 16, 64};
  int next_out = 0;
  for (int64_t rows : {1, 7, 333, 3000, 12000, 40000}) {
    for (int64_t in : {4, 37, 640, 1024}) {
      const int64_t out = outs[next_out++ % 4];
      if (rows * in * out > int64_t{40000} * 640 * 16) continue;  // CPU time
      check_shape({rows, in, out, (rows + in) % 3 == 0});
    }
  }
  for (const StepShape& s : {StepShape{12000, 640, 16, false}, StepShape{3000, 640, 16, true},
                             StepShape{333, 1024, 64, true}, StepShape{40000, 37, 5, true}}) {
    check_shape(s);
  }
#endif
}
