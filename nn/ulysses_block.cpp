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
  attention_ = std::make_shared<UlyssesAttention>(
      std::move(group), UlyssesAttentionOptions{options.causal, options.exchange, options.attention});
  const int64_t width = options.heads * options.head_dim;
  query_ = std::make_shared<Linear>(options.model_dim, width, generator, device);
  key_ = std::make_shared<Linear>(options.model_dim, width, generator, device);
  value_ = std::make_shared<Linear>(options.model_dim, width, generator, device);
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
  return positions;
}

autograd::Variable UlyssesBlock::forward(const autograd::Variable& x, autograd::Variable* attention) const {
  SEQPAR_CHECK(x.defined() && x.shape().size() == 2 && x.shape()[1] == options_.model_dim,
               "UlyssesBlock: x must be [rows, d_model = ", options_.model_dim, "], got ",
               x.defined() ? x.shape() : Shape{});
  const int64_t rows = x.shape()[0];
  const Shape heads_shape{rows, options_.heads, options_.head_dim};
  const std::vector<int64_t> at = positions(rows);
  const autograd::Variable q = rope(autograd::reshape(query_->forward(x), heads_shape), at, options_.rope_base);
  const autograd::Variable k = rope(autograd::reshape(key_->forward(x), heads_shape), at, options_.rope_base);
  const autograd::Variable v = autograd::reshape(value_->forward(x), heads_shape);
  const autograd::Variable attended = attention_->forward(q, k, v);
  if (attention != nullptr) *attention = attended;
  return output_->forward(attended);
}

}  // namespace seqpar::nn
