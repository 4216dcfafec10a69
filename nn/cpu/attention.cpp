// Attention's fast CPU path. Every value is computed by the reference's chain (an fma
// chain in index order from +0, nn/attention.h); what changes is which chains run side
// by side:
//   - scores and dP: the chains of eight keys at once, over a head's keys (and values)
//     transposed to [D, S], so lane l reads key j + l;
//   - P·V, dQ, dK, dV: the chains of all head dims at once, over contiguous rows [S, D].
// The exponentials, the max and the softmax denominator stay scalar, in key order.
// Compiled for AVX2 with FMA, where std::fma is one instruction; a host without them
// runs the reference's loops (the same bits, slower).
#include "nn/cpu/attention.h"

#include <cmath>
#include <vector>

#include "core/exp.h"
#include "nn/reference/attention.h"

namespace seqpar::nn::cpu {

namespace {

#define SEQPAR_VECTOR_TARGET __attribute__((target("avx2,fma")))

bool host_has_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// One head's tokens, copied contiguous: rows [S, D] and, for the key-lane chains, the
// transpose [D, S].
struct HeadRows {
  int64_t tokens = 0, dim = 0;
  std::vector<float> rows, columns;
  void load(const Tensor& t, int64_t h, bool transpose) {
    tokens = t.size(0);
    dim = t.size(2);
    const int64_t stride = t.size(1) * dim;
    rows.resize(tokens * dim);
    for (int64_t s = 0; s < tokens; ++s) {
      for (int64_t d = 0; d < dim; ++d) rows[s * dim + d] = t.data()[s * stride + h * dim + d];
    }
    if (!transpose) return;
    columns.resize(tokens * dim);
    for (int64_t s = 0; s < tokens; ++s) {
      for (int64_t d = 0; d < dim; ++d) columns[d * tokens + s] = rows[s * dim + d];
    }
  }
  const float* row(int64_t s) const { return rows.data() + s * dim; }
};

void store_head(const std::vector<float>& rows, int64_t h, const Tensor& t) {
  const int64_t dim = t.size(2), stride = t.size(1) * dim;
  for (int64_t s = 0; s < t.size(0); ++s) {
    for (int64_t d = 0; d < dim; ++d) t.data()[s * stride + h * dim + d] = rows[s * dim + d];
  }
}

// out[j] = chain over d of a[d] · columns[d][j], for j < count: eight keys a step.
SEQPAR_VECTOR_TARGET void chains_over_keys(const float* a, const HeadRows& b, int64_t count,
                                           float* out) {
  constexpr int kLanes = 8;
  int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes) {
    float sum[kLanes] = {};
    for (int64_t d = 0; d < b.dim; ++d) {
      const float* column = b.columns.data() + d * b.tokens + j;
      for (int l = 0; l < kLanes; ++l) sum[l] = std::fma(a[d], column[l], sum[l]);
    }
    for (int l = 0; l < kLanes; ++l) out[j + l] = sum[l];
  }
  for (; j < count; ++j) {
    float sum = 0.0f;
    for (int64_t d = 0; d < b.dim; ++d) sum = std::fma(a[d], b.columns[d * b.tokens + j], sum);
    out[j] = sum;
  }
}

// out[d] = chain over n of weights[n] · rows[keys[n]][d], every d at once.
SEQPAR_VECTOR_TARGET void chains_over_rows(const float* weights, const std::vector<int64_t>& keys,
                                           const HeadRows& b, float* out) {
  for (int64_t d = 0; d < b.dim; ++d) out[d] = 0.0f;
  for (size_t n = 0; n < keys.size(); ++n) {
    const float* row = b.row(keys[n]);
    for (int64_t d = 0; d < b.dim; ++d) out[d] = std::fma(weights[n], row[d], out[d]);
  }
}

// The visible keys of query i, and how many keys' chains to run side by side to cover
// them (every key up to the last visible one; the chains of hidden keys are dropped).
int64_t visible_span(const AttentionMask& mask, int64_t i, int64_t tokens, std::vector<int64_t>& keys) {
  mask.visible_keys(i, tokens, keys);
  return keys.empty() ? 0 : keys.back() + 1;
}

SEQPAR_VECTOR_TARGET void forward_head(const HeadRows& q, const HeadRows& k, const HeadRows& v,
                                       const AttentionMask& mask, float scale,
                                       std::vector<float>& out, float* row_max, float* row_sum) {
  std::vector<float> all(q.tokens), p(q.tokens);
  std::vector<int64_t> keys;
  out.assign(q.tokens * q.dim, 0.0f);
  for (int64_t i = 0; i < q.tokens; ++i) {
    chains_over_keys(q.row(i), k, visible_span(mask, i, q.tokens, keys), all.data());
    float m = -INFINITY;
    for (size_t n = 0; n < keys.size(); ++n) {
      p[n] = scale * all[keys[n]];
      m = p[n] > m ? p[n] : m;
    }
    float l = 0.0f;
    for (size_t n = 0; n < keys.size(); ++n) {
      p[n] = correctly_rounded_exp(p[n] - m);
      l += p[n];
    }
    float* o = out.data() + i * q.dim;
    chains_over_rows(p.data(), keys, v, o);
    for (int64_t d = 0; d < q.dim; ++d) o[d] = keys.empty() ? 0.0f : o[d] / l;
    row_max[i] = m;
    row_sum[i] = l;
  }
}

struct HeadGrads {
  std::vector<float> q, k, v;
};

// dk_j and dv_j chains: one more query's terms, every d at once.
SEQPAR_VECTOR_TARGET void add_query_terms(float weight, const float* row, int64_t dim, float* sums) {
  for (int64_t d = 0; d < dim; ++d) sums[d] = std::fma(weight, row[d], sums[d]);
}

SEQPAR_VECTOR_TARGET void backward_head(const HeadRows& g, const HeadRows& q, const HeadRows& k,
                                        const HeadRows& v, const HeadRows& out,
                                        const float* row_max, const float* row_sum,
                                        const AttentionMask& mask, float scale, HeadGrads& grads) {
  const int64_t dim = q.dim;
  grads.q.assign(q.tokens * dim, 0.0f);
  grads.k.assign(q.tokens * dim, 0.0f);
  grads.v.assign(q.tokens * dim, 0.0f);
  std::vector<float> scores(q.tokens), dp(q.tokens), ds(q.tokens);
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < q.tokens; ++i) {
    const int64_t span = visible_span(mask, i, q.tokens, keys);
    float delta = 0.0f;
    for (int64_t d = 0; d < dim; ++d) delta = std::fma(g.row(i)[d], out.row(i)[d], delta);
    chains_over_keys(q.row(i), k, span, scores.data());
    chains_over_keys(g.row(i), v, span, dp.data());
    for (size_t n = 0; n < keys.size(); ++n) {
      const int64_t j = keys[n];
      const float probability = correctly_rounded_exp(scale * scores[j] - row_max[i]) / row_sum[i];
      ds[n] = probability * (dp[j] - delta);
      add_query_terms(probability, g.row(i), dim, grads.v.data() + j * dim);
      add_query_terms(ds[n], q.row(i), dim, grads.k.data() + j * dim);
    }
    float* dq = grads.q.data() + i * dim;
    chains_over_rows(ds.data(), keys, k, dq);
    for (int64_t d = 0; d < dim; ++d) dq[d] = scale * dq[d];
  }
  for (float& value : grads.k) value = scale * value;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask) {
  if (!host_has_fma()) return reference::attention_forward(q, k, v, mask);
  const int64_t tokens = q.size(0), heads = q.size(1);
  const float scale = attention_scale(q.size(2));
  AttentionForward result{Tensor::empty(q.shape(), q.device()),
                          Tensor::empty({heads, tokens}, q.device()),
                          Tensor::empty({heads, tokens}, q.device())};
  HeadRows qh, kh, vh;
  std::vector<float> out;
  for (int64_t h = 0; h < heads; ++h) {
    qh.load(q, h, false);
    kh.load(k, h, true);
    vh.load(v, h, false);
    forward_head(qh, kh, vh, mask, scale, out, result.row_max.data() + h * tokens,
                 result.row_sum.data() + h * tokens);
    store_head(out, h, result.out);
  }
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask) {
  if (!host_has_fma()) return reference::attention_backward(grad_out, q, k, v, forward, mask);
  const int64_t tokens = q.size(0), heads = q.size(1);
  const float scale = attention_scale(q.size(2));
  AttentionGrads result{Tensor::empty(q.shape(), q.device()), Tensor::empty(k.shape(), k.device()),
                        Tensor::empty(v.shape(), v.device())};
  HeadRows gh, qh, kh, vh, oh;
  HeadGrads grads;
  for (int64_t h = 0; h < heads; ++h) {
    gh.load(grad_out, h, false);
    qh.load(q, h, false);
    kh.load(k, h, true);
    vh.load(v, h, true);
    oh.load(forward.out, h, false);
    backward_head(gh, qh, kh, vh, oh, forward.row_max.data() + h * tokens,
                  forward.row_sum.data() + h * tokens, mask, scale, grads);
    store_head(grads.q, h, result.q);
    store_head(grads.k, h, result.k);
    store_head(grads.v, h, result.v);
  }
  return result;
}

}  // namespace seqpar::nn::cpu
