#include "nn/ulysses_attention.h"

#include <utility>
#include <vector>

#include "autograd/reshape.h"
#include "core/error.h"
#include "nn/sequence_shapes.h"
#include "nn/ulysses_all_to_all.h"

namespace seqpar::nn {

UlyssesAttention::UlyssesAttention(std::shared_ptr<SequenceGroup> group, bool causal)
    : UlyssesAttention(std::move(group), UlyssesAttentionOptions{causal, true, {}, {}}) {}

UlyssesAttention::UlyssesAttention(std::shared_ptr<SequenceGroup> group, UlyssesAttentionOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  SEQPAR_CHECK(group_ != nullptr, "UlyssesAttention: no sequence-parallel group");
  SEQPAR_CHECK(!options_.mask.has_positions(),
               "UlyssesAttention: the mask must not carry positions: after the exchange each rank holds "
               "every token of the sequence in order, and the mask is over their global positions");
}

autograd::Variable UlyssesAttention::forward(const autograd::Variable& q, const autograd::Variable& k,
                                             const autograd::Variable& v) const {
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), "UlyssesAttention: q, k or v is undefined");
  SEQPAR_CHECK(q.data().dim() == 3 || q.data().dim() == 4,
               "UlyssesAttention: q must be [B, S/sp, Hq, D] or [S/sp, Hq, D], got ", q.shape());
  SEQPAR_CHECK(k.data().dim() == q.data().dim() && v.shape() == k.shape() &&
                   k.shape().front() == q.shape().front() && (q.data().dim() == 3 || k.shape()[1] == q.shape()[1]) &&
                   k.shape().back() == q.shape().back(),
               "UlyssesAttention: k and v must be one shape, with q's batch, tokens and head dim; got q ",
               q.shape(), ", k ", k.shape(), ", v ", v.shape());
  const CallShape mine = check_ranks_agree("UlyssesAttention", "sp", q.data(), k.data(), *group_);
  const int64_t heads = mine.heads, kv_heads = mine.kv_heads, head_dim = mine.dim, sp = group_->size();
  SEQPAR_CHECK(heads % kv_heads == 0, "UlyssesAttention: Hq = ", heads, " query heads are not a multiple of the ",
               kv_heads, " kv heads");
  Shape out_shape = q.shape();
  out_shape.back() = heads * head_dim;
  out_shape.erase(out_shape.end() - 2);  // [B, S/sp, Hq * D] or [S/sp, Hq * D]
  const auto attend = [this](const autograd::Variable& q, const autograd::Variable& k,
                             const autograd::Variable& v) {
    return options_.attention ? options_.attention(q, k, v)
                              : scaled_dot_product_attention(q, k, v, options_.mask, options_.scale);
  };
  if (!options_.exchange) {  // the mistake: this rank's tokens only (see the options)
    return autograd::reshape(attend(q, k, v), out_shape);
  }
  SEQPAR_CHECK(heads % sp == 0, "UlyssesAttention: Hq = ", heads, " query heads do not split evenly over sp = ", sp,
               " ranks of group ", group_->name(),
               " (Hq must be a multiple of sp; uneven head splits are not supported: docs/ulysses.md)");
  // Past the head wall, each rank gets a copy of the kv heads its query heads read.
  const int64_t copies = kv_heads % sp == 0 ? 1 : heads / kv_heads;
  const autograd::Variable attended =
      attend(shard_heads(q, group_), shard_heads(repeat_kv_heads(k, copies), group_),
             shard_heads(repeat_kv_heads(v, copies), group_));
  return autograd::reshape(shard_sequence(attended, group_), out_shape);
}

}  // namespace seqpar::nn
