// Attention's fast CPU path. Every value is computed by the reference's chain (an fma
// chain in the call's token order from +0, nn/attention.h); what changes is which
// chains run side by side:
//   - scores and dP: the chains of eight keys at once, over a head's keys (and values)
//     transposed to [D, S], so lane l reads key j + l;
//   - P·V, dQ, dK, dV: the chains of all head dims at once, over contiguous rows [S, D].
// The exponentials, the max and the softmax denominator stay scalar, in key order; the
// query heads that share a kv head meet in the same exact sum as the reference's.
// Compiled for AVX2 with FMA, where std::fma is one instruction; a host without them
// runs the reference's loops (the same bits, slower).
#include "nn/cpu/attention.h"

#include <cmath>
#include <vector>

#include "core/exact_rounding.h"
#include "core/exp.h"
#include "nn/reference/attention.h"

namespace seqpar::nn::cpu {

namespace {

#define SEQPAR_VECTOR_TARGET __attribute__((target("avx2,fma")))

bool host_has_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

// One head of one sequence, copied contiguous: rows [S, D] and, for the key-lane
// chains, the transpose [D, S].
struct HeadRows {
  int64_t tokens = 0, dim = 0;
  std::vector<float> rows, columns;
  // Head h of sequence b of a contiguous [B, S, H, D] tensor.
  void load(const Tensor& t, int64_t b, int64_t h, bool transpose) {
    tokens = t.size(1);
    dim = t.size(3);
    const int64_t stride = t.size(2) * dim;
    const float* first = t.data() + (b * tokens * t.size(2) + h) * dim;
    rows.resize(tokens * dim);
    for (int64_t s = 0; s < tokens; ++s) {
      for (int64_t d = 0; d < dim; ++d) rows[s * dim + d] = first[s * stride + d];
    }
    if (!transpose) return;
    columns.resize(tokens * dim);
    for (int64_t s = 0; s < tokens; ++s) {
      for (int64_t d = 0; d < dim; ++d) columns[d * tokens + s] = rows[s * dim + d];
    }
  }
  const float* row(int64_t s) const { return rows.data() + s * dim; }
};

void store_head(const std::vector<float>& rows, int64_t b, int64_t h, const Tensor& t) {
  const int64_t tokens = t.size(1), dim = t.size(3), stride = t.size(2) * dim;
  float* first = t.data() + (b * tokens * t.size(2) + h) * dim;
  for (int64_t s = 0; s < tokens; ++s) {
    for (int64_t d = 0; d < dim; ++d) first[s * stride + d] = rows[s * dim + d];
  }
}

// out[j] = chain over d of a[d] · columns[d][j], for first <= j < end: eight keys a step.
SEQPAR_VECTOR_TARGET void chains_over_keys(const float* a, const HeadRows& b, int64_t first,
                                           int64_t end, float* out) {
  constexpr int kLanes = 8;
  int64_t j = first;
  for (; j + kLanes <= end; j += kLanes) {
    float sum[kLanes] = {};
    for (int64_t d = 0; d < b.dim; ++d) {
      const float* column = b.columns.data() + d * b.tokens + j;
      for (int l = 0; l < kLanes; ++l) sum[l] = std::fma(a[d], column[l], sum[l]);
    }
    for (int l = 0; l < kLanes; ++l) out[j + l] = sum[l];
  }
  for (; j < end; ++j) {
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

// dk_j and dv_j chains: one more query's terms, every d at once.
SEQPAR_VECTOR_TARGET void add_query_terms(float weight, const float* row, int64_t dim, float* sums) {
  for (int64_t d = 0; d < dim; ++d) sums[d] = std::fma(weight, row[d], sums[d]);
}

// The keys of sequence b that query i sees, in order; the chains of keys first .. end-1
// are run side by side to cover them (those of hidden keys between are dropped).
struct Visible {
  std::vector<int64_t> keys;
  int64_t first = 0, end = 0;
  void find(const AttentionMask::Table& mask, int64_t b, int64_t i) {
    keys.clear();
    for (int64_t j = 0; j < mask.keys; ++j) {
      if (mask.visible(b, i, j)) keys.push_back(j);
    }
    first = keys.empty() ? 0 : keys.front();
    end = keys.empty() ? 0 : keys.back() + 1;
  }
};

int64_t row_index(int64_t b, int64_t h, int64_t i, int64_t heads, int64_t queries) {
  return (b * heads + h) * queries + i;
}

SEQPAR_VECTOR_TARGET void forward_head(const HeadRows& q, const HeadRows& k, const HeadRows& v,
                                       const AttentionMask::Table& mask, int64_t b, float scale,
                                       std::vector<float>& out, float* row_max, float* row_sum) {
  std::vector<float> all(k.tokens), p(k.tokens);
  Visible visible;
  out.assign(q.tokens * q.dim, 0.0f);
  for (int64_t i = 0; i < q.tokens; ++i) {
    visible.find(mask, b, i);
    const std::vector<int64_t>& keys = visible.keys;
    chains_over_keys(q.row(i), k, visible.first, visible.end, all.data());
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

// One query head's gradients: dq (when asked) and that head's own dk and dv chains
// (dk already times c), which the caller adds over the heads that share the kv head.
struct HeadGrads {
  std::vector<float> q, k, v;
};

SEQPAR_VECTOR_TARGET void backward_head(const HeadRows& g, const HeadRows& q, const HeadRows& k,
                                        const HeadRows& v, const HeadRows& out,
                                        const float* row_max, const float* row_sum,
                                        const AttentionMask::Table& mask, int64_t b, float scale,
                                        bool queries, bool keys, HeadGrads& grads) {
  const int64_t dim = q.dim;
  grads.q.assign(queries ? q.tokens * dim : 0, 0.0f);
  grads.k.assign(keys ? k.tokens * dim : 0, 0.0f);
  grads.v.assign(keys ? k.tokens * dim : 0, 0.0f);
  std::vector<float> scores(k.tokens), dp(k.tokens), ds(k.tokens);
  Visible visible;
  for (int64_t i = 0; i < q.tokens; ++i) {
    visible.find(mask, b, i);
    const std::vector<int64_t>& seen = visible.keys;
    float delta = 0.0f;
    for (int64_t d = 0; d < dim; ++d) delta = std::fma(g.row(i)[d], out.row(i)[d], delta);
    chains_over_keys(q.row(i), k, visible.first, visible.end, scores.data());
    chains_over_keys(g.row(i), v, visible.first, visible.end, dp.data());
    for (size_t n = 0; n < seen.size(); ++n) {
      const int64_t j = seen[n];
      const float probability = correctly_rounded_exp(scale * scores[j] - row_max[i]) / row_sum[i];
      ds[n] = probability * (dp[j] - delta);
      if (!keys) continue;
      add_query_terms(probability, g.row(i), dim, grads.v.data() + j * dim);
      add_query_terms(ds[n], q.row(i), dim, grads.k.data() + j * dim);
    }
    if (!queries) continue;
    float* dq = grads.q.data() + i * dim;
    chains_over_rows(ds.data(), seen, k, dq);
    for (int64_t d = 0; d < dim; ++d) dq[d] = scale * dq[d];
  }
  for (float& value : grads.k) value = scale * value;
}

// The exact sum over the heads that share a kv head, of each element of their chains
// (one head: its chain's value).
std::vector<float> head_sum(const std::vector<HeadGrads>& heads, std::vector<float> HeadGrads::*part) {
  if (heads.size() == 1) return heads[0].*part;
  std::vector<float> total((heads[0].*part).size());
  std::vector<float> terms(heads.size());
  for (size_t e = 0; e < total.size(); ++e) {
    for (size_t h = 0; h < heads.size(); ++h) terms[h] = (heads[h].*part)[e];
    total[e] = exact::rounded_exact_sum(terms.data(), static_cast<int64_t>(terms.size()));
  }
  return total;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, float scale) {
  if (!host_has_fma()) return reference::attention_forward(q, k, v, mask, scale);
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2);
  const int64_t group = heads / k.size(2);
  const AttentionMask::Table table = mask.table(batch, queries, k.size(1));
  AttentionForward result{Tensor::empty(q.shape(), q.device()),
                          Tensor::empty({batch, heads, queries}, q.device()),
                          Tensor::empty({batch, heads, queries}, q.device())};
  HeadRows qh, kh, vh;
  std::vector<float> out;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      qh.load(q, b, h, false);
      if (h % group == 0) {  // the next kv head
        kh.load(k, b, h / group, true);
        vh.load(v, b, h / group, false);
      }
      forward_head(qh, kh, vh, table, b, scale, out, result.row_max.data() + row_index(b, h, 0, heads, queries),
                   result.row_sum.data() + row_index(b, h, 0, heads, queries));
      store_head(out, b, h, result.out);
    }
  }
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, float scale, bool queries, bool keys) {
  if (!host_has_fma()) {
    return reference::attention_backward(grad_out, q, k, v, forward, mask, scale, queries, keys);
  }
  const int64_t batch = q.size(0), query_tokens = q.size(1), heads = q.size(2);
  const int64_t kv_heads = k.size(2), group = heads / kv_heads;
  const AttentionMask::Table table = mask.table(batch, query_tokens, k.size(1));
  AttentionGrads result;
  if (queries) result.q = Tensor::empty(q.shape(), q.device());
  if (keys) {
    result.k = Tensor::empty(k.shape(), k.device());
    result.v = Tensor::empty(v.shape(), v.device());
  }
  HeadRows gh, qh, kh, vh, oh;
  std::vector<HeadGrads> grads(static_cast<size_t>(group));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t kv = 0; kv < kv_heads; ++kv) {
      kh.load(k, b, kv, true);
      vh.load(v, b, kv, true);
      for (int64_t r = 0; r < group; ++r) {
        const int64_t h = kv * group + r;
        gh.load(grad_out, b, h, false);
        qh.load(q, b, h, false);
        oh.load(forward.out, b, h, false);
        backward_head(gh, qh, kh, vh, oh, forward.row_max.data() + row_index(b, h, 0, heads, query_tokens),
                      forward.row_sum.data() + row_index(b, h, 0, heads, query_tokens), table, b, scale,
                      queries, keys, grads[static_cast<size_t>(r)]);
        if (queries) store_head(grads[static_cast<size_t>(r)].q, b, h, result.q);
      }
      if (!keys) continue;
      store_head(head_sum(grads, &HeadGrads::k), b, kv, result.k);
      store_head(head_sum(grads, &HeadGrads::v), b, kv, result.v);
    }
  }
  return result;
}

}  // namespace seqpar::nn::cpu
