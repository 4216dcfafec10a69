// seqpar-bench's kernel sections: the issue's kernels one by one through their
// launchers (preallocated outputs), and the stress shapes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/fused/kernels/exact_step.h"
#include "bench/src/bench_sections.h"
#include "autograd/variable.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/device_generator.h"
#include "core/exact_sums.h"
#include "core/error.h"
#include "core/elementwise.h"
#include "core/generator.h"
#include "nn/cuda/l1_loss.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/cuda/int8_gemm.h"
#include "nn/cuda/linear.h"
#include "optim/adamw.h"
#include "optim/cuda/adamw.h"
#include "optim/clip.h"
#include "optim/cuda/clip.h"

namespace seqpar::bench {

namespace crt = nn::detail::crt;

namespace {

constexpr double kF = sizeof(float);
const Device kGpu = Device::cuda(0);

optim::detail::AdamWTensors adamw_tensors(const std::vector<Tensor>& params,
                                          const std::vector<Tensor>& grads, const Tensor& m,
                                          const Tensor& v) {
  optim::detail::AdamWTensors t;
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    t.params.push_back(params[i].data());
    t.grads.push_back(grads[i].data());
    t.exp_avgs.push_back(m.data() + offset);
    t.exp_avg_sqs.push_back(v.data() + offset);
    t.sizes.push_back(params[i].numel());
    offset += params[i].numel();
  }
  return t;
}

void bench_linear(Report& report, const Settings& s, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, const Tensor& grad_y) {
  const int64_t n = x.size(0), in = x.size(1), out = weight.size(0);
  const std::string shape = std::to_string(n) + "x" + std::to_string(in) + "x" + std::to_string(out);
  const Tensor y = Tensor::empty({n, out}, kGpu);
  const Tensor grad_weight = Tensor::empty({out, in}, kGpu), grad_bias = Tensor::empty({out}, kGpu);
  const double bytes = kF * (n * in + out * in + n * out), flops = 2.0 * n * in * out;
  report.add("kernel/linear_fwd/" + shape, "GEMM, one fma chain over k per element",
             time_calls([&] { nn::detail::linear_forward_cuda(x, weight, bias, y); }, s.warmup,
                        s.repeats), bytes, flops);
  report.add("kernel/linear_dw_db/" + shape, "dW = dy^T x and db, exact row sums",
             time_calls([&] {
               nn::detail::linear_backward_cuda(grad_y, x, weight, Tensor(), grad_weight, grad_bias);
             }, s.warmup, s.repeats), bytes, flops);
}

// Exact dW alone with a randn dy (no one magnitude: the general case, an MSE's or a
// masked mean's), rounded into dW, the sums' zeroing and rounding included as the
// backward pays them: by the row sums of today's dispatch (accumulate_weight_grad_cuda:
// the binned kernel for such a dy) when `binned`, and by the CRT on the int8 tensor
// cores (nn/cuda/exact_dw_crt.h). Both beside cuBLAS's fp32 dyᵀx in bench/merge.py's table.
void bench_dw_randn(Report& report, const std::string& name, const Tensor& grad_y, const Tensor& x, bool binned,
                    int warmup, int repeats) {
  const int64_t rows = x.size(0), in = x.size(1), out = grad_y.size(1);
  const nn::detail::ConstRows dy_rows = nn::detail::const_rows_of(grad_y), x_rows = nn::detail::const_rows_of(x);
  const Tensor grad_weight = Tensor::empty({out, in}, kGpu);
  const double bytes = kF * (rows * (in + out) + out * in), flops = 2.0 * rows * in * out;
  if (binned) {
    report.add("kernel/linear_dw_randn_binned/" + name, "exact dW, randn dy: binned row sums, rounded once",
               time_calls([&] {
                 exact::ExactSums sums(out * in, kGpu);
                 nn::detail::accumulate_weight_grad_cuda(dy_rows, x_rows, sums);
                 sums.round_into(grad_weight);
               }, warmup, repeats), bytes, flops);
  }
  const crt::Plan plan = crt::plan_for_rows(rows);
  report.add((binned ? "kernel/linear_dw_randn_crt/" : "gemm/stress_dw_randn_crt/") + name,
             "exact dW, randn dy: CRT, " + std::to_string(plan.moduli) + " int8 GEMMs, " +
                 std::to_string(plan.window_bits) + "-bit windows, rounded once",
             time_calls([&] {
               exact::ExactSums sums(out * in, kGpu);
               nn::detail::accumulate_weight_grad_crt_cuda(dy_rows, x_rows, sums);
               sums.round_into(grad_weight);
             }, warmup, repeats), bytes, flops);
  // The CRT's tensor-core work alone: its batched int8 GEMM over one product's rows (the
  // stress shape has eight of them), the floor the scheme cannot go below.
  const int64_t k = cuda::round_up(std::min(rows, nn::detail::crt::kRowsPerProduct), 64);
  const int64_t m = cuda::round_up(out, 32), n = cuda::round_up(in, 32);
  DeviceBuffer<int8_t> a(plan.moduli * m * k, kGpu), b(plan.moduli * n * k, kGpu);
  DeviceBuffer<int32_t> c(plan.moduli * m * n, kGpu);
  const cuda::Stream stream = cuda::current_stream(0);
  CUDA_CHECK(cudaMemsetAsync(a.data(), 0x3b, static_cast<size_t>(a.size()), stream));
  CUDA_CHECK(cudaMemsetAsync(b.data(), 0xc5, static_cast<size_t>(b.size()), stream));
  nn::detail::Int8Product product{m, n, k, a.data(), b.data(), c.data(), false};
  product.batch = plan.moduli;
  product.a_batch_stride = m * k;
  product.b_batch_stride = n * k;
  product.c_batch_stride = m * n;
  report.add("gemm/crt_int8_batch/" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + "x" +
                 std::to_string(plan.moduli),
             "the CRT dW's batched int8 GEMM alone, one product's rows (ops as flops)",
             time_calls([&] { nn::detail::int8_product(product, 0, stream); }, warmup, repeats),
             static_cast<double>(plan.moduli * (m * k + n * k + 4 * m * n)), 2.0 * plan.moduli * m * n * k);
}

}  // namespace

void bench_kernels(Report& report, const Settings& s) {
  const int64_t n = 12000, in = 640, out = 16;
  Generator generator(7);
  const Tensor x = generator.randn({n, in}, kGpu), weight = generator.randn({out, in}, kGpu);
  const Tensor bias = generator.randn({out}, kGpu), grad_y = generator.randn({n, out}, kGpu);
  bench_linear(report, s, x, weight, bias, grad_y);
  bench_linear(report, s, x.narrow(0, 0, 3000), weight, bias, grad_y.narrow(0, 0, 3000));
  {  // dW and db after an L1 loss: dy = ±1/N, the fixed-point path of dW
    std::vector<float> signs = grad_y.to(Device::cpu()).to_vector();
    for (float& value : signs) value = value > 0 ? 1.0f / float(n * out) : -1.0f / float(n * out);
    Tensor grad_y_l1 = Tensor::empty({n, out});
    std::copy(signs.begin(), signs.end(), grad_y_l1.data());
    grad_y_l1 = grad_y_l1.to(kGpu);
    const Tensor grad_weight = Tensor::empty({out, in}, kGpu), grad_bias = Tensor::empty({out}, kGpu);
    report.add("kernel/linear_dw_db_l1/12000x640x16",
               "dW = dy^T x and db with dy = +-1/N (an L1 loss's): fixed-point integer sums",
               time_calls([&] {
                 nn::detail::linear_backward_cuda(grad_y_l1, x, weight, Tensor(), grad_weight,
                                                  grad_bias);
               }, s.warmup, s.repeats),
               kF * (n * in + out * in + n * out), 2.0 * n * in * out);
  }
  bench_forward_and_weight_grad(report, s, weight, bias);
  {  // the few-outputs forward's variants (the same bits; linear_fwd above uses the default)
    const Tensor y = Tensor::empty({n, out}, kGpu);
    for (int per_thread : {4, 8, 16}) {
      report.add("kernel/linear_fwd_narrow/" + std::to_string(per_thread) + "_per_thread",
                 std::to_string(per_thread) + " outputs a thread, 12000x640x16",
                 time_calls([&] {
                   nn::detail::few_outputs_forward_cuda(nn::detail::const_rows_of(x), weight.data(),
                                                   weight.stride(0), bias.data(), out, y.data(),
                                                   y.stride(0), 0, nullptr, per_thread);
                 }, s.warmup, s.repeats),
                 kF * (n * in + out * in + n * out), 2.0 * n * in * out);
    }
  }

  const Tensor target = x.narrow(1, 0, out);
  {
    const Tensor y = nn::linear_forward(x, weight, bias), loss = Tensor::empty({}, kGpu);
    const Tensor ones = Tensor::ones({}, kGpu), grad = Tensor::empty({n, out}, kGpu);
    const float scale = 1.0f / static_cast<float>(n * out);
    report.add("kernel/l1_fwd_bwd/12000x16", "l1 forward (2 launches) + backward (1)",
               time_calls([&] {
                 nn::detail::l1_loss_forward_cuda(y, target, scale, loss);
                 nn::detail::l1_loss_backward_cuda(ones, y, target, scale, grad);
               }, s.warmup, s.repeats), kF * 3 * n * out);
  }
  for (int64_t parameters : {int64_t{10256}, int64_t{100'000'000}}) {
    std::vector<Tensor> params, grads;
    if (parameters == 10256) {
      params = {weight.clone(), bias.clone()};
      grads = {generator.randn({out, in}, kGpu), generator.randn({out}, kGpu)};
    } else {
      params = {randn_on_device(1, 0, {parameters}, 0)};
      grads = {randn_on_device(2, 0, {parameters}, 0)};
    }
    const Tensor m = Tensor::zeros({parameters}, kGpu), v = Tensor::zeros({parameters}, kGpu);
    const auto tensors = adamw_tensors(params, grads, m, v);
    const auto scalars = optim::detail::adamw_step_scalars(issue_adamw(), 1);
    const int repeats = parameters > 1'000'000 ? std::max(200, s.repeats / 2) : s.repeats;
    report.add("kernel/adamw/" + std::to_string(parameters), "multi-tensor AdamW, one launch per table",
               time_calls([&] { optim::detail::adamw_step_cuda(tensors, scalars, 0); }, s.warmup,
                          repeats), kF * 7 * parameters);
    if (parameters != 10256) continue;
    std::vector<const float*> read = {grads[0].data(), grads[1].data()};
    const Tensor norm = Tensor::empty({}, kGpu);
    report.add("kernel/norm_clip/10256", "grad norm (3 launches) + clip (1 launch)",
               time_calls([&] {
                 optim::detail::grad_norm_cuda(read, tensors.sizes, norm, 0);
                 optim::detail::clip_grads_cuda(tensors.grads, tensors.sizes, 1.0f, norm, 0);
               }, s.warmup, s.repeats), kF * 2 * parameters);
  }
  bench_attention(report, s);
  bench_attention_long(report, s);
}

void bench_kernel_parts(Report& report, const Settings& s) {
  // The shapes and data of the former seqpar-kernel-timings: Generator(12345).
  const int64_t n = 12000, in = 640, out = 16;
  Generator generator(12345);
  const Tensor x = generator.randn({n, in}, kGpu), weight = generator.randn({out, in}, kGpu);
  const Tensor bias = generator.randn({out}, kGpu), grad_y = generator.randn({n, out}, kGpu);
  const Tensor y = Tensor::empty({n, out}, kGpu), grad_x = Tensor::empty({n, in}, kGpu);
  const Tensor grad_weight = Tensor::empty({out, in}, kGpu), grad_bias = Tensor::empty({out}, kGpu);
  const Tensor target = x.narrow(1, 0, out);  // the issue's x[:, :16], row stride 640
  const Tensor loss = Tensor::empty({}, kGpu), grad_loss = Tensor::ones({}, kGpu);
  nn::detail::linear_forward_cuda(x, weight, bias, y);
  report.add("kernel/linear_dx/12000x640x16", "dx = dy W, dx 12000x640",
             time_calls([&] {
               nn::detail::linear_backward_cuda(grad_y, x, weight, grad_x, Tensor(), Tensor());
             }, s.warmup, s.repeats), kF * (n * in + n * out + out * in), 2.0 * n * in * out);
  report.add("kernel/l1_fwd/12000x16", "l1 loss forward (mean), target strided",
             time_calls([&] {
               nn::detail::l1_loss_forward_cuda(y, target, 1.0f / (n * out), loss);
             }, s.warmup, s.repeats), kF * 2 * n * out);
  report.add("kernel/l1_bwd/12000x16", "l1 loss backward, target strided",
             time_calls([&] {
               nn::detail::l1_loss_backward_cuda(grad_loss, y, target, 1.0f / (n * out), grad_y);
             }, s.warmup, s.repeats), kF * 3 * n * out);
  const std::vector<int64_t> sizes = {out * in, out};
  const Tensor total_norm = Tensor::empty({}, kGpu);
  report.add("kernel/grad_norm/10256", "grad norm of W 16x640 and b 16",
             time_calls([&] {
               optim::detail::grad_norm_cuda({grad_weight.data(), grad_bias.data()}, sizes,
                                             total_norm, 0);
             }, s.warmup, s.repeats), kF * (out * in + out));
  const Tensor small_norm = Tensor::full({}, 0.5f, kGpu);  // coefficient 1: values unchanged
  report.add("kernel/clip/10256", "clip W 16x640 and b 16 (coefficient 1)",
             time_calls([&] {
               optim::detail::clip_grads_cuda({grad_weight.data(), grad_bias.data()}, sizes, 1.0f,
                                              small_norm, 0);
             }, s.warmup, s.repeats), kF * 2 * (out * in + out));
  const Tensor a = generator.randn({n, in}, kGpu), b = generator.randn({n, in}, kGpu);
  const Tensor sum = Tensor::empty({n, in}, kGpu);
  report.add("kernel/axpby/12000x640", "out = a + b",
             time_calls([&] {
               detail::axpby_cuda(sum.data(), a.data(), 1.0f, b.data(), 1.0f, n * in, 0);
             }, s.warmup, s.repeats), kF * 3 * n * in);
}

namespace {

// The two one-magnitude dW kernels side by side at 262,144 rows and 1024 columns of x,
// for 32 to 256 outputs: the 16-output-group kernel (nn/cuda/one_magnitude_dw_few_outputs.cuh, the one a
// captured step takes) and the int8 GEMM (nn/cuda/one_magnitude_dw_many_outputs.cu, the public API's from
// 64 outputs), each after its maxima pass (the int8 path's also writes dy's signs).
// Then the int8 GEMM alone at the shape of one chunk of the 1024-output stress dW.
void bench_dw_l1_paths(Report& report, const Tensor& grad_y_l1, const Tensor& x) {
  const int64_t rows = int64_t{1} << 18, in = x.size(1);
  const nn::detail::ConstRows x_rows = nn::detail::const_rows_of(x.narrow(0, 0, rows));
  const cuda::Stream stream = cuda::current_stream(0);
  for (const int64_t out : {32, 64, 128, 256}) {
    const nn::detail::ConstRows dy_rows =
        nn::detail::const_rows_of(grad_y_l1.narrow(0, 0, rows).narrow(1, 0, out));
    exact::ExactSums sums(out * in, kGpu);
    DeviceBuffer<unsigned int> scratch(fused::kernels::weight_grad_maxima_words(in, out), kGpu);
    // dy's signs as bytes, which the int8 path takes from dy's maxima pass
    DeviceBuffer<int8_t> sign_bytes(out * rows, kGpu);  // out and rows: multiples of 32 and 256
    const nn::detail::SignMatrix signs{sign_bytes.data(), rows};
    const auto maxima = [&](nn::detail::SignMatrix dy_signs) {
      scratch.zero();
      nn::detail::column_maxima_cuda(x_rows, scratch.data(), nullptr, stream);
      nn::detail::column_maxima_cuda(dy_rows, scratch.data() + in, scratch.data() + in + out, stream,
                                     nullptr, dy_signs);
    };
    const std::string shape = std::to_string(out) + "x" + std::to_string(in) + "x" + std::to_string(rows);
    report.add("gemm/dw_l1_groups_of_16/" + shape, "one-magnitude dW, x in fixed point once per 16 outputs",
               time_calls([&] {
                 maxima({});
                 nn::detail::enqueue_weight_grad_sums(dy_rows, x_rows,
                                                      fused::kernels::weight_grad_maxima_at(scratch.data(), in, out),
                                                      sums.digits(), sums.count(), stream);
               }, 1, 3), kF * (rows * (in + out)), 2.0 * rows * in * out);
    report.add("gemm/dw_l1_int8_gemm/" + shape, "one-magnitude dW, x in byte planes once, cuBLASLt int8 GEMM",
               time_calls([&] {
                 maxima(signs);
                 nn::detail::launch_one_magnitude_dw_many_outputs(
                     dy_rows, x_rows, scratch.data(), scratch.data() + in + out, signs, sums.digits(),
                     sums.count(), stream, {});
               }, 1, 3), kF * (rows * (in + out)), 2.0 * rows * in * out);
  }
  // One chunk of the stress dW: 1024 outputs, 6 planes of 1024 columns, 87,296 rows
  // (512 MB of planes).
  const int64_t m = 1024, n = 6 * 1024, k = 87296;
  DeviceBuffer<int8_t> a(m * k, kGpu), b(n * k, kGpu);
  DeviceBuffer<int32_t> c(m * n, kGpu);
  CUDA_CHECK(cudaMemsetAsync(a.data(), 0x5a, static_cast<size_t>(m * k), stream));
  CUDA_CHECK(cudaMemsetAsync(b.data(), 0xa7, static_cast<size_t>(n * k), stream));
  report.add("gemm/int8_product/1024x6144x87296", "cuBLASLt int8 GEMM, int32 sums (ops as flops)",
             time_calls([&] {
               nn::detail::int8_product({m, n, k, a.data(), b.data(), c.data(), false}, 0, stream);
             }, 1, 5), static_cast<double>(m * k + n * k + 4 * m * n), 2.0 * m * n * k);
}

}  // namespace

void bench_exact_dw(Report& report, const Settings& s) {
  {
    const int64_t n = 12000, in = 640, out = 16;
    Generator generator(7);  // bench_kernels' x and dy
    const Tensor x = generator.randn({n, in}, kGpu);
    generator.randn({out, in}, kGpu);
    generator.randn({out}, kGpu);
    const Tensor grad_y = generator.randn({n, out}, kGpu);
    bench_dw_randn(report, "12000x640x16", grad_y, x, true, s.warmup, s.repeats);
  }
  if (!s.stress) return;
  const int64_t rows = int64_t{1} << 20, features = 1024;
  const Tensor x = randn_on_device(6, 0, {rows, features}, 0);  // bench_stress's x and dy
  const Tensor grad_y = randn_on_device(7, 0, {rows, features}, 0);
  bench_dw_randn(report, "1024x1024x1048576", grad_y, x, false, 1, 3);
}

void bench_stress(Report& report, const Settings& s) {
  {  // square GEMM: y = x Wᵀ + b on the 128 x 128 kernel
    const int64_t size = 4096;
    const Tensor x = randn_on_device(3, 0, {size, size}, 0), w = randn_on_device(4, 0, {size, size}, 0);
    const Tensor b = randn_on_device(5, 0, {size}, 0), y = Tensor::empty({size, size}, kGpu);
    report.add("gemm/4096^3", "128x128 tiles, 8x8 per thread, fp32 FFMA, 32-deep K slices",
               time_calls([&] { nn::detail::linear_forward_cuda(x, w, b, y); }, 3,
                          std::min(s.repeats, 50)),
               kF * 3 * size * size, 2.0 * size * size * size);
  }
  const int64_t rows = int64_t{1} << 20, features = 1024;
  const Tensor x = randn_on_device(6, 0, {rows, features}, 0);
  Generator generator(9);
  nn::Linear model(features, features, generator, kGpu);
  const double flops = 2.0 * rows * features * features;
  {
    const Tensor y = Tensor::empty({rows, features}, kGpu);
    report.add("gemm/stress_fwd/1048576x1024x1024", "128x128 tiled GEMM, 32-deep K slices",
               time_calls([&] {
                 nn::detail::linear_forward_cuda(x, model.weight().data(), model.bias().data(), y);
               }, 1, 3), kF * 2 * rows * features, flops);
  }
  {  // the backward: dW = dyᵀ x (exact row sums over 2^20 rows; the name pairs it with
     // cuBLAS's GEMM in bench/merge.py) and dx = dy W (W read down its columns)
    const Tensor grad_y = randn_on_device(7, 0, {rows, features}, 0);
    const Tensor grad_weight = Tensor::empty({features, features}, kGpu);
    report.add("gemm/stress_dw/1024x1024x1048576", "dW = dy^T x as exact row sums, rounded once",
               time_calls([&] {
                 nn::detail::linear_backward_cuda(grad_y, x, model.weight().data(), Tensor(),
                                                  grad_weight, Tensor());
               }, 1, 3), kF * (2 * rows * features + features * features), flops);
    {  // dW after an L1 loss at this shape: dy = ±f, the fixed-point path on the int8
       // tensor cores (the public-API stress step below cannot take it: see there)
      const float f = 1.0f / static_cast<float>(rows * features);
      Tensor signs = Tensor::empty({rows, features});
      uint64_t state = 12345;  // a 64-bit LCG's top bit: cheap for 2^30 signs
      float* value = signs.data();
      for (int64_t i = 0; i < rows * features; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        value[i] = (state >> 63) != 0 ? f : -f;
      }
      const Tensor grad_y_l1 = signs.to(kGpu);
      report.add("gemm/stress_dw_l1/1024x1024x1048576",
                 "dW = dy^T x with dy = +-1/N (an L1 loss's): fixed-point sums on the int8 tensor cores",
                 time_calls([&] {
                   nn::detail::linear_backward_cuda(grad_y_l1, x, model.weight().data(), Tensor(),
                                                    grad_weight, Tensor());
                 }, 1, 3), kF * (2 * rows * features + features * features), flops);
      bench_dw_l1_paths(report, grad_y_l1, x);
    }
    const Tensor grad_x = Tensor::empty({rows, features}, kGpu);
    report.add("gemm/stress_dx/1048576x1024x1024", "128x128 tiled GEMM, W read down its columns, 32-deep K slices",
               time_calls([&] {
                 nn::detail::linear_backward_cuda(grad_y, x, model.weight().data(), grad_x,
                                                  Tensor(), Tensor());
               }, 1, 3), kF * 2 * rows * features, flops);
  }
  // The whole step through the public API. Its L1 loss sums 2^30 terms, inside the exact
  // sums' 2^32 (core/exact_bins.h).
  optim::AdamW optimizer(model.parameters(), issue_adamw());
  const auto public_step = [&](const autograd::Variable& input) {
    return [&model, &optimizer, input] {
      model.zero_grad();
      const autograd::Variable loss = nn::l1_loss(model.forward(input), input);
      loss.backward();
      optim::clip_grad_norm(model.parameters(), 1.0);
      optimizer.step();
    };
  };
  report.add("step/stress/public_api", "x 1048576x1024, Linear 1024->1024, fp32, one step",
             time_calls(public_step(autograd::Variable(x)), 1, 3), kF * 2 * rows * features,
             2.0 * flops);
}

}  // namespace seqpar::bench
