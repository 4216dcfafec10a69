#include "core/elementwise.h"

#include "core/error.h"

namespace seqpar {

namespace detail {

void axpby(float* out, const float* a, float alpha, const float* b, float beta, int64_t count,
           Device device) {
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device.is_cuda()) return axpby_cuda(out, a, alpha, b, beta, count, device.index);
#endif
  SEQPAR_CHECK(device.is_host(), "elementwise op on ", device, ": this seqpar was built without CUDA");
  if (b == nullptr) {
    for (int64_t i = 0; i < count; ++i) out[i] = alpha * a[i];
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = alpha * a[i] + beta * b[i];
  }
}

}  // namespace detail

static void check_same(const char* op, const Tensor& a, const Tensor& b) {
  SEQPAR_CHECK(a.defined() && b.defined(), op, ": undefined tensor");
  SEQPAR_CHECK(a.shape() == b.shape(), op, ": shapes differ: ", a.shape(), " vs ", b.shape());
  SEQPAR_CHECK(a.device() == b.device(), op, ": devices differ: ", a.device(), " vs ", b.device());
}

static Tensor combine(const char* op, const Tensor& a, float alpha, const Tensor& b, float beta) {
  check_same(op, a, b);
  const Tensor x = a.contiguous(), y = b.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.device());
  detail::axpby(out.data(), x.data(), alpha, y.data(), beta, out.numel(), out.device());
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return combine("add", a, 1.0f, b, 1.0f); }
Tensor sub(const Tensor& a, const Tensor& b) { return combine("sub", a, 1.0f, b, -1.0f); }

Tensor mul(const Tensor& a, float scalar) {
  SEQPAR_CHECK(a.defined(), "mul: undefined tensor");
  const Tensor x = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.device());
  detail::axpby(out.data(), x.data(), scalar, nullptr, 0.0f, out.numel(), out.device());
  return out;
}

void add_(Tensor& destination, const Tensor& source) {
  check_same("add_", destination, source);
  SEQPAR_CHECK(destination.is_contiguous(), "add_: destination of shape ", destination.shape(),
               " must be contiguous");
  const Tensor y = source.contiguous();
  detail::axpby(destination.data(), destination.data(), 1.0f, y.data(), 1.0f, destination.numel(),
                destination.device());
}

void mul_(Tensor& destination, float scalar) {
  SEQPAR_CHECK(destination.defined(), "mul_: undefined tensor");
  SEQPAR_CHECK(destination.is_contiguous(), "mul_: destination of shape ", destination.shape(),
               " must be contiguous");
  detail::axpby(destination.data(), destination.data(), scalar, nullptr, 0.0f, destination.numel(),
                destination.device());
}

}  // namespace seqpar
