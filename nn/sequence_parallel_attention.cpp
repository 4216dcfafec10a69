#include "nn/sequence_parallel_attention.h"

#include <utility>

#include "core/error.h"

namespace seqpar::nn {

SequenceParallelAttention::SequenceParallelAttention(std::shared_ptr<SequenceGroup> ulysses,
                                                     std::shared_ptr<SequenceGroup> cp,
                                                     SequenceParallelOptions options)
    : options_(std::move(options)) {
  SEQPAR_CHECK(ulysses != nullptr && cp != nullptr, "SequenceParallelAttention: no ",
               ulysses == nullptr ? "Ulysses" : "context-parallel",
               " group (a level of degree 1 takes nn::single_rank_group())");
  context_parallel_ = std::make_shared<ContextParallelAttention>(
      std::move(cp), ContextParallelOptions{options_.mask, options_.layout, options_.scale});
  // Ulysses' exchanges around the context-parallel attention: after shard_heads a rank
  // holds its cp rank's S/cp tokens, in position order, of its heads, which is what the
  // context-parallel layer takes.
  const std::shared_ptr<ContextParallelAttention> inner = context_parallel_;
  UlyssesAttentionOptions outer;
  outer.mask = options_.mask;  // checked there too; the inner layer applies it
  outer.scale = options_.scale;
  outer.attention = [inner](const autograd::Variable& q, const autograd::Variable& k, const autograd::Variable& v) {
    return inner->forward(q, k, v);
  };
  ulysses_ = std::make_shared<UlyssesAttention>(std::move(ulysses), std::move(outer));
}

std::vector<int64_t> SequenceParallelAttention::positions(int64_t tokens) const {
  const int64_t ulysses = ulysses_->group()->size();
  // The cp rank's S/cp positions, in order; this Ulysses rank's run of them.
  const std::vector<int64_t> cp_rank = context_parallel_->positions(tokens * ulysses);
  const auto first = cp_rank.begin() + ulysses_->group()->rank() * tokens;
  return std::vector<int64_t>(first, first + tokens);
}

autograd::Variable SequenceParallelAttention::forward(const autograd::Variable& q, const autograd::Variable& k,
                                                      const autograd::Variable& v) const {
  return ulysses_->forward(q, k, v);
}

}  // namespace seqpar::nn
