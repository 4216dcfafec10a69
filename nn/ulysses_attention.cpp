#include "nn/ulysses_attention.h"

#include <utility>

#include "autograd/reshape.h"
#include "core/error.h"
#include "nn/attention.h"
#include "nn/ulysses_all_to_all.h"

namespace seqpar::nn {

UlyssesAttention::UlyssesAttention(std::shared_ptr<SequenceGroup> group, bool causal)
    : UlyssesAttention(std::move(group), UlyssesAttentionOptions{causal, true, {}}) {}

UlyssesAttention::UlyssesAttention(std::shared_ptr<SequenceGroup> group, UlyssesAttentionOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  SEQPAR_CHECK(group_ != nullptr, "UlyssesAttention: no sequence-parallel group");
}

autograd::Variable UlyssesAttention::forward(const autograd::Variable& q, const autograd::Variable& k,
                                             const autograd::Variable& v) const {
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), "UlyssesAttention: q, k or v is undefined");
  SEQPAR_CHECK(q.shape().size() == 3, "UlyssesAttention: q must be [S/P, H, D], got ", q.shape());
  SEQPAR_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), "UlyssesAttention: q ", q.shape(),
               ", k ", k.shape(), " and v ", v.shape(), " must have the same shape");
  const int64_t tokens = q.shape()[0], heads = q.shape()[1], head_dim = q.shape()[2];
  const auto attend = [this](const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) {
    return options_.attention ? options_.attention(q, k, v)
                              : scaled_dot_product_attention(q, k, v, options_.causal);
  };
  if (!options_.exchange) {  // the mistake: this rank's tokens only (see the options)
    return autograd::reshape(attend(q, k, v), {tokens, heads * head_dim});
  }
  check_heads_split("UlyssesAttention", heads, *group_);
  const autograd::Variable attended =
      attend(shard_heads(q, group_), shard_heads(k, group_), shard_heads(v, group_));
  return autograd::reshape(shard_sequence(attended, group_), {tokens, heads * head_dim});
}

}  // namespace seqpar::nn
