// Attention's plain loops, as nn/attention.h states them: one head at a time, one
// query at a time, every sum an fma chain in index order from +0.
#include "nn/reference/attention.h"

#include <cmath>
#include <vector>

#include "core/exp.h"

namespace seqpar::nn::reference {

namespace {

// One head of [S, H, D] tensors: element (t, d) of head h.
struct Head {
  const float* data;
  int64_t token_stride;  // H · D
  const float* token(int64_t t) const { return data + t * token_stride; }
};
struct MutableHead {
  float* data;
  int64_t token_stride;
  float* token(int64_t t) const { return data + t * token_stride; }
};

struct Shape3 {
  int64_t tokens, heads, dim;
  const AttentionMask& mask;
  void visible_keys(int64_t i, std::vector<int64_t>& keys) const { mask.visible_keys(i, tokens, keys); }
};

Shape3 shape_of(const Tensor& q, const AttentionMask& mask) {
  return {q.size(0), q.size(1), q.size(2), mask};
}

// a · b over d, an fma chain in index order from +0.
float dot(const float* a, const float* b, int64_t dim) {
  float sum = 0.0f;
  for (int64_t d = 0; d < dim; ++d) sum = std::fma(a[d], b[d], sum);
  return sum;
}

// s_ij = fl(c · (q_i · k_j)) for the visible keys j of query i.
void scores(const Head& q, const Head& k, const Shape3& shape, float scale, int64_t i,
            const std::vector<int64_t>& keys, std::vector<float>& s) {
  s.resize(keys.size());
  for (size_t n = 0; n < keys.size(); ++n) s[n] = scale * dot(q.token(i), k.token(keys[n]), shape.dim);
}

float max_of(const std::vector<float>& s) {
  float m = -INFINITY;
  for (const float value : s) m = value > m ? value : m;
  return m;
}

void forward_head(const Head& q, const Head& k, const Head& v, const Shape3& shape, float scale,
                  const MutableHead& out, float* row_max, float* row_sum) {
  std::vector<int64_t> keys;
  std::vector<float> p;
  for (int64_t i = 0; i < shape.tokens; ++i) {
    shape.visible_keys(i, keys);
    scores(q, k, shape, scale, i, keys, p);
    const float m = max_of(p);
    float l = 0.0f;
    for (float& value : p) {
      value = correctly_rounded_exp(value - m);
      l += value;
    }
    for (int64_t d = 0; d < shape.dim; ++d) {
      float sum = 0.0f;
      for (size_t n = 0; n < keys.size(); ++n) sum = std::fma(p[n], v.token(keys[n])[d], sum);
      out.token(i)[d] = keys.empty() ? 0.0f : sum / l;  // no visible key: +0
    }
    row_max[i] = m;
    row_sum[i] = l;
  }
}

// One head's gradients. dk and dv hold +0 on entry; their chains run over the
// queries in the order of the outer loop (ascending), then dk is scaled by c.
void backward_head(const Head& g, const Head& q, const Head& k, const Head& v, const Head& out,
                   const float* row_max, const float* row_sum, const Shape3& shape, float scale,
                   const MutableHead& dq, const MutableHead& dk, const MutableHead& dv) {
  std::vector<int64_t> keys;
  std::vector<float> ds;
  for (int64_t i = 0; i < shape.tokens; ++i) {
    shape.visible_keys(i, keys);
    scores(q, k, shape, scale, i, keys, ds);
    const float delta = dot(g.token(i), out.token(i), shape.dim);
    for (size_t n = 0; n < keys.size(); ++n) {
      const int64_t j = keys[n];
      const float probability = correctly_rounded_exp(ds[n] - row_max[i]) / row_sum[i];
      const float dp = dot(g.token(i), v.token(j), shape.dim);
      ds[n] = probability * (dp - delta);
      for (int64_t d = 0; d < shape.dim; ++d) {
        dv.token(j)[d] = std::fma(probability, g.token(i)[d], dv.token(j)[d]);
        dk.token(j)[d] = std::fma(ds[n], q.token(i)[d], dk.token(j)[d]);
      }
    }
    for (int64_t d = 0; d < shape.dim; ++d) {
      float sum = 0.0f;
      for (size_t n = 0; n < keys.size(); ++n) sum = std::fma(ds[n], k.token(keys[n])[d], sum);
      dq.token(i)[d] = scale * sum;
    }
  }
  for (int64_t j = 0; j < shape.tokens; ++j) {
    for (int64_t d = 0; d < shape.dim; ++d) dk.token(j)[d] = scale * dk.token(j)[d];
  }
}

Head head_of(const Tensor& t, int64_t h) { return {t.data() + h * t.size(2), t.size(1) * t.size(2)}; }
MutableHead mutable_head_of(const Tensor& t, int64_t h) {
  return {t.data() + h * t.size(2), t.size(1) * t.size(2)};
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask) {
  const Shape3 shape = shape_of(q, mask);
  const float scale = attention_scale(shape.dim);
  AttentionForward result{Tensor::empty(q.shape(), q.device()),
                          Tensor::empty({shape.heads, shape.tokens}, q.device()),
                          Tensor::empty({shape.heads, shape.tokens}, q.device())};
  for (int64_t h = 0; h < shape.heads; ++h) {
    forward_head(head_of(q, h), head_of(k, h), head_of(v, h), shape, scale,
                 mutable_head_of(result.out, h), result.row_max.data() + h * shape.tokens,
                 result.row_sum.data() + h * shape.tokens);
  }
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask) {
  const Shape3 shape = shape_of(q, mask);
  const float scale = attention_scale(shape.dim);
  AttentionGrads grads{Tensor::empty(q.shape(), q.device()), Tensor::zeros(k.shape(), k.device()),
                       Tensor::zeros(v.shape(), v.device())};
  for (int64_t h = 0; h < shape.heads; ++h) {
    backward_head(head_of(grad_out, h), head_of(q, h), head_of(k, h), head_of(v, h),
                  head_of(forward.out, h), forward.row_max.data() + h * shape.tokens,
                  forward.row_sum.data() + h * shape.tokens, shape, scale,
                  mutable_head_of(grads.q, h), mutable_head_of(grads.k, h),
                  mutable_head_of(grads.v, h));
  }
  return grads;
}

}  // namespace seqpar::nn::reference
