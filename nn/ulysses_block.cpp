#include "nn/ulysses_block.h"

#include <utility>

#include "nn/rope.h"

namespace seqpar::nn {

UlyssesBlock::UlyssesBlock(const UlyssesBlockOptions& options, std::shared_ptr<SequenceGroup> group,
                           Generator& generator, Device device)
    : options_(options),
      projections_("UlyssesBlock", {options.model_dim, options.heads, options.kv_heads, options.head_dim},
                   generator, device) {
  options_.kv_heads = projections_.heads().kv_heads;
  const AttentionMask mask = options.documents.empty() ? AttentionMask(options.causal)
                                                       : AttentionMask::documents(options.documents, options.causal);
  attention_ = std::make_shared<UlyssesAttention>(
      std::move(group), UlyssesAttentionOptions{mask, options.exchange, options.attention, {}});
  for (const auto& [name, module] : projections_.modules()) register_module(name, module);
}

std::vector<int64_t> UlyssesBlock::positions(int64_t rows) const {
  const int64_t first =
      options_.shard_local_positions ? 0 : static_cast<int64_t>(attention_->group()->rank()) * rows;
  std::vector<int64_t> positions(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) positions[static_cast<size_t>(i)] = first + i;
  return options_.documents.empty() ? positions : document_positions(options_.documents, positions);
}

autograd::Variable UlyssesBlock::forward(const autograd::Variable& x, autograd::Variable* attention) const {
  return projections_.forward(
      x, [&](int64_t rows) { return positions(rows); }, options_.rope_base,
      [&](const autograd::Variable& q, const autograd::Variable& k, const autograd::Variable& v) {
        return attention_->forward(q, k, v);
      },
      attention);
}

}  // namespace seqpar::nn
