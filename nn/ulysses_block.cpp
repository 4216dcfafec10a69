#include "nn/ulysses_block.h"

#include <utility>

#include "autograd/reshape.h"
#include "core/error.h"
#include "nn/rope.h"

namespace seqpar::nn {

UlyssesBlock::UlyssesBlock(const UlyssesBlockOptions& options, std::shared_ptr<SequenceGroup> group,
                           Generator& generator, Device device)
    : options_(options) {
  SEQPAR_CHECK(options.model_dim > 0 && options.heads > 0 && options.head_dim > 0,
               "UlyssesBlock: d_model (", options.model_dim, "), heads (", options.heads,
               ") and head_dim (", options.head_dim, ") must be positive");
  SEQPAR_CHECK(options.head_dim % 2 == 0, "UlyssesBlock: head_dim (", options.head_dim,
               ") must be even: RoPE rotates pairs of features");
  if (options_.kv_heads == 0) options_.kv_heads = options.heads;
  SEQPAR_CHECK(options_.kv_heads > 0 && options.heads % options_.kv_heads == 0, "UlyssesBlock: kv_heads (",
               options_.kv_heads, ") must divide heads (", options.heads, ")");
  const AttentionMask mask = options.documents.empty() ? AttentionMask(options.causal)
                                                       : AttentionMask::documents(options.documents, options.causal);
  attention_ = std::make_shared<UlyssesAttention>(
      std::move(group), UlyssesAttentionOptions{mask, options.exchange, options.attention, {}});
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

std::vector<int64_t> UlyssesBlock::positions(int64_t rows) const {
  const int64_t first =
      options_.shard_local_positions ? 0 : static_cast<int64_t>(attention_->group()->rank()) * rows;
  std::vector<int64_t> positions(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) positions[static_cast<size_t>(i)] = first + i;
  return options_.documents.empty() ? positions : document_positions(options_.documents, positions);
}

autograd::Variable UlyssesBlock::forward(const autograd::Variable& x, autograd::Variable* attention) const {
  SEQPAR_CHECK(x.defined() && (x.shape().size() == 2 || x.shape().size() == 3) &&
                   x.shape().back() == options_.model_dim,
               "UlyssesBlock: x must be [B, rows, d_model = ", options_.model_dim, "] or [rows, d_model], got ",
               x.defined() ? x.shape() : Shape{});
  const bool batched = x.shape().size() == 3;
  const int64_t batch = batched ? x.shape()[0] : 1, rows = x.shape()[batched ? 1 : 0];
  // The projections see every row of the batch at once; attention sees sequences.
  const autograd::Variable flat = batched ? autograd::reshape(x, {batch * rows, options_.model_dim}) : x;
  const auto heads_of = [&](const autograd::Variable& projected, int64_t heads) {
    return autograd::reshape(projected, batched ? Shape{batch, rows, heads, options_.head_dim}
                                                : Shape{rows, heads, options_.head_dim});
  };
  const std::vector<int64_t> at = positions(rows);  // the same for every sequence
  const autograd::Variable q = rope(heads_of(query_->forward(flat), options_.heads), at, options_.rope_base);
  const autograd::Variable k = rope(heads_of(key_->forward(flat), options_.kv_heads), at, options_.rope_base);
  const autograd::Variable v = heads_of(value_->forward(flat), options_.kv_heads);
  const autograd::Variable attended = attention_->forward(q, k, v);
  if (attention != nullptr) *attention = attended;
  const autograd::Variable y = output_->forward(
      batched ? autograd::reshape(attended, {batch * rows, options_.heads * options_.head_dim}) : attended);
  return batched ? autograd::reshape(y, {batch, rows, options_.model_dim}) : y;
}

}  // namespace seqpar::nn
