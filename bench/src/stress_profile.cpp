// seqpar-stress-profile: one part of the benchmark, at the stress shape (x 1,048,576 x
// 1024 from randn, Linear 1024 -> 1024) or the seed's (12,000 x 640 -> 16), run a few
// times and nothing else: a program for a profiler to take apart kernel by kernel, e.g.
//
//   ncu --metrics gpu__time_duration.sum,dram__bytes.sum --print-summary per-kernel
//       build/bench/seqpar-stress-profile dw
//
//   dw    the exact dW after an L1 loss (dy = ±1/N) through accumulate_weight_grad_cuda
//   dw_randn  the exact dW from a randn dy through the same call (the CRT on int8 products)
//   step  the whole step through the public API, as seqpar-bench's step/stress/public_api
//   seed  the seed's step through the public API, as seqpar-bench's
//         step/full12000/public_api (exact numerics, mean reduction), 3 steps
//   host  the same step's host time, phase by phase (the stream drained before each
//         phase, the clock stopped when it returns: its launches, allocations and
//         bookkeeping, not its kernels), and the host time of the CUDA calls they are
//         made of; medians of 200 (no profiler needed)
//
// (bench/RESULTS.md's per-kernel figures of the stress shape come from these commands).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>

#include "bench/fused/kernels/exact_step.h"
#include "bench/src/bench_sections.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/elementwise.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "nn/cuda/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"

using namespace seqpar;

namespace {

constexpr int64_t kRows = int64_t{1} << 20, kFeatures = 1024;

void profile_dw(const Tensor& x) {
  // dy = ±f, the signs from a 64-bit LCG's top bit (cheap for 2^30 of them).
  Tensor signs = Tensor::empty({kRows, kFeatures});
  const float f = 1.0f / static_cast<float>(kRows * kFeatures);
  uint64_t state = 12345;
  float* value = signs.data();
  for (int64_t i = 0; i < kRows * kFeatures; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    value[i] = (state >> 63) != 0 ? f : -f;
  }
  const Tensor dy = signs.to(Device::cuda());
  exact::ExactSums sums(kFeatures * kFeatures, Device::cuda());
  for (int call = 0; call < 2; ++call) {
    nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy),
                                            nn::detail::const_rows_of(x), sums);
    cuda::synchronize(0);
  }
}

void profile_dw_randn(const Tensor& x) {
  Generator generator(10);
  const Tensor dy = generator.randn({kRows, kFeatures}, Device::cuda());
  exact::ExactSums sums(kFeatures * kFeatures, Device::cuda());
  for (int call = 0; call < 2; ++call) {
    nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy),
                                            nn::detail::const_rows_of(x), sums);
    cuda::synchronize(0);
  }
}

// One step through the public API, as seqpar-bench's public_api figures take it (no
// wait at the end).
void api_step(const nn::Linear& model, optim::AdamW& optimizer, const autograd::Variable& input,
              const autograd::Variable& target) {
  model.zero_grad();
  const autograd::Variable loss = nn::l1_loss(model.forward(input), target);
  loss.backward();
  optim::clip_grad_norm(model.parameters(), 1.0);
  optimizer.step();
}

void profile_step(const Tensor& x) {
  Generator generator(9);
  nn::Linear model(kFeatures, kFeatures, generator, Device::cuda());
  optim::AdamW optimizer(model.parameters(), bench::issue_adamw());
  const autograd::Variable input(x);
  for (int call = 0; call < 2; ++call) {
    api_step(model, optimizer, input, input);
    cuda::synchronize(0);
  }
}

// The seed's shape: 12,000 rows of 640 -> 16, the target the first 16 columns of x.
struct Seed {
  Generator generator{12345};
  nn::Linear model{640, 16, generator, Device::cuda()};
  optim::AdamW optimizer{model.parameters(), bench::issue_adamw()};
  Tensor x = generator.randn({12000, 640}, Device::cuda());
  autograd::Variable input{x}, target{x.narrow(1, 0, 16)};
  void step() { api_step(model, optimizer, input, target); }
};

void profile_seed() {
  Seed seed;
  for (int call = 0; call < 3; ++call) {
    seed.step();
    cuda::synchronize(0);
  }
}

// The median host time of `work` over 200 calls, the stream drained before each
// (bench::time_host_calls).
double host_median_us(const std::function<void()>& work) {
  return bench::time_host_calls(work, /*warmup=*/0, /*repeats=*/200).median_us;
}

void profile_host() {
  Seed seed;
  nn::Linear& model = seed.model;
  const autograd::Variable &input = seed.input, &target = seed.target;
  const auto step = [&] { seed.step(); };
  for (int i = 0; i < 20; ++i) step();  // warm-up: the pool holds every block a step takes
  const auto report = [](const char* what, double us) { std::printf("%-44s %8.2f us\n", what, us); };
  report("whole step", host_median_us(step));
  report("zero_grad", host_median_us([&] { model.zero_grad(); }));
  autograd::Variable y, loss;
  report("forward (Linear)", host_median_us([&] { y = model.forward(input); }));
  report("l1_loss", host_median_us([&] { loss = nn::l1_loss(y, target); }));
  report("backward", host_median_us([&] {
           model.zero_grad();
           nn::l1_loss(model.forward(input), target).backward();
         }) - host_median_us([&] {
           model.zero_grad();
           (void)nn::l1_loss(model.forward(input), target);
         }));
  // The backward's parts, each called by itself.
  {
    const Tensor& x = seed.x;
    const Tensor dy = Tensor::full({x.size(0), 16}, 1.0f / static_cast<float>(x.size(0) * 16), Device::cuda());
    const Tensor dw = Tensor::empty({16, 640}, Device::cuda()), db = Tensor::empty({16}, Device::cuda());
    report("  of which Linear's dW and db (linear_backward_cuda)", host_median_us([&] {
             nn::detail::linear_backward_cuda(dy, x, model.weight().data(), Tensor(), dw, db);
           }));
    const Tensor y_values = model.forward(input).data(), grad_loss = Tensor::ones({}, Device::cuda());
    report("  of which L1's backward (l1_loss_backward)", host_median_us([&] {
             (void)nn::l1_loss_backward(grad_loss, y_values, target.data(), nn::Reduction::mean());
           }));
    // Linear's dW and db by their calls, as accumulate_linear_grads_cuda makes them.
    namespace nd = nn::detail;
    const int64_t in = x.size(1), out = dy.size(1), scratch_words = fused::kernels::weight_grad_maxima_words(in, out);
    cudaStream_t stream = cuda::current_stream(0);
    const nd::ConstRows dy_rows = nd::const_rows_of(dy), x_rows = nd::const_rows_of(x);
    // x's maxima [in], dy's [out], dy's two words (nn/cuda/linear.h).
    DeviceBuffer<unsigned int> scratch(scratch_words, Device::cuda());
    scratch.zero();
    unsigned int* const largest = scratch.data();
    DeviceBuffer<int64_t> sign_sums(out, Device::cuda());
    sign_sums.zero();
    exact::ExactSums sums(out * in + out, Device::cuda());
    report("    ExactSums of 10,256 sums (allocate, zero, release)",
           host_median_us([&] { exact::ExactSums made(out * in + out, Device::cuda()); }));
    report("    DeviceBuffer of the scratch, zeroed", host_median_us([&] {
             DeviceBuffer<unsigned int> made(scratch_words, Device::cuda());
             made.zero();
           }));
    report("    x's column maxima (column_maxima_cuda)",
           host_median_us([&] { nd::column_maxima_cuda(x_rows, largest, nullptr, stream); }));
    report("    dy's maxima, words, sign sums", host_median_us([&] {
             nd::column_maxima_cuda(dy_rows, largest + in, largest + in + out, stream, sign_sums.data());
           }));
    report("    dW's sums (enqueue_weight_grad_sums: two launches)", host_median_us([&] {
             nd::enqueue_weight_grad_sums(dy_rows, x_rows, fused::kernels::weight_grad_maxima_at(largest, in, out),
                                          sums.digits(), sums.count(), stream);
           }));
    report("    the rounding (round_digits_cuda)", host_median_us([&] {
             exact::detail::round_digits_cuda(sums.digits(), sums.count(), sums.count(), dw.data(), 0);
           }));
    Tensor grad = Tensor::zeros({16, 640}, Device::cuda());
    report("  of which a gradient's accumulation (add_)", host_median_us([&] { add_(grad, dw); }));
    report("  of which the seed gradient (Tensor::ones({}))",
           host_median_us([&] { (void)Tensor::ones({}, Device::cuda()); }));
  }
  report("clip_grad_norm", host_median_us([&] { optim::clip_grad_norm(model.parameters(), 1.0); }));
  report("AdamW step", host_median_us([&] { seed.optimizer.step(); }));
  // What those are made of.
  cudaStream_t stream = cuda::current_stream(0);
  const Tensor one = Tensor::zeros({1}, Device::cuda());
  Tensor target_one = Tensor::zeros({1}, Device::cuda());
  report("one kernel launch (add_ of one element)", host_median_us([&] { add_(target_one, one); }));
  report("10 of those", host_median_us([&] {
           for (int i = 0; i < 10; ++i) add_(target_one, one);
         }));
  report("Tensor::fill_ of one element (a memset)", host_median_us([&] { one.fill_(1.0f); }));
  report("allocate + release 768 KB (the cache)", host_median_us([&] {
           void* pointer = cuda::allocate(768 << 10, 0);
           cuda::release(pointer, 768 << 10, 0);
         }));
  report("allocate + release 768 KB (the pool: cudaMallocAsync + cudaFreeAsync)",
         host_median_us([&] {
           void* pointer = nullptr;
           CUDA_CHECK(cudaMallocAsync(&pointer, 768 << 10, stream));
           CUDA_CHECK(cudaFreeAsync(pointer, stream));
         }));
  report("cudaStreamIsCapturing", host_median_us([&] {
           cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
           CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
         }));
  report("cudaMemsetAsync of 4 bytes", host_median_us([&] {
           CUDA_CHECK(cudaMemsetAsync(one.data(), 0, sizeof(float), stream));
         }));
  report("cudaSetDevice", host_median_us([&] { CUDA_CHECK(cudaSetDevice(0)); }));
  report("Tensor::empty 12000 x 16 (allocate + release)",
         host_median_us([&] { (void)Tensor::empty({12000, 16}, Device::cuda()); }));
}

}  // namespace

int main(int argc, char** argv) {
  const char* part = argc > 1 ? argv[1] : "";
  const bool seed = std::strcmp(part, "seed") == 0, host = std::strcmp(part, "host") == 0;
  const bool dw_randn = std::strcmp(part, "dw_randn") == 0;
  if (argc != 2 || (std::strcmp(part, "dw") != 0 && std::strcmp(part, "step") != 0 && !dw_randn &&
                    !seed && !host)) {
    std::fprintf(stderr, "usage: seqpar-stress-profile dw|dw_randn|step|seed|host\n");
    return 2;
  }
  try {
    if (seed || host) {
      if (seed) profile_seed(); else profile_host();
      std::printf("seqpar-stress-profile: %s at 12000 x 640 -> 16 done\n", part);
      return 0;
    }
    Generator generator(9);
    const Tensor x = generator.randn({kRows, kFeatures}, Device::cuda());
    if (std::strcmp(part, "dw") == 0) {
      profile_dw(x);
    } else if (dw_randn) {
      profile_dw_randn(x);
    } else {
      profile_step(x);
    }
    std::printf("seqpar-stress-profile: 2 runs of %s at %lld x %lld -> %lld done\n", part,
                static_cast<long long>(kRows), static_cast<long long>(kFeatures),
                static_cast<long long>(kFeatures));
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "seqpar-stress-profile: %s\n", error.what());
    return 1;
  }
}
