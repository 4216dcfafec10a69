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

// out[d] = chain over j < count of weights[j] · rows[j][d], every d at once.
SEQPAR_VECTOR_TARGET void chains_over_rows(const float* weights, const HeadRows& b, int64_t count,
                                           float* out) {
  for (int64_t d = 0; d < b.dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    const float* row = b.row(j);
    for (int64_t d = 0; d < b.dim; ++d) out[d] = std::fma(weights[j], row[d], out[d]);
  }
}

SEQPAR_VECTOR_TARGET void forward_head(const HeadRows& q, const HeadRows& k, const HeadRows& v,
                                       bool causal, float scale, std::vector<float>& out,
                                       float* row_max, float* row_sum) {
  std::vector<float> p(q.tokens);
  out.assign(q.tokens * q.dim, 0.0f);
  for (int64_t i = 0; i < q.tokens; ++i) {
    const int64_t visible = causal ? i + 1 : q.tokens;
    chains_over_keys(q.row(i), k, visible, p.data());
    float m = -INFINITY;
    for (int64_t j = 0; j < visible; ++j) {
      p[j] = scale * p[j];
      m = p[j] > m ? p[j] : m;
    }
    float l = 0.0f;
    for (int64_t j = 0; j < visible; ++j) {
      p[j] = correctly_rounded_exp(p[j] - m);
      l += p[j];
    }
    float* o = out.data() + i * q.dim;
    chains_over_rows(p.data(), v, visible, o);
    for (int64_t d = 0; d < q.dim; ++d) o[d] = visible == 0 ? 0.0f : o[d] / l;
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
                                        const float* row_max, const float* row_sum, bool causal,
                                        float scale, HeadGrads& grads) {
  const int64_t dim = q.dim;
  grads.q.assign(q.tokens * dim, 0.0f);
  grads.k.assign(q.tokens * dim, 0.0f);
  grads.v.assign(q.tokens * dim, 0.0f);
  std::vector<float> probability(q.tokens), ds(q.tokens);
  for (int64_t i = 0; i < q.tokens; ++i) {
    const int64_t visible = causal ? i + 1 : q.tokens;
    float delta = 0.0f;
    for (int64_t d = 0; d < dim; ++d) delta = std::fma(g.row(i)[d], out.row(i)[d], delta);
    chains_over_keys(q.row(i), k, visible, probability.data());
    chains_over_keys(g.row(i), v, visible, ds.data());  // dP
    for (int64_t j = 0; j < visible; ++j) {
      probability[j] = correctly_rounded_exp(scale * probability[j] - row_max[i]) / row_sum[i];
      ds[j] = probability[j] * (ds[j] - delta);
      add_query_terms(probability[j], g.row(i), dim, grads.v.data() + j * dim);
      add_query_terms(ds[j], q.row(i), dim, grads.k.data() + j * dim);
    }
    float* dq = grads.q.data() + i * dim;
    chains_over_rows(ds.data(), k, visible, dq);
    for (int64_t d = 0; d < dim; ++d) dq[d] = scale * dq[d];
  }
  for (float& value : grads.k) value = scale * value;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  if (!host_has_fma()) return reference::attention_forward(q, k, v, causal);
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
    forward_head(qh, kh, vh, causal, scale, out, result.row_max.data() + h * tokens,
                 result.row_sum.data() + h * tokens);
    store_head(out, h, result.out);
  }
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward, bool causal) {
  if (!host_has_fma()) return reference::attention_backward(grad_out, q, k, v, forward, causal);
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
                  forward.row_sum.data() + h * tokens, causal, scale, grads);
    store_head(grads.q, h, result.q);
    store_head(grads.k, h, result.k);
    store_head(grads.v, h, result.v);
  }
  return result;
}

}  // namespace seqpar::nn::cpu
