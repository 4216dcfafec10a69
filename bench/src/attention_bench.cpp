// seqpar-bench's attention sections: exact attention at the Ulysses scenario's shape
// through the CUDA launchers, and at long context through the public calls.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/reshape.h"
#include "bench/src/bench_sections.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "nn/attention.h"
#include "nn/cuda/attention.h"
#include "nn/exact_gradient_sync.h"
#include "nn/l1_loss.h"
#include "nn/ulysses_block.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace seqpar::bench {

namespace {

constexpr double kF = sizeof(float);
const Device kGpu = Device::cuda(0);

// The Llama-shaped layer of bench_ulysses_step: 8 query heads over 2 kv heads of 128.
nn::UlyssesBlockOptions llama_layer() {
  nn::UlyssesBlockOptions options;
  options.model_dim = 1024;
  options.heads = 8;
  options.kv_heads = 2;
  options.head_dim = 128;
  return options;
}

// `steps` training steps of the layer over `sp` thread ranks on `device`, one causal
// sequence of `tokens` tokens; rank r holds rows r · tokens/sp onwards. Returns rank 0's
// parameters after the last step, flattened, and (when `times` is given) each step's
// wall time in µs, the device drained before the clock stops.
std::vector<float> train_layer(int sp, int64_t tokens, int steps, Device device, std::vector<double>* times) {
  const nn::UlyssesBlockOptions options = llama_layer();
  const int64_t width = options.model_dim, rows = tokens / sp;
  const Tensor inputs = Generator(21).randn({1, tokens, width}), targets = Generator(22).randn({1, tokens, width});
  std::vector<float> trained;
  dist::run_local_world(sp, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Generator generator(23);  // the same initial layer on every rank
    nn::UlyssesBlock block(options, nn::sequence_group(world), generator, device);
    const std::vector<autograd::Variable> parameters = block.parameters();
    optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-3).weight_decay(0.01));
    nn::ExactGradientSync sync(parameters, world);
    const nn::Reduction mean = nn::Reduction::sum_divided_by(tokens * width);
    const int64_t first = world->rank() * rows;
    const autograd::Variable x(inputs.narrow(1, first, rows).contiguous().to(device));
    const autograd::Variable y(targets.narrow(1, first, rows).contiguous().view({rows, width}).to(device));
    for (int step = 0; step < steps; ++step) {
      world->barrier();
      const auto start = std::chrono::steady_clock::now();
      optimizer.zero_grad();
      sync.backward(nn::l1_loss(autograd::reshape(block.forward(x), {rows, width}), y, mean));
      sync.synchronize();
      optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
      optimizer.step();
      if (device.is_cuda()) cuda::synchronize(device.index);
      world->barrier();  // every rank's step done
      const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
      if (world->rank() == 0 && times != nullptr) times->push_back(elapsed.count());
    }
    if (world->rank() == 0) {
      for (const autograd::Variable& p : parameters) {
        const std::vector<float> own = p.data().to_vector();
        trained.insert(trained.end(), own.begin(), own.end());
      }
    }
  });
  return trained;
}

}  // namespace

// Exact attention (nn/attention.h) at the ulysses scenario's shape: 1024 tokens, heads of
// 16, causal; 2 heads is one rank's share after sp 4's all-to-all, 8 the whole model's.
// The forward alone, and forward plus backward as one training step pays them.
void bench_attention(Report& report, const Settings& s) {
  const int64_t tokens = 1024, head_dim = 16;
  Generator generator(11);
  for (int64_t heads : {int64_t{2}, int64_t{8}}) {
    const Shape sizes = {1, tokens, heads, head_dim};  // one sequence, [B, S, H, D]
    const Tensor q = generator.randn(sizes, kGpu), k = generator.randn(sizes, kGpu);
    const Tensor v = generator.randn(sizes, kGpu), g = generator.randn(sizes, kGpu);
    const nn::AttentionMask causal(true);
    const float scale = nn::attention_scale(head_dim);
    const std::string shape = std::to_string(tokens) + "x" + std::to_string(heads) + "x" + std::to_string(head_dim);
    const double bytes = kF * 4 * tokens * heads * head_dim;
    const double flops = 2.0 * tokens * tokens * heads * head_dim;  // q·k and p·v over half the pairs
    report.add("kernel/attention_fwd/" + shape, "exact causal attention forward",
               time_calls([&] { nn::detail::attention_forward_cuda(q, k, v, causal, scale); }, s.warmup, s.repeats),
               bytes, flops);
    report.add("kernel/attention_fwd_bwd/" + shape, "exact causal attention forward + backward",
               time_calls([&] {
                 const nn::AttentionForward forward = nn::detail::attention_forward_cuda(q, k, v, causal, scale);
                 nn::detail::attention_backward_cuda(g, q, k, v, forward, causal, scale, true, true);
               }, s.warmup, s.repeats),
               2 * bytes, 3.5 * flops);  // the backward: dP, dq, dk, dv, and P again
  }
}

// Exact attention at long context, through the public calls: 8 query heads over 2 and
// over 8 kv heads, D 128, causal, at 4,096 to 131,072 tokens. Flops as the issue counts
// them: 2·S²·H·D for a causal forward (q·k and p·v over half the pairs), 2.5 times that
// for forward plus backward, whatever the kernels recompute.
void bench_attention_long(Report& report, const Settings& s) {
  const int64_t head_dim = 128, heads = 8;
  Generator generator(13);
  const nn::AttentionMask causal = nn::AttentionMask::causal();
  for (const int64_t tokens : {int64_t{4096}, int64_t{16384}, int64_t{65536}, int64_t{131072}}) {
    // Calls of seconds need few repetitions for a stable median.
    const int repeats = std::min(s.repeats, tokens >= 65536 ? 3 : tokens >= 16384 ? 10 : 30);
    const int warmup = std::min(s.warmup, 1);
    for (const int64_t kv_heads : {int64_t{2}, int64_t{8}}) {
      const Tensor q = generator.randn({1, tokens, heads, head_dim}, kGpu);
      const Tensor k = generator.randn({1, tokens, kv_heads, head_dim}, kGpu);
      const Tensor v = generator.randn({1, tokens, kv_heads, head_dim}, kGpu);
      const Tensor g = generator.randn({1, tokens, heads, head_dim}, kGpu);
      const std::string shape = std::to_string(tokens) + "x" + std::to_string(heads) + "over" +
                                std::to_string(kv_heads) + "x" + std::to_string(head_dim);
      const double bytes = kF * (2 * tokens * heads + 2 * tokens * kv_heads) * head_dim;
      const double flops = 2.0 * tokens * tokens * heads * head_dim;
      report.add("kernel/attention_long_fwd/" + shape, "exact causal attention forward (public call)",
                 time_calls([&] { nn::attention_forward(q, k, v, causal); }, warmup, repeats), bytes, flops);
      report.add("kernel/attention_long_fwd_bwd/" + shape, "exact causal attention forward + backward",
                 time_calls([&] {
                   const nn::AttentionForward forward = nn::attention_forward(q, k, v, causal);
                   nn::attention_backward(g, q, k, v, forward, causal);
                 }, warmup, repeats),
                 2 * bytes, 2.5 * flops);
    }
  }
}

// The Llama-shaped Ulysses layer's training step with its 4 ranks as threads on one
// GPU, at 65,536 tokens: GQA 8 query heads over 2 kv heads of 128 (past the kv heads, so
// each rank holds a copy of its kv head), d_model 1,024, one causal sequence, 16,384
// rows a rank. A step is the forward, the L1 loss, the backward through both
// all-to-alls, the exact gradient sum over the ranks, clipping and AdamW. Its bits are
// checked first: the same layer at 256 tokens on the GPU ranks against one rank on the
// CPU, two steps, bit for bit (the CPU is too slow for the long sequence).
void bench_ulysses_step(Report& report, const Settings& s) {
  const int sp = 4;
  const std::vector<float> gpu = train_layer(sp, 256, 2, kGpu, nullptr);
  const std::vector<float> cpu = train_layer(1, 256, 2, Device::cpu(), nullptr);
  SEQPAR_CHECK(gpu.size() == cpu.size() && std::memcmp(gpu.data(), cpu.data(), gpu.size() * sizeof(float)) == 0,
               "seqpar-bench: the Ulysses layer on ", sp, " GPU ranks did not end with one CPU rank's bits");
  std::printf("ulysses step: 4 GPU ranks at 256 tokens, two steps: bitwise one CPU rank's parameters\n");
  const int64_t tokens = 65536;
  const int repeats = std::max(1, std::min(s.repeats, 3)), warmup = std::min(s.warmup, 1);
  std::vector<double> times;
  train_layer(sp, tokens, warmup + repeats, kGpu, &times);
  times.erase(times.begin(), times.begin() + warmup);
  std::sort(times.begin(), times.end());
  const nn::UlyssesBlockOptions layer = llama_layer();
  // Attention as bench_attention_long counts it, forward plus backward, over the 8 heads.
  const double flops = 2.5 * 2.0 * tokens * tokens * layer.heads * layer.head_dim;
  report.add("step/ulysses_4ranks_threads/65536x8over2x128",
             "Llama-shaped Ulysses layer, 4 ranks as threads on one GPU, exact policy, one training step",
             Timing{times[times.size() / 2], times.front(), static_cast<int>(times.size())}, 0.0, flops);
}

}  // namespace seqpar::bench
