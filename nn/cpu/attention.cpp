// Attention's fast CPU path. Every value is computed by the reference's chain (an fma
// chain in the call's token order from +0, nn/attention.h); what changes is which
// chains run side by side:
//   - scores and dP: the chains of eight keys at once, over a head's keys (and values)
//     transposed to [D, S], so lane l reads key j + l;
//   - P·V, dQ, dK, dV: the chains of all head dims at once, over contiguous rows [S, D].
// The exponentials, the max and the softmax denominator stay scalar, in key order; the
// query heads that share a kv head meet in the same exact sum as the reference's.
// Cores take blocks of rows: the forward and dq blocks of 256 queries of one head (a
// row's chains need only its own query), dk and dv blocks of 256 keys of one kv head
// (a key's chains walk every query, of each of the R heads in turn). Each block writes
// only its own rows (core/parallel.h), so the bits do not depend on the threads.
// Compiled for AVX2 with FMA, where std::fma is one instruction; a host without them
// runs the reference's loops (the same bits, slower).
#include "nn/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/exact_bins.h"
#include "core/exp.h"
#include "core/parallel.h"
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

// Rows [first, first + count) of one head, `rows` holding them from its start.
void store_head(const std::vector<float>& rows, int64_t b, int64_t h, const Tensor& t, int64_t first = 0,
                int64_t count = -1) {
  const int64_t tokens = t.size(1), dim = t.size(3), stride = t.size(2) * dim;
  if (count < 0) count = tokens;
  float* start = t.data() + ((b * tokens + first) * t.size(2) + h) * dim;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t d = 0; d < dim; ++d) start[s * stride + d] = rows[s * dim + d];
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
  // Among keys [key_first, key_end), all keys by default.
  void find(const AttentionMask::Table& mask, int64_t b, int64_t i, int64_t key_first = 0, int64_t key_end = -1) {
    keys.clear();
    for (int64_t j = key_first; j < (key_end < 0 ? mask.keys : key_end); ++j) {
      if (mask.visible(b, i, j)) keys.push_back(j);
    }
    first = keys.empty() ? 0 : keys.front();
    end = keys.empty() ? 0 : keys.back() + 1;
  }
};

int64_t row_index(int64_t b, int64_t h, int64_t i, int64_t heads, int64_t queries) {
  return (b * heads + h) * queries + i;
}

// Blocks of this many rows go to one thread at a time.
constexpr int64_t kBlock = 256;

int64_t blocks(int64_t tokens) { return (tokens + kBlock - 1) / kBlock; }

// Item n of parallel_for over (sequence, head, block of `tokens` rows), blocks fastest.
struct Item {
  int64_t b, head, first, end;
  Item(int64_t n, int64_t heads, int64_t tokens)
      : b(n / blocks(tokens) / heads),
        head(n / blocks(tokens) % heads),
        first(n % blocks(tokens) * kBlock),
        end(std::min(tokens, first + kBlock)) {}
};

// Queries [first, end) of one head: out (from the block's first row), m and l.
SEQPAR_VECTOR_TARGET void forward_rows(const HeadRows& q, const HeadRows& k, const HeadRows& v,
                                       const AttentionMask::Table& mask, int64_t b, float scale, int64_t first,
                                       int64_t end, std::vector<float>& out, float* row_max, float* row_sum) {
  std::vector<float> all(k.tokens), p(k.tokens);
  Visible visible;
  out.assign((end - first) * q.dim, 0.0f);
  for (int64_t i = first; i < end; ++i) {
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
    float* o = out.data() + (i - first) * q.dim;
    chains_over_rows(p.data(), keys, v, o);
    for (int64_t d = 0; d < q.dim; ++d) o[d] = keys.empty() ? 0.0f : o[d] / l;
    row_max[i] = m;
    row_sum[i] = l;
  }
}

// What the backward of one head reads: its rows, the kv head's, and its row statistics.
struct HeadInputs {
  HeadRows g, q, out;
  const float *row_max, *row_sum;
};

// P and dS of query i and key j, and δ_i, as the reference computes them.
struct PairGrad {
  float probability, ds;
};
PairGrad pair_grad(float score, float dp, float delta, float m, float l, float scale) {
  const float probability = correctly_rounded_exp(scale * score - m) / l;
  return {probability, probability * (dp - delta)};
}

float row_delta(const HeadInputs& in, int64_t i) {
  float delta = 0.0f;
  for (int64_t d = 0; d < in.q.dim; ++d) delta = std::fma(in.g.row(i)[d], in.out.row(i)[d], delta);
  return delta;
}

// dq of queries [first, end) of one head (from the block's first row).
SEQPAR_VECTOR_TARGET void dq_rows(const HeadInputs& in, const HeadRows& k, const HeadRows& v,
                                  const AttentionMask::Table& mask, int64_t b, float scale, int64_t first,
                                  int64_t end, std::vector<float>& dq) {
  const int64_t dim = in.q.dim;
  std::vector<float> scores(k.tokens), dp(k.tokens), ds(k.tokens);
  Visible visible;
  dq.assign((end - first) * dim, 0.0f);
  for (int64_t i = first; i < end; ++i) {
    visible.find(mask, b, i);
    const std::vector<int64_t>& seen = visible.keys;
    const float delta = row_delta(in, i);
    chains_over_keys(in.q.row(i), k, visible.first, visible.end, scores.data());
    chains_over_keys(in.g.row(i), v, visible.first, visible.end, dp.data());
    for (size_t n = 0; n < seen.size(); ++n) {
      const int64_t j = seen[n];
      ds[n] = pair_grad(scores[j], dp[j], delta, in.row_max[i], in.row_sum[i], scale).ds;
    }
    float* row = dq.data() + (i - first) * dim;
    chains_over_rows(ds.data(), seen, k, row);
    for (int64_t d = 0; d < dim; ++d) row[d] = scale * row[d];
  }
}

// One query head's dk (times c) and dv chains of keys [first, end), every query in
// order (from the block's first key).
SEQPAR_VECTOR_TARGET void key_chains(const HeadInputs& in, const HeadRows& k, const HeadRows& v,
                                     const AttentionMask::Table& mask, int64_t b, float scale, int64_t first,
                                     int64_t end, std::vector<float>& dk, std::vector<float>& dv) {
  const int64_t dim = in.q.dim;
  dk.assign((end - first) * dim, 0.0f);
  dv.assign((end - first) * dim, 0.0f);
  std::vector<float> scores(k.tokens), dp(k.tokens);
  Visible visible;
  for (int64_t i = 0; i < in.q.tokens; ++i) {
    visible.find(mask, b, i, first, end);
    if (visible.keys.empty()) continue;
    const float delta = row_delta(in, i);
    chains_over_keys(in.q.row(i), k, visible.first, visible.end, scores.data());
    chains_over_keys(in.g.row(i), v, visible.first, visible.end, dp.data());
    for (const int64_t j : visible.keys) {
      const PairGrad terms = pair_grad(scores[j], dp[j], delta, in.row_max[i], in.row_sum[i], scale);
      add_query_terms(terms.probability, in.g.row(i), dim, dv.data() + (j - first) * dim);
      add_query_terms(terms.ds, in.q.row(i), dim, dk.data() + (j - first) * dim);
    }
  }
  for (float& value : dk) value = scale * value;
}

// The exact sum over the heads that share a kv head, of each element of their chains
// (one head: its chain's value).
std::vector<float> head_sum(const std::vector<std::vector<float>>& heads) {
  if (heads.size() == 1) return heads[0];
  std::vector<float> total(heads[0].size());
  std::vector<float> terms(heads.size());
  for (size_t e = 0; e < total.size(); ++e) {
    for (size_t h = 0; h < heads.size(); ++h) terms[h] = heads[h][e];
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
  // Items: (sequence, head, block of queries).
  parallel_for(batch * heads * blocks(queries), [&](int64_t n) {
    const Item item(n, heads, queries);
    const int64_t b = item.b, h = item.head, first = item.first, end = item.end;
    HeadRows qh, kh, vh;
    qh.load(q, b, h, false);
    kh.load(k, b, h / group, true);
    vh.load(v, b, h / group, false);
    std::vector<float> out;
    forward_rows(qh, kh, vh, table, b, scale, first, end, out,
                 result.row_max.data() + row_index(b, h, 0, heads, queries),
                 result.row_sum.data() + row_index(b, h, 0, heads, queries));
    store_head(out, b, h, result.out, first, end - first);
  });
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, float scale, bool queries, bool keys) {
  if (!host_has_fma()) {
    return reference::attention_backward(grad_out, q, k, v, forward, mask, scale, queries, keys);
  }
  const int64_t batch = q.size(0), query_tokens = q.size(1), heads = q.size(2);
  const int64_t key_tokens = k.size(1), kv_heads = k.size(2), group = heads / kv_heads;
  const AttentionMask::Table table = mask.table(batch, query_tokens, key_tokens);
  AttentionGrads result;
  const auto inputs = [&](int64_t b, int64_t h) {
    HeadInputs in;
    in.g.load(grad_out, b, h, false);
    in.q.load(q, b, h, false);
    in.out.load(forward.out, b, h, false);
    in.row_max = forward.row_max.data() + row_index(b, h, 0, heads, query_tokens);
    in.row_sum = forward.row_sum.data() + row_index(b, h, 0, heads, query_tokens);
    return in;
  };
  if (queries) {
    result.q = Tensor::empty(q.shape(), q.device());
    // Items: (sequence, head, block of queries).
    parallel_for(batch * heads * blocks(query_tokens), [&](int64_t n) {
      const Item item(n, heads, query_tokens);
      const int64_t b = item.b, h = item.head, first = item.first, end = item.end;
      HeadRows kh, vh;
      kh.load(k, b, h / group, true);
      vh.load(v, b, h / group, true);
      std::vector<float> dq;
      dq_rows(inputs(b, h), kh, vh, table, b, scale, first, end, dq);
      store_head(dq, b, h, result.q, first, end - first);
    });
  }
  if (keys) {
    result.k = Tensor::empty(k.shape(), k.device());
    result.v = Tensor::empty(v.shape(), v.device());
    // Items: (sequence, kv head, block of keys), the R heads in turn inside.
    parallel_for(batch * kv_heads * blocks(key_tokens), [&](int64_t n) {
      const Item item(n, kv_heads, key_tokens);
      const int64_t b = item.b, kv = item.head, first = item.first, end = item.end;
      HeadRows kh, vh;
      kh.load(k, b, kv, true);
      vh.load(v, b, kv, true);
      std::vector<std::vector<float>> dk(static_cast<size_t>(group)), dv(static_cast<size_t>(group));
      for (int64_t r = 0; r < group; ++r) {
        key_chains(inputs(b, kv * group + r), kh, vh, table, b, scale, first, end, dk[static_cast<size_t>(r)],
                   dv[static_cast<size_t>(r)]);
      }
      store_head(head_sum(dk), b, kv, result.k, first, end - first);
      store_head(head_sum(dv), b, kv, result.v, first, end - first);
    });
  }
  return result;
}

}  // namespace seqpar::nn::cpu
