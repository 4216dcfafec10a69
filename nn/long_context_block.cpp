#include "nn/long_context_block.h"

#include <utility>

#include "autograd/reshape.h"
#include "core/error.h"
#include "nn/rope.h"

namespace seqpar::nn {

LongContextBlock::LongContextBlock(const LongContextBlockOptions& options, std::shared_ptr<SequenceGroup> ulysses,
                                   std::shared_ptr<SequenceGroup> cp, Generator& generator, Device device)
    : options_(options) {
  SEQPAR_CHECK(options.model_dim > 0 && options.heads > 0 && options.head_dim > 0, "LongContextBlock: d_model (",
               options.model_dim, "), heads (", options.heads, ") and head_dim (", options.head_dim,
               ") must be positive");
  SEQPAR_CHECK(options.head_dim % 2 == 0, "LongContextBlock: head_dim (", options.head_dim,
               ") must be even: RoPE rotates pairs of features");
  if (options_.kv_heads == 0) options_.kv_heads = options.heads;
  SEQPAR_CHECK(options_.kv_heads > 0 && options.heads % options_.kv_heads == 0, "LongContextBlock: kv_heads (",
               options_.kv_heads, ") must divide heads (", options.heads, ")");
  const AttentionMask mask =
      options.documents.empty() ? AttentionMask::causal() : AttentionMask::documents(options.documents, true);
  attention_ = std::make_shared<SequenceParallelAttention>(std::move(ulysses), std::move(cp),
                                                           SequenceParallelOptions{mask, options.layout, {}});
  const int64_t width = options.heads * options.head_dim, kv_width = options_.kv_heads * options.head_dim;
  query_ = std::make_shared<Linear>(options.model_dim, width, generator, device);
  key_ = std::make_shared<Linear>(options.model_dim, kv_width, generator, device);
  value_ = std::make_shared<Linear>(options.model_dim, kv_width, generator, device);
  output_ = std::make_shared<Linear>(width, options.model_dim, generator, device);
  register_module("query", query_);
  register_module("key", key_);
  register_module("value", value_);
  register_module("output", output_);
}

autograd::Variable LongContextBlock::forward(const autograd::Variable& x) const {
  SEQPAR_CHECK(x.defined() && (x.shape().size() == 2 || x.shape().size() == 3) &&
                   x.shape().back() == options_.model_dim,
               "LongContextBlock: x must be [B, rows, d_model = ", options_.model_dim, "] or [rows, d_model], got ",
               x.defined() ? x.shape() : Shape{});
  const bool batched = x.shape().size() == 3;
  const int64_t batch = batched ? x.shape()[0] : 1, rows = x.shape()[batched ? 1 : 0];
  const autograd::Variable flat = batched ? autograd::reshape(x, {batch * rows, options_.model_dim}) : x;
  const auto heads_of = [&](const autograd::Variable& projected, int64_t heads) {
    return autograd::reshape(projected, batched ? Shape{batch, rows, heads, options_.head_dim}
                                                : Shape{rows, heads, options_.head_dim});
  };
  // RoPE at the rows' global positions (within their documents), which under zigzag
  // are two runs far apart: never 0..rows-1.
  const std::vector<int64_t> global = positions(rows);
  const std::vector<int64_t> at = options_.documents.empty() ? global : document_positions(options_.documents, global);
  const autograd::Variable q = rope(heads_of(query_->forward(flat), options_.heads), at, options_.rope_base);
  const autograd::Variable k = rope(heads_of(key_->forward(flat), options_.kv_heads), at, options_.rope_base);
  const autograd::Variable v = heads_of(value_->forward(flat), options_.kv_heads);
  const autograd::Variable attended = attention_->forward(q, k, v);
  const autograd::Variable y = output_->forward(
      batched ? autograd::reshape(attended, {batch * rows, options_.heads * options_.head_dim}) : attended);
  return batched ? autograd::reshape(y, {batch, rows, options_.model_dim}) : y;
}

}  // namespace seqpar::nn
