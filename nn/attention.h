// Multi-head scaled dot-product attention, forward and backward, in numerics that do
// not depend on the device, on how many heads a call holds, or on any tiling
// (docs/numerics.md, "Attention"):
//
//   q, k, v   [S, H, D] float32: S tokens, H heads, head dim D (1 <= D <= 128)
//   out       [S, H, D]
//   s_ij      = fl(c · (q_i · k_j))       c = attention_scale(D) = fl32(1 / sqrt(D))
//   visible   key j is visible to query i iff pos_j <= pos_i (causal), every j otherwise;
//             pos_t = t unless the mask gives positions (AttentionMask)
//   m_i       = max over visible j of s_ij            (exact: a max has no order)
//   p_ij      = exp(s_ij - m_i)                       (core/exp.h: correctly rounded)
//   l_i       = Σ_j p_ij                              (float adds, j ascending)
//   out_i     = (Σ_j p_ij v_j) / l_i                  (fma chain, j ascending; one division)
//
// Every dot product is an fma chain in index order starting from +0, over visible
// indices only (a masked pair forms no term). Heads never mix: the heads of any
// subset give the same bits as those heads of the full call. A row with no visible
// key (none with this API: query i always sees key i) outputs +0 and passes no gradient.
//
// The backward (g = d loss / d out) recomputes P_ij = fl(p_ij / l_i) from the
// forward's m and l, then:
//   dP_ij = g_i · v_j                     (fma chain over d)
//   δ_i   = g_i · out_i                   (fma chain over d: the row sums of g ∘ out)
//   dS_ij = fl(P_ij · fl(dP_ij - δ_i))
//   dq_i  = fl(c · Σ_j dS_ij k_j)         (fma chain over visible j ascending, then × c)
//   dk_j  = fl(c · Σ_i dS_ij q_i)         (fma chain over the queries i that see j, ascending, then × c)
//   dv_j  = Σ_i P_ij g_i                  (fma chain over the queries i that see j, ascending)
//
// Dispatch (nn/attention.cpp): reference (nn/reference/attention.cpp, the plain loops
// that define the bits), cpu (nn/cpu/attention.cpp) and cuda (nn/cuda/attention.cu).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::nn {

constexpr int64_t kMaxAttentionHeadDim = 128;

// Which keys each query sees. A causal mask compares positions: key j is visible to
// query i iff position j <= position i, where a token's position is its index in the
// call unless `positions` gives one per token. Positions matter where a call does not
// hold its tokens in sequence order from 0, and getting them wrong is a classic
// sequence-parallel mistake (a mask built on shard-local indices): RoPE takes explicit
// positions for the same reason (nn/rope.h).
struct AttentionMask {
  bool causal = true;
  std::vector<int64_t> positions;  // empty: 0 .. S-1

  // Implicit: a bool is the common mask (true: causal over the indices, false: none).
  AttentionMask(bool causal = true) : causal(causal) {}  // NOLINT(google-explicit-constructor)
  static AttentionMask causal_over(std::vector<int64_t> positions) {
    AttentionMask mask(true);
    mask.positions = std::move(positions);
    return mask;
  }
  bool visible(int64_t query, int64_t key) const {
    if (!causal) return true;
    return positions.empty() ? key <= query : positions[key] <= positions[query];
  }
  // The keys of `tokens` that `query` sees, ascending, into `keys`.
  void visible_keys(int64_t query, int64_t tokens, std::vector<int64_t>& keys) const {
    keys.clear();
    for (int64_t key = 0; key < tokens; ++key) {
      if (visible(query, key)) keys.push_back(key);
    }
  }
};

// c = 1 / sqrt(D) rounded once to float32 (sqrt and the division are each correctly
// rounded in double, then rounded to float: the same on every host).
float attention_scale(int64_t head_dim);

// ---- compute, no autograd ----
// What the backward needs of the forward: the output and, per head and query, the
// softmax's max m and denominator l ([H, S] each).
struct AttentionForward {
  Tensor out;
  Tensor row_max;
  Tensor row_sum;
};
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask);

struct AttentionGrads {
  Tensor q, k, v;
};
// grad_out [S, H, D]; forward is this call's forward of q, k, v.
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask);

// ---- differentiable (in q, k and v) ----
autograd::Variable scaled_dot_product_attention(const autograd::Variable& q,
                                                const autograd::Variable& k,
                                                const autograd::Variable& v,
                                                const AttentionMask& mask);

}  // namespace seqpar::nn
