// seqpar-cpu-attention-bench: the CPU path of exact attention (nn/cpu/attention.cpp) at
// one shape, forward and forward plus backward, wall time of each call (median of
// --repeats after one warm-up). bench/torch_cpu_attention.py times PyTorch's attention
// on the same shape and threads, for the table in bench/RESULTS.md.
//
//   seqpar-cpu-attention-bench [--tokens S] [--heads H] [--kv-heads HKV] [--dim D] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/generator.h"
#include "core/parallel.h"
#include "nn/attention.h"

using namespace seqpar;

namespace {

double median_seconds(const std::function<void()>& call, int repeats) {
  call();  // warm-up
  std::vector<double> times;
  for (int n = 0; n < repeats; ++n) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096, heads = 8, kv_heads = 8, dim = 64;
  int repeats = 3;
  for (int n = 1; n < argc; ++n) {
    const auto value = [&](const char* name) -> long {
      if (n + 1 >= argc) {
        std::fprintf(stderr, "seqpar-cpu-attention-bench: %s needs a value\n", name);
        std::exit(2);
      }
      char* end = nullptr;
      const long parsed = std::strtol(argv[++n], &end, 10);
      if (*end != '\0' || parsed < 1 || parsed > (1L << 24)) {
        std::fprintf(stderr, "seqpar-cpu-attention-bench: %s takes a whole number from 1 to 2^24; got '%s'\n",
                     name, argv[n]);
        std::exit(2);
      }
      return parsed;
    };
    const std::string flag = argv[n];
    if (flag == "--tokens") tokens = value("--tokens");
    else if (flag == "--heads") heads = value("--heads");
    else if (flag == "--kv-heads") kv_heads = value("--kv-heads");
    else if (flag == "--dim") dim = value("--dim");
    else if (flag == "--repeats") repeats = static_cast<int>(value("--repeats"));
    else {
      std::fprintf(stderr,
                   "usage: seqpar-cpu-attention-bench [--tokens S] [--heads H] [--kv-heads HKV] [--dim D] "
                   "[--repeats N]\n");
      return flag == "--help" ? 0 : 2;
    }
  }
  try {
    Generator generator(17);
    const Tensor q = generator.randn({1, tokens, heads, dim}), k = generator.randn({1, tokens, kv_heads, dim});
    const Tensor v = generator.randn({1, tokens, kv_heads, dim}), g = generator.randn({1, tokens, heads, dim});
    const nn::AttentionMask causal = nn::AttentionMask::causal();
    const double forward = median_seconds([&] { nn::attention_forward(q, k, v, causal); }, repeats);
    const double step = median_seconds([&] {
      const nn::AttentionForward f = nn::attention_forward(q, k, v, causal);
      nn::attention_backward(g, q, k, v, f, causal);
    }, repeats);
    std::printf("seqpar cpu attention, causal, S %lld, %lld heads over %lld, D %lld, %d threads: "
                "forward %.3f s, forward + backward %.3f s\n",
                static_cast<long long>(tokens), static_cast<long long>(heads), static_cast<long long>(kv_heads),
                static_cast<long long>(dim), cpu_threads(), forward, step);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "seqpar-cpu-attention-bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
