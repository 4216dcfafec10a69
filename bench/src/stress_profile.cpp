// seqpar-stress-profile: one part of the benchmark's stress shape (x 1,048,576 x 1024
// from randn, Linear 1024 -> 1024), run twice and nothing else: a program for a
// profiler to take apart kernel by kernel, e.g.
//
//   ncu --metrics gpu__time_duration.sum,dram__bytes.sum --print-summary per-kernel
//       build/bench/seqpar-stress-profile dw
//
//   dw    the exact dW after an L1 loss (dy = ±1/N) through accumulate_weight_grad_cuda
//   step  the whole step through the public API, as seqpar-bench's step/stress/public_api
//
// (bench/RESULTS.md's per-kernel figures of the stress shape come from these commands).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

#include "bench/src/bench_sections.h"
#include "core/cuda_runtime.h"
#include "core/exact_sums.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "nn/linear_kernels.h"
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

void profile_step(const Tensor& x) {
  Generator generator(9);
  nn::Linear model(kFeatures, kFeatures, generator, Device::cuda());
  optim::AdamW optimizer(model.parameters(), bench::issue_adamw());
  const autograd::Variable input(x);
  for (int call = 0; call < 2; ++call) {
    model.zero_grad();
    const autograd::Variable loss = nn::l1_loss(model.forward(input), input);
    loss.backward();
    optim::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    cuda::synchronize(0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* part = argc > 1 ? argv[1] : "";
  if (argc != 2 || (std::strcmp(part, "dw") != 0 && std::strcmp(part, "step") != 0)) {
    std::fprintf(stderr, "usage: seqpar-stress-profile dw|step\n");
    return 2;
  }
  try {
    Generator generator(9);
    const Tensor x = generator.randn({kRows, kFeatures}, Device::cuda());
    if (std::strcmp(part, "dw") == 0) {
      profile_dw(x);
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
