// Multi-head scaled dot-product attention, forward and backward, in numerics that do
// not depend on the device, on how many heads a call holds, or on any tiling
// (docs/numerics.md, "Attention"):
//
//   q, k, v   [S, H, D] float32: S tokens, H heads, head dim D (1 <= D <= 128)
//   out       [S, H, D]
//   s_ij      = fl(c · (q_i · k_j))       c = attention_scale(D) = fl32(1 / sqrt(D))
//   visible   key j is visible to query i iff j <= i (causal), every j otherwise
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
//   dk_j  = fl(c · Σ_i dS_ij q_i)         (fma chain over queries i ascending, then × c)
//   dv_j  = Σ_i P_ij g_i                  (fma chain over queries i ascending)
//
// Dispatch (nn/attention.cpp): reference (nn/reference/attention.cpp, the plain loops
// that define the bits), cpu, and cuda, which refuses in this build: no CUDA kernel
// has been verified on a GPU yet.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::nn {

constexpr int64_t kMaxAttentionHeadDim = 128;

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
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

struct AttentionGrads {
  Tensor q, k, v;
};
// grad_out [S, H, D]; forward is this call's forward of q, k, v.
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward, bool causal);

// ---- differentiable (in q, k and v) ----
autograd::Variable scaled_dot_product_attention(const autograd::Variable& q,
                                                const autograd::Variable& k,
                                                const autograd::Variable& v, bool causal);

}  // namespace seqpar::nn
