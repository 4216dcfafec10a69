// seqpar-wide-dw-profile: the stress shape's exact dW after an L1 loss (x 1,048,576 x
// 1024 from randn, dy = ±1/N, 1024 outputs) through accumulate_weight_grad_cuda twice,
// and nothing else: a program for a profiler to take apart kernel by kernel, e.g.
//
//   ncu --metrics gpu__time_duration.sum,dram__bytes.sum --print-summary per-kernel
//       build/bench/seqpar-wide-dw-profile
//
// (bench/RESULTS.md's per-kernel figures of the wide dW come from that command).
#include <cstdint>
#include <cstdio>
#include <exception>

#include "core/cuda_runtime.h"
#include "core/exact_sums.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "nn/linear_kernels.h"

using namespace seqpar;

int main() {
  try {
    const int64_t rows = int64_t{1} << 20, in = 1024, out = 1024;
    Generator generator(9);
    const Tensor x = generator.randn({rows, in}, Device::cuda());
    // dy = ±f, the signs from a 64-bit LCG's top bit (cheap for 2^30 of them).
    Tensor signs = Tensor::empty({rows, out});
    const float f = 1.0f / static_cast<float>(rows * out);
    uint64_t state = 12345;
    float* value = signs.data();
    for (int64_t i = 0; i < rows * out; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      value[i] = (state >> 63) != 0 ? f : -f;
    }
    const Tensor dy = signs.to(Device::cuda());
    exact::ExactSums sums(out * in, Device::cuda());
    for (int call = 0; call < 2; ++call) {
      nn::detail::accumulate_weight_grad_cuda(nn::detail::const_rows_of(dy),
                                              nn::detail::const_rows_of(x), sums);
      cuda::synchronize(0);
    }
    std::printf("seqpar-wide-dw-profile: 2 calls of the wide dW at %lld x %lld -> %lld done\n",
                static_cast<long long>(rows), static_cast<long long>(in), static_cast<long long>(out));
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "seqpar-wide-dw-profile: %s\n", error.what());
    return 1;
  }
}
