// Attention's plain loops, as nn/attention.h states them: one sequence, one query head,
// one query at a time, every sum an fma chain in the call's token order from +0; the
// query heads that share a kv head meet in an exact sum.
#include "nn/reference/attention.h"

#include <cmath>
#include <vector>

#include "core/exact_bins.h"
#include "core/exp.h"

namespace seqpar::nn::reference {

namespace {

// The head vectors of a contiguous [B, S, H, D] tensor: at(b, t, h) points at D floats.
struct Tokens {
  float* data;
  int64_t tokens, heads, dim;
  float* at(int64_t b, int64_t t, int64_t h) const { return data + ((b * tokens + t) * heads + h) * dim; }
};
Tokens tokens_of(const Tensor& t) { return {t.data(), t.size(1), t.size(2), t.size(3)}; }

// a · b over d, an fma chain in index order from +0.
float dot(const float* a, const float* b, int64_t dim) {
  float sum = 0.0f;
  for (int64_t d = 0; d < dim; ++d) sum = std::fma(a[d], b[d], sum);
  return sum;
}

// The keys of sequence b that query i sees, in the call's order.
void visible_keys(const AttentionMask& mask, int64_t b, int64_t i, int64_t keys,
                  std::vector<int64_t>& out) {
  out.clear();
  for (int64_t j = 0; j < keys; ++j) {
    if (mask.visible(b, i, j)) out.push_back(j);
  }
}

// s_ij = fl(c · (q_i · k_j)) for each visible key j of query i.
void scores(const float* q, const Tokens& k, int64_t b, int64_t kv_head, float scale,
            const std::vector<int64_t>& keys, std::vector<float>& s) {
  s.resize(keys.size());
  for (size_t n = 0; n < keys.size(); ++n) s[n] = scale * dot(q, k.at(b, keys[n], kv_head), k.dim);
}

// Where the row statistics of (b, h, i) live in [B, Hq, Sq].
int64_t row_index(int64_t b, int64_t h, int64_t i, int64_t heads, int64_t queries) {
  return (b * heads + h) * queries + i;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, float scale) {
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2);
  const int64_t group = heads / k.size(2);  // query heads per kv head
  AttentionForward result{Tensor::empty(q.shape(), q.device()),
                          Tensor::empty({batch, heads, queries}, q.device()),
                          Tensor::empty({batch, heads, queries}, q.device())};
  const Tokens qt = tokens_of(q), kt = tokens_of(k), vt = tokens_of(v), out = tokens_of(result.out);
  std::vector<int64_t> keys;
  std::vector<float> p;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < queries; ++i) {
        visible_keys(mask, b, i, kt.tokens, keys);
        scores(qt.at(b, i, h), kt, b, h / group, scale, keys, p);
        float m = -INFINITY;
        for (const float s : p) m = s > m ? s : m;
        float l = 0.0f;
        for (float& value : p) {
          value = correctly_rounded_exp(value - m);
          l += value;
        }
        for (int64_t d = 0; d < qt.dim; ++d) {
          float sum = 0.0f;
          for (size_t n = 0; n < keys.size(); ++n) sum = std::fma(p[n], vt.at(b, keys[n], h / group)[d], sum);
          out.at(b, i, h)[d] = keys.empty() ? 0.0f : sum / l;  // no visible key: +0
        }
        result.row_max.data()[row_index(b, h, i, heads, queries)] = m;
        result.row_sum.data()[row_index(b, h, i, heads, queries)] = l;
      }
    }
  }
  return result;
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, float scale, bool queries, bool keys) {
  const int64_t batch = q.size(0), query_tokens = q.size(1), heads = q.size(2);
  const int64_t key_tokens = k.size(1), kv_heads = k.size(2), dim = q.size(3);
  const int64_t group = heads / kv_heads;
  AttentionGrads grads;
  if (queries) grads.q = Tensor::empty(q.shape(), q.device());
  // dk and dv of every query head first ([B, Sk, Hq, D]: each the chain of one head),
  // then each kv head's from the heads that share it.
  const Shape per_head{batch, key_tokens, heads, dim};
  const Tensor dk_heads = keys ? Tensor::zeros(per_head, k.device()) : Tensor();
  const Tensor dv_heads = keys ? Tensor::zeros(per_head, k.device()) : Tensor();
  const Tokens g = tokens_of(grad_out), qt = tokens_of(q), kt = tokens_of(k), vt = tokens_of(v);
  const Tokens out = tokens_of(forward.out);
  std::vector<int64_t> visible;
  std::vector<float> ds;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kv = h / group;
      // Queries in order: each dk_j and dv_j chain takes its terms in the queries' order.
      for (int64_t i = 0; i < query_tokens; ++i) {
        visible_keys(mask, b, i, key_tokens, visible);
        scores(qt.at(b, i, h), kt, b, kv, scale, visible, ds);
        const float m = forward.row_max.data()[row_index(b, h, i, heads, query_tokens)];
        const float l = forward.row_sum.data()[row_index(b, h, i, heads, query_tokens)];
        const float delta = dot(g.at(b, i, h), out.at(b, i, h), dim);
        for (size_t n = 0; n < visible.size(); ++n) {
          const int64_t j = visible[n];
          const float probability = correctly_rounded_exp(ds[n] - m) / l;
          const float dp = dot(g.at(b, i, h), vt.at(b, j, kv), dim);
          ds[n] = probability * (dp - delta);
          if (!keys) continue;
          float* dv = tokens_of(dv_heads).at(b, j, h);
          float* dk = tokens_of(dk_heads).at(b, j, h);
          for (int64_t d = 0; d < dim; ++d) {
            dv[d] = std::fma(probability, g.at(b, i, h)[d], dv[d]);
            dk[d] = std::fma(ds[n], qt.at(b, i, h)[d], dk[d]);
          }
        }
        if (!queries) continue;
        for (int64_t d = 0; d < dim; ++d) {
          float sum = 0.0f;
          for (size_t n = 0; n < visible.size(); ++n) sum = std::fma(ds[n], kt.at(b, visible[n], kv)[d], sum);
          tokens_of(grads.q).at(b, i, h)[d] = scale * sum;
        }
      }
    }
  }
  if (!keys) return grads;
  for (int64_t n = 0; n < dk_heads.numel(); ++n) dk_heads.data()[n] = scale * dk_heads.data()[n];
  grads.k = Tensor::empty(k.shape(), k.device());
  grads.v = Tensor::empty(v.shape(), v.device());
  const Tokens dk_by_head = tokens_of(dk_heads), dv_by_head = tokens_of(dv_heads);
  const Tokens dk = tokens_of(grads.k), dv = tokens_of(grads.v);
  // The heads that share kv head `kv` are kv * group .. kv * group + group - 1: for one
  // (b, j, d), `group` values `dim` floats apart. One head has nothing to add.
  const auto head_sum = [&](const float* terms) {
    return group == 1 ? terms[0] : exact::rounded_exact_sum(terms, group, dim);
  };
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < key_tokens; ++j) {
      for (int64_t kv = 0; kv < kv_heads; ++kv) {
        for (int64_t d = 0; d < dim; ++d) {
          dk.at(b, j, kv)[d] = head_sum(dk_by_head.at(b, j, kv * group) + d);
          dv.at(b, j, kv)[d] = head_sum(dv_by_head.at(b, j, kv * group) + d);
        }
      }
    }
  }
  return grads;
}

}  // namespace seqpar::nn::reference
