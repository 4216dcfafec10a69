// seqpar-kernel-timings: the CUDA kernels of issue 3 at the seed's shapes, and one
// whole seed training step, timed with CUDA events.
//
// Each figure is the median over --repeats calls (after --warmup calls), each call
// bracketed by its own pair of events on the device's stream: what one call costs in
// a step, launch latency included. Kernels are called through their launchers with
// preallocated outputs; the step goes through the public API (autograd included).
//
//   seqpar-kernel-timings [--repeats N] [--warmup N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "apps/bench/bench_util.h"
#include "autograd/variable.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/elementwise.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"

using namespace seqpar;
using autograd::Variable;

namespace {

struct Settings {
  int repeats = 500;
  int warmup = 50;
};

// Median of `repeats` event-timed calls of `work`, in microseconds.
double median_microseconds(const std::function<void()>& work, const Settings& settings) {
  return bench::time_calls(work, settings.warmup, settings.repeats).median_us;
}

void report(const char* what, const char* shape, double microseconds, double bytes) {
  // Effective bandwidth: the bytes the op must move at least, over its time.
  std::printf("| %-34s | %-30s | %9.2f | %8.0f |\n", what, shape, microseconds,
              bytes / (microseconds * 1e-6) / 1e9);
}

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--repeats") == 0) settings.repeats = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--warmup") == 0) settings.warmup = std::atoi(argv[i + 1]);
  }
  settings.repeats = std::max(settings.repeats, 1);
  return settings;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse(argc, argv);
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "seqpar-kernel-timings: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp properties;
  CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  std::printf("GPU: %s (%d SMs); median of %d calls after %d warm-up calls\n\n", properties.name,
              properties.multiProcessorCount, settings.repeats, settings.warmup);
  std::printf("| %-34s | %-30s | %9s | %8s |\n", "op", "shape", "median us", "GB/s");
  std::printf("|%s|%s|%s|%s|\n", std::string(36, '-').c_str(), std::string(32, '-').c_str(),
              std::string(11, '-').c_str(), std::string(10, '-').c_str());

  const Device gpu = Device::cuda(0);
  const int64_t n = 12000, in = 640, out = 16;
  Generator generator(12345);
  const Tensor x = generator.randn({n, in}, gpu), weight = generator.randn({out, in}, gpu);
  const Tensor bias = generator.randn({out}, gpu), grad_y = generator.randn({n, out}, gpu);
  const Tensor y = Tensor::empty({n, out}, gpu), grad_x = Tensor::empty({n, in}, gpu);
  const Tensor grad_weight = Tensor::empty({out, in}, gpu), grad_bias = Tensor::empty({out}, gpu);
  const Tensor target = x.narrow(1, 0, out);  // the seed's x[:, :16], row stride 640
  const Tensor loss = Tensor::empty({}, gpu), grad_loss = Tensor::ones({}, gpu);
  const double f = sizeof(float);

  report("linear forward y = x W^T + b", "x 12000x640, W 16x640",
         median_microseconds([&] { nn::detail::linear_forward_cuda(x, weight, bias, y); }, settings),
         f * (n * in + out * in + n * out));
  report("linear backward dW and db", "K = 12000 rows",
         median_microseconds([&] {
           nn::detail::linear_backward_cuda(grad_y, x, weight, Tensor(), grad_weight, grad_bias);
         }, settings),
         f * (n * in + n * out + out * in));
  report("linear backward dx = dy W", "dx 12000x640",
         median_microseconds([&] {
           nn::detail::linear_backward_cuda(grad_y, x, weight, grad_x, Tensor(), Tensor());
         }, settings),
         f * (n * in + n * out + out * in));
  report("l1 loss forward (mean)", "12000x16, target strided",
         median_microseconds([&] {
           nn::detail::l1_loss_forward_cuda(y, target, 1.0f / (n * out), loss);
         }, settings),
         f * 2 * n * out);
  report("l1 loss backward", "12000x16, target strided",
         median_microseconds([&] {
           nn::detail::l1_loss_backward_cuda(grad_loss, y, target, 1.0f / (n * out), grad_y);
         }, settings),
         f * 3 * n * out);

  const std::vector<int64_t> sizes = {out * in, out};
  const Tensor total_norm = Tensor::empty({}, gpu);
  report("grad norm (2 tensors)", "W 16x640, b 16",
         median_microseconds([&] {
           optim::detail::grad_norm_cuda({grad_weight.data(), grad_bias.data()}, sizes,
                                         total_norm, 0);
         }, settings),
         f * (out * in + out));
  const Tensor small_norm = Tensor::full({}, 0.5f, gpu);  // coefficient 1: values unchanged
  report("clip grads (2 tensors)", "W 16x640, b 16",
         median_microseconds([&] {
           optim::detail::clip_grads_cuda({grad_weight.data(), grad_bias.data()}, sizes, 1.0f,
                                          small_norm, 0);
         }, settings),
         f * 2 * (out * in + out));
  const Tensor exp_avg = Tensor::zeros({out * in + out}, gpu);
  const Tensor exp_avg_sq = Tensor::zeros({out * in + out}, gpu);
  optim::detail::AdamWTensors adamw;
  adamw.params = {weight.data(), bias.data()};
  adamw.grads = {grad_weight.data(), grad_bias.data()};
  adamw.exp_avgs = {exp_avg.data(), exp_avg.data() + out * in};
  adamw.exp_avg_sqs = {exp_avg_sq.data(), exp_avg_sq.data() + out * in};
  adamw.sizes = sizes;
  optim::AdamWOptions seed_adamw;
  seed_adamw.lr = 1e-4;
  const auto scalars = optim::detail::adamw_step_scalars(seed_adamw, 1);
  report("adamw step (2 tensors, 1 launch)", "W 16x640, b 16",
         median_microseconds([&] { optim::detail::adamw_step_cuda(adamw, scalars, 0); }, settings),
         f * 7 * (out * in + out));
  const Tensor a = generator.randn({n, in}, gpu), b = generator.randn({n, in}, gpu);
  const Tensor sum = Tensor::empty({n, in}, gpu);
  report("axpby out = a + b", "12000x640",
         median_microseconds([&] {
           detail::axpby_cuda(sum.data(), a.data(), 1.0f, b.data(), 1.0f, n * in, 0);
         }, settings),
         f * 3 * n * in);

  // The whole seed step through the public API: forward, L1 mean, backward, clip 1.0,
  // AdamW (lr 1e-4, weight decay 0.01), on parameters that keep training.
  Generator init(12345);
  nn::Linear linear(in, out, init, gpu);
  const Variable input(x), label(target);
  optim::AdamWOptions options;
  options.lr = 1e-4;
  options.weight_decay = 0.01;
  optim::AdamW optimizer(linear.parameters(), options);
  auto step = [&] {
    linear.zero_grad();
    const Variable step_loss = nn::l1_loss(linear.forward(input), label);
    step_loss.backward();
    optim::clip_grad_norm(linear.parameters(), 1.0);
    optimizer.step();
  };
  report("seed training step (public API)", "fwd+L1+bwd+clip+AdamW",
         median_microseconds(step, settings), f * (2 * n * in + n * out));
  cuda::synchronize(0);
  return 0;
}
