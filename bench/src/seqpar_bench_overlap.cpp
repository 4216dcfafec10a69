// seqpar-bench's section on the exact step's first two kernels together: whether they
// gain from sharing the SMs (bench_sections.h).
#include <cuda_runtime.h>

#include <cstdint>

#include "bench/fused/kernels/exact_step.h"
#include "bench/src/bench_sections.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "nn/cuda/linear.h"
#include "nn/one_magnitude.h"

namespace seqpar::bench {

void bench_forward_and_weight_grad(Report& report, const Settings& s, const Tensor& weight,
                                   const Tensor& bias) {
  const Device kGpu = weight.device();
  constexpr double kF = sizeof(float);
  const int64_t n = 12000, in = weight.size(1), out = weight.size(0);
  // The dW runs over another batch, whose dy, signs and maxima a forward wrote first, so
  // the two kernels need not wait for each other: what a one-kernel step that
  // overlapped them chunk by chunk could gain at most.
  const int64_t scratch_words = fused::kernels::weight_grad_maxima_words(in, out);
  const float scale = 1.0f / static_cast<float>(n * out);
  struct Batch {
    Tensor x, target, y, grad_y;
    DeviceBuffer<unsigned int> scratch;
    DeviceBuffer<int64_t> loss, digits;
    DeviceBuffer<uint8_t> fragments;
  };
  auto batch = [&](uint64_t seed) {
    Generator g(seed);
    Batch b{g.randn({n, in}, kGpu), g.randn({n, out}, kGpu), Tensor::empty({n, out}, kGpu),
            Tensor::empty({n, out}, kGpu), DeviceBuffer<unsigned int>(scratch_words, kGpu),
            DeviceBuffer<int64_t>(exact::kDigits, kGpu),
            DeviceBuffer<int64_t>(exact::kDigits * (out * in + out), kGpu),
            DeviceBuffer<uint8_t>(fused::kernels::sign_fragment_bytes(n), kGpu)};
    b.scratch.zero();
    b.loss.zero();
    b.digits.zero();
    b.fragments.zero();
    return b;
  };
  Batch a = batch(21), b = batch(22);
  auto forward = [&](Batch& t) {  // on the current stream
    unsigned int* maxima = t.scratch.data();
    const fused::kernels::ExactL1Outputs l1{t.grad_y.data(), t.loss.data(), t.digits.data() + out * in,
                                        out * in + out,  maxima + in,   t.fragments.data()};
    fused::kernels::few_outputs_forward_exact_l1_cuda(nn::detail::const_rows_of(t.x), weight.data(),
                                             weight.stride(0), bias.data(), out, t.y.data(), 0,
                                             maxima, {t.target.data(), out, scale}, l1);
  };
  auto weight_grad = [&](Batch& t, cudaStream_t on) {
    fused::kernels::enqueue_weight_grad_sums_from_fragments(
        nn::detail::const_rows_of(t.grad_y), nn::detail::const_rows_of(t.x),
        fused::kernels::weight_grad_maxima_at(t.scratch.data(), in, out), t.digits.data(), out * in + out, on,
        t.fragments.data());
  };
  forward(b);  // b's dy, signs and maxima, for its dW
  cudaStream_t main_stream = cuda::current_stream(0), side = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork = nullptr, join = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  // Both orders take the same two events, so the figures differ by the overlap alone.
  auto both = [&](bool side_by_side) {
    CUDA_CHECK(cudaEventRecord(fork, main_stream));
    CUDA_CHECK(cudaStreamWaitEvent(side, fork));
    forward(a);
    weight_grad(b, side_by_side ? side : main_stream);
    CUDA_CHECK(cudaEventRecord(join, side));
    CUDA_CHECK(cudaStreamWaitEvent(main_stream, join));
  };
  const double bytes = kF * (n * in + out * in + n * out), flops = 2.0 * n * in * out;
  report.add("kernel/forward_l1/12000x640x16", "the exact step's forward, the L1 loss in its epilogue",
             time_calls([&] { forward(a); }, s.warmup, s.repeats), bytes, flops);
  report.add("kernel/one_magnitude_dw/12000x640x16", "the exact step's dW from dy's sign fragments",
             time_calls([&] { weight_grad(b, main_stream); }, s.warmup, s.repeats), bytes, flops);
  report.add("kernel/forward_l1_then_dw/12000x640x16", "the two one after the other (another batch's dW)",
             time_calls([&] { both(false); }, s.warmup, s.repeats), 2 * bytes, 2 * flops);
  report.add("kernel/forward_l1_beside_dw/12000x640x16", "the two side by side on two streams",
             time_calls([&] { both(true); }, s.warmup, s.repeats), 2 * bytes, 2 * flops);
  cuda::synchronize(0);
  CUDA_CHECK(cudaEventDestroy(fork));
  CUDA_CHECK(cudaEventDestroy(join));
  CUDA_CHECK(cudaStreamDestroy(side));
}

}  // namespace seqpar::bench
