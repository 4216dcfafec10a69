// seqpar-bench's attention sections: exact attention at the Ulysses scenario's shape
// through the CUDA launchers, and at long context through the public calls.
#include <algorithm>
#include <cstdint>
#include <string>

#include "bench/src/bench_sections.h"
#include "core/generator.h"
#include "nn/attention.h"
#include "nn/cuda/attention.h"

namespace seqpar::bench {

namespace {

constexpr double kF = sizeof(float);
const Device kGpu = Device::cuda(0);

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

}  // namespace seqpar::bench
