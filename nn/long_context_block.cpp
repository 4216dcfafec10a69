#include "nn/long_context_block.h"

#include <utility>

#include "nn/rope.h"

namespace seqpar::nn {

LongContextBlock::LongContextBlock(const LongContextBlockOptions& options, std::shared_ptr<SequenceGroup> ulysses,
                                   std::shared_ptr<SequenceGroup> cp, Generator& generator, Device device)
    : options_(options),
      projections_("LongContextBlock", {options.model_dim, options.heads, options.kv_heads, options.head_dim},
                   generator, device) {
  options_.kv_heads = projections_.heads().kv_heads;
  const AttentionMask mask =
      options.documents.empty() ? AttentionMask::causal() : AttentionMask::documents(options.documents, true);
  attention_ = std::make_shared<SequenceParallelAttention>(std::move(ulysses), std::move(cp),
                                                           SequenceParallelOptions{mask, options.layout, {}});
  for (const auto& [name, module] : projections_.modules()) register_module(name, module);
}

autograd::Variable LongContextBlock::forward(const autograd::Variable& x) const {
  // RoPE at the rows' global positions (within their documents), which under zigzag
  // are two runs far apart: never 0..rows-1.
  const auto at = [&](int64_t rows) {
    const std::vector<int64_t> global = positions(rows);
    return options_.documents.empty() ? global : document_positions(options_.documents, global);
  };
  return projections_.forward(x, at, options_.rope_base,
                              [&](const autograd::Variable& q, const autograd::Variable& k,
                                  const autograd::Variable& v) { return attention_->forward(q, k, v); });
}

}  // namespace seqpar::nn
