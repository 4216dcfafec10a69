#include "nn/attention_projections.h"

#include "autograd/reshape.h"
#include "core/error.h"
#include "nn/rope.h"

namespace seqpar::nn {

AttentionProjections::AttentionProjections(const char* block, const AttentionHeads& heads, Generator& generator,
                                           Device device)
    : block_(block), heads_(heads) {
  SEQPAR_CHECK(heads.model_dim > 0 && heads.heads > 0 && heads.head_dim > 0, block, ": d_model (", heads.model_dim,
               "), heads (", heads.heads, ") and head_dim (", heads.head_dim, ") must be positive");
  SEQPAR_CHECK(heads.head_dim % 2 == 0, block, ": head_dim (", heads.head_dim,
               ") must be even: RoPE rotates pairs of features");
  if (heads_.kv_heads == 0) heads_.kv_heads = heads.heads;
  SEQPAR_CHECK(heads_.kv_heads > 0 && heads.heads % heads_.kv_heads == 0, block, ": kv_heads (", heads_.kv_heads,
               ") must divide heads (", heads.heads, ")");
  const int64_t width = heads_.heads * heads_.head_dim, kv_width = heads_.kv_heads * heads_.head_dim;
  query_ = std::make_shared<Linear>(heads_.model_dim, width, generator, device);
  key_ = std::make_shared<Linear>(heads_.model_dim, kv_width, generator, device);
  value_ = std::make_shared<Linear>(heads_.model_dim, kv_width, generator, device);
  output_ = std::make_shared<Linear>(width, heads_.model_dim, generator, device);
}

autograd::Variable AttentionProjections::forward(const autograd::Variable& x,
                                                 const std::function<std::vector<int64_t>(int64_t rows)>& positions,
                                                 float rope_base, const Attend& attend,
                                                 autograd::Variable* attention) const {
  SEQPAR_CHECK(x.defined() && (x.shape().size() == 2 || x.shape().size() == 3) &&
                   x.shape().back() == heads_.model_dim,
               block_, ": x must be [B, rows, d_model = ", heads_.model_dim, "] or [rows, d_model], got ",
               x.defined() ? x.shape() : Shape{});
  const bool batched = x.shape().size() == 3;
  const int64_t batch = batched ? x.shape()[0] : 1, rows = x.shape()[batched ? 1 : 0];
  const autograd::Variable flat = batched ? autograd::reshape(x, {batch * rows, heads_.model_dim}) : x;
  const auto heads_of = [&](const autograd::Variable& projected, int64_t heads) {
    return autograd::reshape(projected, batched ? Shape{batch, rows, heads, heads_.head_dim}
                                                : Shape{rows, heads, heads_.head_dim});
  };
  const std::vector<int64_t> at = positions(rows);
  const autograd::Variable q = rope(heads_of(query_->forward(flat), heads_.heads), at, rope_base);
  const autograd::Variable k = rope(heads_of(key_->forward(flat), heads_.kv_heads), at, rope_base);
  const autograd::Variable v = heads_of(value_->forward(flat), heads_.kv_heads);
  const autograd::Variable attended = attend(q, k, v);
  if (attention != nullptr) *attention = attended;
  const autograd::Variable y = output_->forward(
      batched ? autograd::reshape(attended, {batch * rows, heads_.heads * heads_.head_dim}) : attended);
  return batched ? autograd::reshape(y, {batch, rows, heads_.model_dim}) : y;
}

}  // namespace seqpar::nn
