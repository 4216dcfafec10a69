// Scaled dot-product attention as Llama-like models use it — a batch, grouped-query
// heads, causal or packed-document masks, key padding — forward and backward, in
// numerics that do not depend on the device, on how many heads a call holds, or on how
// the work is split over ranks, threads or GPU blocks (docs/numerics.md, "Attention").
//
// Layout: batch first, as FlashAttention and a Hugging Face model before its transpose.
//
//   q         [B, Sq, Hq, D]  float32: B sequences, Sq query tokens, Hq heads, head dim D
//   k, v      [B, Sk, Hkv, D] with Hq a multiple of Hkv: query head h reads kv head
//             h / (Hq / Hkv) (MHA: Hkv = Hq; GQA: 1 < Hkv < Hq; MQA: Hkv = 1)
//   out       [B, Sq, Hq, D]
//   1 <= D <= 256. A 3-D [S, H, D] is one sequence (B = 1) and gives 3-D results.
//   DeepSpeed's sequence-first [S, B, H, D] is one transpose away: attention needs each
//   sequence's tokens together, and batch-first keeps a token's heads contiguous.
//
// For one sequence b, one query head h and query i, with c the scale (1/sqrt(D) rounded
// once to float unless given) and j over the keys visible to i (AttentionMask), in the
// call's key order:
//
//   s_ij      = fl(c · (q_i · k_j))                 q_i · k_j: fma chain over d
//   m_i       = max_j s_ij                          (exact: a max has no order)
//   p_ij      = exp(s_ij - m_i)                     (core/exp.h: correctly rounded)
//   l_i       = Σ_j p_ij                            (float adds, keys in order)
//   out_i     = (Σ_j p_ij v_j) / l_i                (fma chain, keys in order; one division)
//
// Backward (g = d loss / d out), P_ij = fl(p_ij / l_i) recomputed from m and l:
//
//   dP_ij = g_i · v_j                 δ_i = g_i · out_i          (fma chains over d)
//   dS_ij = fl(P_ij · fl(dP_ij - δ_i))
//   dq_i  = fl(c · Σ_j dS_ij k_j)     (fma chain over the visible keys, in order)
//   dk_j  = fl(c · Σ_i dS_ij q_i)     (fma chain over the queries that see j, in order)
//   dv_j  = Σ_i P_ij g_i              (fma chain over the queries that see j, in order)
//   and for a kv head shared by R > 1 query heads, dk and dv are the exact sum of its
//   R heads' values above, rounded once (core/exact_bins.h): their order cannot matter.
//
// Every chain starts from +0, forms no term for a hidden pair, and runs in the call's
// token order. So a schedule that moves operands, never partial sums, gives one rank's
// bits: context parallelism gathers K and V (then Q, dO and the rows' m, l) so that one
// owner walks each chain whole; see attention_backward_queries/_keys below.
//
// A row with no visible key (every key padded, or a document that holds no key of the
// call) outputs +0, keeps m = -inf and l = 0, and passes no gradient: FlashAttention's
// choice, where PyTorch's SDPA gives NaN.
//
// Dispatch (nn/attention.cpp): reference (nn/reference/attention.cpp, the plain loops
// that define the bits), cpu (nn/cpu/attention.cpp) and cuda (nn/cuda/attention.cu).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace seqpar::nn {

constexpr int64_t kMaxAttentionHeadDim = 256;

// Which keys each query sees. Everything is decided by the tokens' global positions in
// their sequence: a call's token t is at position t unless positions are given. A call
// that holds part of a sequence (a sequence-parallel shard, the keys gathered from
// other ranks, a zigzag of chunks) passes its tokens' global positions; getting them
// wrong (numbering a shard's tokens from 0) is a classic sequence-parallel mistake, and
// RoPE takes explicit positions for the same reason (nn/rope.h).
//
// Key j is visible to query i of sequence b iff all of:
//   - causal: position(j) <= position(i);
//   - packed documents: j's position lies in i's document;
//   - key padding: position(j) < key_lengths[b].
//
// Positions alone never separate documents: a causal mask over positions that restart
// at each document still lets a document see the one before it. Packed documents are
// `documents(boundaries)`.
class AttentionMask {
 public:
  // Implicit: a bool is the common mask (true: causal, false: none).
  AttentionMask(bool causal = true) : causal_(causal) {}  // NOLINT(google-explicit-constructor)
  static AttentionMask causal() { return AttentionMask(true); }
  static AttentionMask none() { return AttentionMask(false); }
  // Packed documents, as FlashAttention's cu_seqlens: ascending boundaries
  // 0 = c_0 < c_1 < ... < c_n; document k holds positions [c_k, c_k+1), and every
  // position of the call must lie below c_n. A query sees the keys of its own document
  // only, causally unless `causal` is false. One list for every sequence of the batch,
  // or (per_sequence) one list per sequence.
  static AttentionMask documents(std::vector<int64_t> boundaries, bool causal = true);
  static AttentionMask documents_per_sequence(std::vector<std::vector<int64_t>> boundaries,
                                              bool causal = true);
  // Key padding: in sequence b, keys at positions >= lengths[b] are padding, seen by no
  // query (one length per sequence). A padded query still attends to the real keys; its
  // output is the caller's to ignore, as with PyTorch's key_padding_mask.
  AttentionMask with_key_lengths(std::vector<int64_t> lengths) const;
  // The global positions of the call's tokens: one list when queries and keys are the
  // same tokens, else one for each.
  AttentionMask at_positions(std::vector<int64_t> positions) const;
  AttentionMask at_positions(std::vector<int64_t> query_positions,
                             std::vector<int64_t> key_positions) const;

  bool is_causal() const { return causal_; }
  bool has_documents() const { return !documents_.empty(); }
  bool has_key_lengths() const { return !key_lengths_.empty(); }
  bool has_positions() const { return has_positions_; }
  const std::vector<std::vector<int64_t>>& document_boundaries() const { return documents_; }
  const std::vector<int64_t>& key_lengths() const { return key_lengths_; }
  int64_t query_position(int64_t i) const { return has_positions_ ? query_positions_[i] : i; }
  int64_t key_position(int64_t j) const { return has_positions_ ? key_positions_[j] : j; }
  // The index of the document of sequence b holding `position` (0 without documents).
  int64_t document_of(int64_t b, int64_t position) const;

  // The definition above, for query i and key j of sequence b of a call.
  bool visible(int64_t b, int64_t i, int64_t j) const;

  // The mask of one call laid out for the fast paths: per token its position, per
  // sequence and token its document, with -1 for a padded key, which no query's
  // document matches. visible(b, i, j) is the same as the mask's.
  struct Table {
    bool causal = true;
    int64_t batch = 0, queries = 0, keys = 0;
    std::vector<int64_t> query_position, key_position;  // [Sq], [Sk]
    std::vector<int64_t> query_document, key_document;  // [B * Sq], [B * Sk]
    bool visible(int64_t b, int64_t i, int64_t j) const {
      return key_document[b * keys + j] == query_document[b * queries + i] &&
             (!causal || key_position[j] <= query_position[i]);
    }
  };
  Table table(int64_t batch, int64_t queries, int64_t keys) const;

  // Refuses a mask that does not fit a call of `batch` sequences, `queries` query and
  // `keys` key tokens, naming what is wrong (`op` opens the message).
  void check(const char* op, int64_t batch, int64_t queries, int64_t keys) const;

 private:
  bool causal_ = true;
  bool has_positions_ = false;
  std::vector<int64_t> query_positions_, key_positions_;
  std::vector<std::vector<int64_t>> documents_;  // empty, one list, or one per sequence
  std::vector<int64_t> key_lengths_;
};

// c = 1 / sqrt(D) rounded once to float32 (sqrt and the division are each correctly
// rounded in double, then rounded to float: the same on every host).
float attention_scale(int64_t head_dim);

// ---- compute, no autograd ----
// What the backward needs of the forward: the output and, per sequence, head and query,
// the softmax's max m and denominator l ([B, Hq, Sq] each).
struct AttentionForward {
  Tensor out;
  Tensor row_max;
  Tensor row_sum;
};
// `scale`: empty for attention_scale(D); else any finite float.
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask = true,
                                   std::optional<float> scale = std::nullopt);

struct AttentionGrads {
  Tensor q, k, v;
};
// grad_out: out's shape; forward: this call's forward of q, k, v.
AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask = true,
                                  std::optional<float> scale = std::nullopt);

// The backward in its two halves, for schedules that split the work. Together on the
// same tensors they give attention_backward's bits.
//   queries: dq of the call's queries; needs every key the queries see.
//   keys:    dk and dv of the call's keys; needs every query that sees them, with its
//            g and its forward (out, m and l).
// Context parallelism with C ranks: rank r calls the first with its queries and the
// gathered keys, the second with its keys and the gathered queries; the concatenated
// results are one rank's, bit for bit, because each chain still runs whole and in order.
Tensor attention_backward_queries(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask = true,
                                  std::optional<float> scale = std::nullopt);
struct AttentionKeyGrads {
  Tensor k, v;
};
AttentionKeyGrads attention_backward_keys(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const AttentionForward& forward,
                                          const AttentionMask& mask = true,
                                          std::optional<float> scale = std::nullopt);

// ---- differentiable (in q, k and v) ----
autograd::Variable scaled_dot_product_attention(const autograd::Variable& q,
                                                const autograd::Variable& k,
                                                const autograd::Variable& v,
                                                const AttentionMask& mask = true,
                                                std::optional<float> scale = std::nullopt);

namespace detail {
// The layout's two forms, for the ops and layers that take both: a 3-D [S, H, D] is one
// sequence, viewed (contiguous) as [1, S, H, D]; a 4-D tensor comes back contiguous.
// And a [B, S, H, D] result viewed as [S, H, D] again where the caller's tensors were 3-D.
Tensor batch_first(const Tensor& t);
Tensor in_callers_rank(const Tensor& t, bool three_dims);
}  // namespace detail

// Grouped-query heads as multi-head ones: [B, S, Hkv, D] (or [S, Hkv, D]) becomes
// [B, S, Hkv · copies, D], head h a copy of kv head h / copies (Hugging Face's
// repeat_kv). Its backward adds each kv head's copies' gradients exactly, rounded once:
// the rule attention's backward applies to the query heads that share a kv head, so
// attention over the repeated heads gives grouped-query attention's bits, dk and dv
// included. (UlyssesAttention uses it when sp does not divide the kv heads.)
autograd::Variable repeat_kv_heads(const autograd::Variable& kv, int64_t copies);

}  // namespace seqpar::nn
