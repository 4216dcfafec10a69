// RoPE's plain loops, as nn/rope.h states them: each product rounded to float, then
// the sum or difference (the library is built with -ffp-contract=off: nothing fused).
#include "nn/reference/rope.h"

namespace seqpar::nn::reference {

Tensor rope_rotate(const Tensor& x, const Tensor& cos, const Tensor& sin, bool transposed) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2, rows = cos.size(0);
  Tensor out = Tensor::empty(x.shape(), x.device());
  // The backward rotates by -angle: sin's sign flips, which is exact.
  const float sign = transposed ? -1.0f : 1.0f;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* in = x.data() + (t * heads + h) * 2 * half;
      float* o = out.data() + (t * heads + h) * 2 * half;
      for (int64_t m = 0; m < half; ++m) {
        const int64_t row = t % rows;
        const float c = cos.data()[row * half + m], s = sign * sin.data()[row * half + m];
        const float first = in[m], second = in[m + half];
        o[m] = first * c - second * s;
        o[m + half] = second * c + first * s;
      }
    }
  }
  return out;
}

}  // namespace seqpar::nn::reference
