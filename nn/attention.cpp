#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/exact_sums.h"
#include "core/error.h"
#include "nn/cpu/attention.h"
#include "nn/cuda/attention.h"
#include "nn/reference/attention.h"

namespace seqpar::nn {

using autograd::Variable;

namespace detail {

Tensor batch_first(const Tensor& t) {
  const Tensor c = t.contiguous();
  return c.dim() == 4 ? c : c.view({1, c.size(0), c.size(1), c.size(2)});
}

Tensor in_callers_rank(const Tensor& t, bool three_dims) {
  return three_dims ? t.view({t.size(1), t.size(2), t.size(3)}) : t;
}

}  // namespace detail

using detail::batch_first;
using detail::in_callers_rank;

float attention_scale(int64_t head_dim) {
  SEQPAR_CHECK(head_dim >= 1, "attention_scale: the head dim must be positive, got ", head_dim);
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// ---------------------------------------------------------------- the mask

AttentionMask AttentionMask::documents(std::vector<int64_t> boundaries, bool causal) {
  return documents_per_sequence({std::move(boundaries)}, causal);
}

AttentionMask AttentionMask::documents_per_sequence(std::vector<std::vector<int64_t>> boundaries,
                                                    bool causal) {
  SEQPAR_CHECK(!boundaries.empty(), "AttentionMask::documents: no document boundaries given");
  AttentionMask mask(causal);
  mask.documents_ = std::move(boundaries);
  return mask;
}

AttentionMask AttentionMask::with_key_lengths(std::vector<int64_t> lengths) const {
  SEQPAR_CHECK(!lengths.empty(), "AttentionMask::with_key_lengths: no lengths given (one per sequence)");
  AttentionMask mask = *this;
  mask.key_lengths_ = std::move(lengths);
  return mask;
}

AttentionMask AttentionMask::at_positions(std::vector<int64_t> positions) const {
  std::vector<int64_t> keys = positions;
  return at_positions(std::move(positions), std::move(keys));
}

AttentionMask AttentionMask::at_positions(std::vector<int64_t> query_positions,
                                          std::vector<int64_t> key_positions) const {
  AttentionMask mask = *this;
  mask.has_positions_ = true;
  mask.query_positions_ = std::move(query_positions);
  mask.key_positions_ = std::move(key_positions);
  return mask;
}

int64_t AttentionMask::document_of(int64_t b, int64_t position) const {
  if (documents_.empty()) return 0;
  const std::vector<int64_t>& bounds = documents_.size() == 1 ? documents_[0] : documents_[b];
  return std::upper_bound(bounds.begin(), bounds.end(), position) - bounds.begin() - 1;
}

bool AttentionMask::visible(int64_t b, int64_t i, int64_t j) const {
  const int64_t query = query_position(i), key = key_position(j);
  if (!key_lengths_.empty() && key >= key_lengths_[b]) return false;
  if (!documents_.empty() && document_of(b, key) != document_of(b, query)) return false;
  return !causal_ || key <= query;
}

AttentionMask::Table AttentionMask::table(int64_t batch, int64_t queries, int64_t keys) const {
  Table t;
  t.causal = causal_;
  t.batch = batch;
  t.queries = queries;
  t.keys = keys;
  for (int64_t i = 0; i < queries; ++i) t.query_position.push_back(query_position(i));
  for (int64_t j = 0; j < keys; ++j) t.key_position.push_back(key_position(j));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < queries; ++i) t.query_document.push_back(document_of(b, query_position(i)));
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t key = key_position(j);
      const bool padded = !key_lengths_.empty() && key >= key_lengths_[b];
      t.key_document.push_back(padded ? -1 : document_of(b, key));
    }
  }
  return t;
}

void AttentionMask::check(const char* op, int64_t batch, int64_t queries, int64_t keys) const {
  if (has_positions_) {
    SEQPAR_CHECK(static_cast<int64_t>(query_positions_.size()) == queries, op, ": the mask has ",
                 query_positions_.size(), " query positions for ", queries, " query tokens (one per token)");
    SEQPAR_CHECK(static_cast<int64_t>(key_positions_.size()) == keys, op, ": the mask has ",
                 key_positions_.size(), " key positions for ", keys, " key tokens (one per token)");
  } else {
    SEQPAR_CHECK(queries == keys, op, ": q has ", queries, " tokens and k ", keys,
                 "; say where they sit in the sequence (AttentionMask::at_positions)");
  }
  if (!documents_.empty()) {
    SEQPAR_CHECK(documents_.size() == 1 || static_cast<int64_t>(documents_.size()) == batch, op,
                 ": the mask has document boundaries for ", documents_.size(),
                 " sequences; give one list for all ", batch, " or one per sequence");
    for (size_t list = 0; list < documents_.size(); ++list) {
      const std::vector<int64_t>& c = documents_[list];
      SEQPAR_CHECK(c.size() >= 2 && c.front() == 0, op, ": document boundaries (list ", list,
                   ") must start at 0 and end at the sequence's length, as cu_seqlens; got ", c.size(),
                   " values", c.empty() ? "" : " starting at ", c.empty() ? 0 : c.front());
      for (size_t n = 1; n < c.size(); ++n) {
        SEQPAR_CHECK(c[n] > c[n - 1], op, ": document boundaries (list ", list,
                     ") must increase: boundary ", n, " is ", c[n], " after ", c[n - 1]);
      }
      const auto outside = [&](int64_t position) { return position < 0 || position >= c.back(); };
      for (int64_t i = 0; i < queries; ++i) {
        SEQPAR_CHECK(!outside(query_position(i)), op, ": query ", i, " at position ", query_position(i),
                     " lies outside the documents [0, ", c.back(), ") (list ", list, ")");
      }
      for (int64_t j = 0; j < keys; ++j) {
        SEQPAR_CHECK(!outside(key_position(j)), op, ": key ", j, " at position ", key_position(j),
                     " lies outside the documents [0, ", c.back(), ") (list ", list, ")");
      }
    }
  }
  if (!key_lengths_.empty()) {
    SEQPAR_CHECK(static_cast<int64_t>(key_lengths_.size()) == batch, op, ": the mask has ",
                 key_lengths_.size(), " key lengths for a batch of ", batch, " (one per sequence)");
    for (size_t b = 0; b < key_lengths_.size(); ++b) {
      SEQPAR_CHECK(key_lengths_[b] >= 0, op, ": key length ", key_lengths_[b], " of sequence ", b,
                   " is negative");
    }
  }
}

// ---------------------------------------------------------------- checks and layout

namespace {

// The shapes of a call, [B, S, H, D] whether it came 4-D or 3-D.
struct Call {
  int64_t batch, queries, keys, heads, kv_heads, dim;
  bool three_dims;  // the caller's tensors are [S, H, D]
};

Call check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  SEQPAR_CHECK(q.dim() == 4 || q.dim() == 3, op,
               ": q must be [B, S, Hq, D] (batch, tokens, heads, head dim) or [S, Hq, D]; got shape ",
               q.shape());
  SEQPAR_CHECK(k.dim() == q.dim() && v.shape() == k.shape(), op, ": k and v must be one shape of q's rank (",
               q.dim() == 4 ? "[B, S, Hkv, D]" : "[S, Hkv, D]", "); got q ", q.shape(), ", k ", k.shape(),
               ", v ", v.shape());
  SEQPAR_CHECK(k.device() == q.device() && v.device() == q.device(), op,
               ": q, k and v must be on one device; got q on ", q.device(), ", k on ", k.device(),
               ", v on ", v.device());
  const bool three = q.dim() == 3;
  const int64_t first = three ? 0 : 1;  // the tokens' dim
  const Call call{three ? 1 : q.size(0), q.size(first), k.size(first), q.size(first + 1),
                  k.size(first + 1), q.size(first + 2), three};
  SEQPAR_CHECK(three || k.size(0) == call.batch, op, ": q holds ", call.batch, " sequences and k ",
               k.size(0), "; got q ", q.shape(), ", k ", k.shape());
  SEQPAR_CHECK(k.size(first + 2) == call.dim, op, ": q's head dim ", call.dim, " and k's ",
               k.size(first + 2), " differ; got q ", q.shape(), ", k ", k.shape());
  SEQPAR_CHECK(call.dim >= 1 && call.dim <= kMaxAttentionHeadDim, op, ": the head dim D = ", call.dim,
               " of q's shape ", q.shape(), " must be in [1, ", kMaxAttentionHeadDim, "]");
  SEQPAR_CHECK(call.queries >= 1 && call.keys >= 1 && call.batch >= 1 && call.kv_heads >= 1, op,
               ": every dim must be at least 1; got q ", q.shape(), ", k ", k.shape());
  SEQPAR_CHECK(call.heads % call.kv_heads == 0, op, ": q's ", call.heads,
               " heads are not a multiple of k and v's ", call.kv_heads,
               " (each kv head serves Hq / Hkv query heads)");
  return call;
}

float check_scale(const char* op, const Call& call, std::optional<float> scale) {
  if (!scale) return attention_scale(call.dim);
  SEQPAR_CHECK(std::isfinite(*scale), op, ": the scale must be finite; got ", *scale);
  return *scale;
}

Shape rows_shape(const Call& call) {
  return call.three_dims ? Shape{call.heads, call.queries} : Shape{call.batch, call.heads, call.queries};
}

Tensor rows_four_dims(const Tensor& t, const Call& call) {
  return t.contiguous().view({call.batch, call.heads, call.queries});
}

void check_forward(const char* op, const Tensor& q, const Call& call, const AttentionForward& forward) {
  const Shape rows = rows_shape(call);
  SEQPAR_CHECK(forward.out.defined() && forward.out.shape() == q.shape() &&
                   forward.row_max.defined() && forward.row_max.shape() == rows &&
                   forward.row_sum.defined() && forward.row_sum.shape() == rows,
               op, ": the forward's tensors must be this q's: out ", q.shape(), ", row_max and row_sum ", rows);
  SEQPAR_CHECK(forward.out.device() == q.device() && forward.row_max.device() == q.device() &&
                   forward.row_sum.device() == q.device(),
               op, ": the forward's tensors must be on q's device ", q.device());
}

[[noreturn]] void refuse_cuda() {
  SEQPAR_FAIL("attention on CUDA: this seqpar was built without CUDA; run it on the cpu or "
              "reference device");
}

// ---------------------------------------------------------------- dispatch
//
// One dispatch table for the op, by device:
//
//   reference  nn/reference/attention.cpp: the plain loops that define the bits.
//   cpu        nn/cpu/attention.cpp: the same chains, eight keys (or head dims) side by
//              side in vector registers where the host has FMA (AVX2), else the
//              reference's loops; tested bitwise against the reference.
//   cuda       nn/cuda/attention.cu: the same chains, one thread each, the independent
//              ones side by side; tested bitwise against the reference.
//
// Every row takes contiguous [B, S, H, D] tensors and a checked mask and scale.

AttentionForward dispatch_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const AttentionMask& mask, float scale) {
  switch (q.device().type) {
    case DeviceType::Reference:
      return reference::attention_forward(q, k, v, mask, scale);
    case DeviceType::CPU:
      return cpu::attention_forward(q, k, v, mask, scale);
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      return detail::attention_forward_cuda(q, k, v, mask, scale);
#else
      break;
#endif
  }
  refuse_cuda();
}

AttentionGrads dispatch_backward(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionForward& forward, const AttentionMask& mask,
                                 float scale, bool queries, bool keys) {
  switch (q.device().type) {
    case DeviceType::Reference:
      return reference::attention_backward(g, q, k, v, forward, mask, scale, queries, keys);
    case DeviceType::CPU:
      return cpu::attention_backward(g, q, k, v, forward, mask, scale, queries, keys);
    case DeviceType::CUDA:
#ifdef SEQPAR_WITH_CUDA
      return detail::attention_backward_cuda(g, q, k, v, forward, mask, scale, queries, keys);
#else
      break;
#endif
  }
  refuse_cuda();
}

// Checks a backward's arguments, runs the parts asked for and gives them the caller's
// shapes.
AttentionGrads backward(const char* op, const Tensor& grad_out, const Tensor& q, const Tensor& k,
                        const Tensor& v, const AttentionForward& forward, const AttentionMask& mask,
                        std::optional<float> scale, bool queries, bool keys) {
  const Call call = check_qkv(op, q, k, v);
  mask.check(op, call.batch, call.queries, call.keys);
  const float c = check_scale(op, call, scale);
  SEQPAR_CHECK(grad_out.defined() && grad_out.shape() == q.shape() && grad_out.device() == q.device(), op,
               ": grad_out must be q's shape ", q.shape(), " on ", q.device(), "; got ",
               grad_out.defined() ? grad_out.shape() : Shape{});
  check_forward(op, q, call, forward);
  const AttentionForward saved{batch_first(forward.out), rows_four_dims(forward.row_max, call),
                               rows_four_dims(forward.row_sum, call)};
  AttentionGrads grads = dispatch_backward(batch_first(grad_out), batch_first(q), batch_first(k), batch_first(v),
                                           saved, mask, c, queries, keys);
  if (grads.q.defined()) grads.q = in_callers_rank(grads.q, call.three_dims);
  if (grads.k.defined()) grads.k = in_callers_rank(grads.k, call.three_dims);
  if (grads.v.defined()) grads.v = in_callers_rank(grads.v, call.three_dims);
  return grads;
}

AttentionForward forward(const Call& call, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionMask& mask, float scale) {
  AttentionForward result = dispatch_forward(batch_first(q), batch_first(k), batch_first(v), mask, scale);
  result.out = in_callers_rank(result.out, call.three_dims);
  result.row_max = result.row_max.view(rows_shape(call));
  result.row_sum = result.row_sum.view(rows_shape(call));
  return result;
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionMask& mask, std::optional<float> scale) {
  const char* op = "attention_forward";
  const Call call = check_qkv(op, q, k, v);
  mask.check(op, call.batch, call.queries, call.keys);
  return forward(call, q, k, v, mask, check_scale(op, call, scale));
}

AttentionGrads attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, std::optional<float> scale) {
  return backward("attention_backward", grad_out, q, k, v, forward, mask, scale, true, true);
}

Tensor attention_backward_queries(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const AttentionForward& forward,
                                  const AttentionMask& mask, std::optional<float> scale) {
  return backward("attention_backward_queries", grad_out, q, k, v, forward, mask, scale, true, false).q;
}

AttentionKeyGrads attention_backward_keys(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const AttentionForward& forward,
                                          const AttentionMask& mask, std::optional<float> scale) {
  AttentionGrads grads =
      backward("attention_backward_keys", grad_out, q, k, v, forward, mask, scale, false, true);
  return {std::move(grads.k), std::move(grads.v)};
}

// ---------------------------------------------------------------- autograd

namespace {

// Keeps q, k, v and the forward's out, m and l; the backward recomputes P from them.
struct AttentionBackward : autograd::Node {
  AttentionBackward(Tensor q, Tensor k, Tensor v, AttentionForward forward, AttentionMask mask, float scale)
      : q(std::move(q)), k(std::move(k)), v(std::move(v)), forward(std::move(forward)),
        mask(std::move(mask)), scale(scale) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const auto& edges = next_edges();
    const bool queries = edges[0].valid(), keys = edges[1].valid() || edges[2].valid();
    AttentionGrads grads = backward("scaled_dot_product_attention (backward)", grad_output, q, k, v,
                                    forward, mask, scale, queries, keys);
    return {grads.q, edges[1].valid() ? grads.k : Tensor(), edges[2].valid() ? grads.v : Tensor()};
  }
  std::string name() const override { return "AttentionBackward"; }
  Tensor q, k, v;
  AttentionForward forward;
  AttentionMask mask;
  float scale;
};

}  // namespace

Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const AttentionMask& mask, std::optional<float> scale) {
  const char* op = "scaled_dot_product_attention";
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k and v must be defined");
  const Call call = check_qkv(op, q.data(), k.data(), v.data());
  mask.check(op, call.batch, call.queries, call.keys);
  const float c = check_scale(op, call, scale);
  const Tensor qc = q.data().contiguous(), kc = k.data().contiguous(), vc = v.data().contiguous();
  AttentionForward result = forward(call, qc, kc, vc, mask, c);
  Tensor out = result.out;
  if (!autograd::any_requires_grad({&q, &k, &v})) return Variable(std::move(out));
  auto node = std::make_shared<AttentionBackward>(qc, kc, vc, std::move(result), mask, c);
  node->add_input(q);
  node->add_input(k);
  node->add_input(v);
  return Variable::from_op(std::move(out), std::move(node));
}

// ---------------------------------------------------------------- repeat_kv_heads

namespace {

// The heads dim of [.., S, H, D] is the one before last.
Tensor repeat_heads(const Tensor& kv, int64_t copies) {
  Shape shape = kv.shape();
  const int64_t heads = shape[shape.size() - 2];
  shape[shape.size() - 2] = heads * copies;
  Tensor out = Tensor::empty(shape, kv.device());
  const int64_t dim = static_cast<int64_t>(shape.size()) - 2;
  for (int64_t h = 0; h < heads * copies; ++h) out.narrow(dim, h, 1).copy_(kv.narrow(dim, h / copies, 1));
  return out;
}

// Each kv head's gradient: the exact sum of its copies' (core/exact_sums.h: digits that
// add as integers, rounded once), on whatever device the gradient is.
struct RepeatHeadsBackward : autograd::Node {
  RepeatHeadsBackward(Shape shape, int64_t copies) : shape(std::move(shape)), copies(copies) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const int64_t dim = static_cast<int64_t>(shape.size()) - 2, heads = shape[shape.size() - 2];
    Tensor total = Tensor::empty(shape, grad_output.device());
    exact::ExactSums sums;
    for (int64_t c = 0; c < copies; ++c) {
      Tensor copy = Tensor::empty(shape, grad_output.device());
      for (int64_t h = 0; h < heads; ++h) copy.narrow(dim, h, 1).copy_(grad_output.narrow(dim, h * copies + c, 1));
      exact::ExactSums terms = exact::ExactSums::of_values(copy);
      if (c == 0) {
        sums = std::move(terms);
      } else {
        sums.add(terms);
      }
    }
    sums.round_into(total);
    return {total};
  }
  std::string name() const override { return "RepeatHeadsBackward"; }
  Shape shape;
  int64_t copies;
};

}  // namespace

Variable repeat_kv_heads(const Variable& kv, int64_t copies) {
  SEQPAR_CHECK(kv.defined() && (kv.data().dim() == 3 || kv.data().dim() == 4),
               "repeat_kv_heads: kv must be [S, H, D] or [B, S, H, D], got ", kv.defined() ? kv.shape() : Shape{});
  SEQPAR_CHECK(copies >= 1, "repeat_kv_heads: copies must be at least 1, got ", copies);
  if (copies == 1) return kv;
  Tensor out = repeat_heads(kv.data(), copies);
  if (!autograd::any_requires_grad({&kv})) return Variable(std::move(out));
  auto node = std::make_shared<RepeatHeadsBackward>(kv.shape(), copies);
  node->add_input(kv);
  return Variable::from_op(std::move(out), std::move(node));
}

}  // namespace seqpar::nn
