#include "dist/local_reduce.h"

#include <algorithm>
#include <cmath>

#include "core/elementwise.h"
#include "core/error.h"
#include "core/exact_sums.h"

namespace seqpar::dist::detail {

void reduce_into(Tensor& accumulator, const Tensor& source, ReduceOp op) {
  SEQPAR_CHECK(accumulator.is_contiguous(), "reduce_into: the accumulator must be contiguous");
  SEQPAR_CHECK(accumulator.shape() == source.shape() && accumulator.device() == source.device(),
               "reduce_into: accumulator ", accumulator.shape(), " on ", accumulator.device(),
               " vs source ", source.shape(), " on ", source.device());
  if (op != ReduceOp::Max) {
    // core's add_ rounds once per element on both backends: a + b, nothing fused.
    add_(accumulator, source);
    return;
  }
  const Tensor packed = source.contiguous();
  const int64_t count = accumulator.numel();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (accumulator.device().is_cuda()) {
    return max_into_cuda(accumulator.data(), packed.data(), count, accumulator.device().index);
  }
#endif
  float* out = accumulator.data();
  const float* in = packed.data();
  for (int64_t i = 0; i < count; ++i) out[i] = std::fmax(out[i], in[i]);
}

void reduce_words_into(int64_t* accumulator, const int64_t* source, int64_t count, Device device,
                       bool max) {
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device.is_cuda()) {
    if (max) return max_words_into_cuda(accumulator, source, count, device.index);
    return exact::detail::add_digits_cuda(accumulator, source, count, device.index);
  }
#endif
  (void)device;
  for (int64_t i = 0; i < count; ++i) {
    accumulator[i] = max ? std::max(accumulator[i], source[i])
                         : static_cast<int64_t>(static_cast<uint64_t>(accumulator[i]) +
                                                static_cast<uint64_t>(source[i]));
  }
}

void divide_(Tensor& tensor, float divisor) {
  SEQPAR_CHECK(tensor.is_contiguous(), "divide_: the tensor must be contiguous");
  const int64_t count = tensor.numel();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (tensor.device().is_cuda()) return divide_cuda(tensor.data(), count, divisor, tensor.device().index);
#endif
  float* data = tensor.data();
  for (int64_t i = 0; i < count; ++i) data[i] = data[i] / divisor;
}

}  // namespace seqpar::dist::detail
