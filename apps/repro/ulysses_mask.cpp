#include "apps/repro/ulysses_mask.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/attention.h"

namespace seqpar::repro {
namespace {

struct Sizes {
  int64_t tokens, heads, dim, shard;
  bool visible(int64_t i, int64_t j) const { return j % shard <= i % shard; }
  int64_t at(int64_t token, int64_t head) const { return (token * heads + head) * dim; }
};

double dot(const float* a, const float* b, int64_t dim) {
  double sum = 0;
  for (int64_t d = 0; d < dim; ++d) sum += double(a[d]) * double(b[d]);
  return sum;
}

// The softmax row P_i. (over visible keys) of head h, in double; each score once.
std::vector<double> probabilities(const Sizes& s, const float* q, const float* k, int64_t h, int64_t i,
                                  double scale) {
  std::vector<double> p(static_cast<size_t>(s.tokens), 0.0);
  double max = -INFINITY, sum = 0;
  for (int64_t j = 0; j < s.tokens; ++j) {
    if (!s.visible(i, j)) continue;
    p[size_t(j)] = scale * dot(q + s.at(i, h), k + s.at(j, h), s.dim);
    max = std::fmax(max, p[size_t(j)]);
  }
  for (int64_t j = 0; j < s.tokens; ++j) {
    if (!s.visible(i, j)) continue;
    p[size_t(j)] = std::exp(p[size_t(j)] - max);
    sum += p[size_t(j)];
  }
  for (double& value : p) value /= sum;
  return p;
}

Tensor forward(const Sizes& s, const Tensor& q, const Tensor& k, const Tensor& v) {
  const double scale = nn::attention_scale(s.dim);
  std::vector<float> out(static_cast<size_t>(s.tokens * s.heads * s.dim));
  std::vector<double> row(static_cast<size_t>(s.dim));
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t i = 0; i < s.tokens; ++i) {
      const std::vector<double> p = probabilities(s, q.data(), k.data(), h, i, scale);
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t j = 0; j < s.tokens; ++j) {
        if (p[size_t(j)] == 0) continue;
        for (int64_t d = 0; d < s.dim; ++d) row[size_t(d)] += p[size_t(j)] * v.data()[s.at(j, h) + d];
      }
      for (int64_t d = 0; d < s.dim; ++d) out[size_t(s.at(i, h) + d)] = static_cast<float>(row[size_t(d)]);
    }
  }
  return Tensor::from_data(q.shape(), std::move(out), q.device());
}

// dP_ij = g_i . v_j; delta_i = sum_j P_ij dP_ij; dS_ij = P_ij (dP_ij - delta_i);
// dq_i = c sum_j dS_ij k_j; dk_j = c sum_i dS_ij q_i; dv_j = sum_i P_ij g_i.
struct MaskedAttentionBackward : autograd::Node {
  MaskedAttentionBackward(Sizes sizes, Tensor q, Tensor k, Tensor v)
      : s(sizes), q(std::move(q)), k(std::move(k)), v(std::move(v)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const Tensor g = grad_output.contiguous();
    const size_t count = size_t(s.tokens * s.heads * s.dim);
    std::vector<double> dq(count, 0.0), dk(count, 0.0), dv(count, 0.0);
    const double scale = nn::attention_scale(s.dim);
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.tokens; ++i) {
        const std::vector<double> p = probabilities(s, q.data(), k.data(), h, i, scale);
        std::vector<double> dp(size_t(s.tokens), 0.0);
        double delta = 0;
        for (int64_t j = 0; j < s.tokens; ++j) {
          if (p[size_t(j)] == 0) continue;
          dp[size_t(j)] = dot(g.data() + s.at(i, h), v.data() + s.at(j, h), s.dim);
          delta += p[size_t(j)] * dp[size_t(j)];
        }
        for (int64_t j = 0; j < s.tokens; ++j) {
          if (p[size_t(j)] == 0) continue;
          const double ds = p[size_t(j)] * (dp[size_t(j)] - delta);
          for (int64_t d = 0; d < s.dim; ++d) {
            dq[size_t(s.at(i, h) + d)] += scale * ds * k.data()[s.at(j, h) + d];
            dk[size_t(s.at(j, h) + d)] += scale * ds * q.data()[s.at(i, h) + d];
            dv[size_t(s.at(j, h) + d)] += p[size_t(j)] * g.data()[s.at(i, h) + d];
          }
        }
      }
    }
    const auto to_tensor = [&](const std::vector<double>& values) {
      return Tensor::from_data(q.shape(), std::vector<float>(values.begin(), values.end()), q.device());
    };
    return {to_tensor(dq), to_tensor(dk), to_tensor(dv)};
  }
  std::string name() const override { return "ShardLocalMaskAttentionBackward"; }
  Sizes s;
  Tensor q, k, v;
};

}  // namespace

autograd::Variable shard_local_mask_attention(const autograd::Variable& q, const autograd::Variable& k,
                                              const autograd::Variable& v, int64_t tokens_per_shard) {
  SEQPAR_CHECK(q.shape().size() == 3 && k.shape() == q.shape() && v.shape() == q.shape(),
               "shard_local_mask_attention: q, k, v must be [S, H, D] alike");
  const Sizes sizes{q.shape()[0], q.shape()[1], q.shape()[2], tokens_per_shard};
  SEQPAR_CHECK(tokens_per_shard > 0 && sizes.tokens % tokens_per_shard == 0,
               "shard_local_mask_attention: ", sizes.tokens, " tokens in shards of ", tokens_per_shard);
  const Tensor qc = q.data().contiguous(), kc = k.data().contiguous(), vc = v.data().contiguous();
  Tensor out = forward(sizes, qc, kc, vc);
  if (!autograd::any_requires_grad({&q, &k, &v})) return autograd::Variable(std::move(out));
  auto node = std::make_shared<MaskedAttentionBackward>(sizes, qc, kc, vc);
  node->add_input(q);
  node->add_input(k);
  node->add_input(v);
  return autograd::Variable::from_op(std::move(out), std::move(node));
}

MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard) {
  MaskDifference difference;
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t j = 0; j < tokens; ++j) {
      const bool causal = j <= i, local = j % tokens_per_shard <= i % tokens_per_shard;
      difference.causal_pairs += causal;
      difference.hidden_past += causal && !local;
      difference.visible_future += !causal && local;
    }
  }
  return difference;
}

}  // namespace seqpar::repro
