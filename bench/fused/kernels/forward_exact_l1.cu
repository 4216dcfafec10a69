// The few-outputs forward with the exact L1 loss as its epilogue (exact_step.h): nn's
// staged kernel (nn/cuda/linear_forward_few_outputs.cuh), instantiated with ExactL1Epilogue.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "bench/fused/kernels/exact_l1.cuh"
#include "bench/fused/kernels/exact_step.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "nn/cuda/linear_forward_few_outputs.cuh"
#include "nn/cuda/linear.h"

namespace seqpar::fused::kernels {

using nn::detail::ConstRows;
using nn::detail::default_per_thread;
using nn::detail::few_outputs_forward_staged_kernel;
using nn::detail::kFewOutputsMax;
using nn::detail::kFewOutputsThreads;
using nn::detail::staged_extra_bytes;
using nn::detail::staged_layout;

bool few_outputs_forward_exact_l1_fits(const ConstRows& x, int64_t out) {
  return nn::detail::few_outputs_forward_fits(x, out) && out >= 1 && staged_layout(x);
}

void few_outputs_forward_exact_l1_cuda(const ConstRows& x, const float* weight,
                                       int64_t weight_row_stride, const float* bias, int64_t out,
                                       float* y, int device, unsigned int* x_largest,
                                       const ExactL1Target& target, const ExactL1Outputs& outputs) {
  SEQPAR_CHECK(few_outputs_forward_exact_l1_fits(x, out), "few_outputs_forward_exact_l1_cuda: ", x.rows, " x ",
               x.cols, " -> ", out, " is not a Linear with few outputs with 16-byte-aligned rows of x");
  SEQPAR_CHECK(x_largest != nullptr, "few_outputs_forward_exact_l1_cuda: x's maxima are required");
  SEQPAR_CHECK(std::isfinite(target.scale), "few_outputs_forward_exact_l1_cuda: the loss scale ",
               target.scale, " is not finite");
  if (x.rows == 0) return;
  cuda::set_device(device);
  const auto launch = [&](auto per_thread) {
    constexpr int kPerThread = decltype(per_thread)::value;
    const size_t weight_bytes = static_cast<size_t>(x.cols) * kFewOutputsMax * sizeof(float);
    const int64_t rows_per_block = kFewOutputsThreads / (kFewOutputsMax / kPerThread);
    const unsigned blocks = static_cast<unsigned>(cuda::ceil_div(x.rows, rows_per_block));
    const auto kernel = few_outputs_forward_staged_kernel<kPerThread, true, ExactL1Epilogue>;
    const size_t bytes = weight_bytes + staged_extra_bytes<kPerThread, true, ExactL1Epilogue>();
    cuda::allow_dynamic_shared_memory(kernel, bytes);
    cuda::launch_dependent(kernel, dim3(blocks), dim3(kFewOutputsThreads), bytes,
                           cuda::current_stream(device), x, weight, weight_row_stride, bias, out, y,
                           out, x_largest, ExactL1Epilogue{target, outputs});
  };
  if (default_per_thread(x.rows, device) == 8) {
    launch(std::integral_constant<int, 8>{});
  } else {
    launch(std::integral_constant<int, 4>{});
  }
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::fused::kernels
