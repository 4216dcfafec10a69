#include "nn/ulysses_attention.h"

#include <array>
#include <sstream>
#include <utility>
#include <vector>

#include "autograd/reshape.h"
#include "core/error.h"
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

namespace {

// What a rank passes: the rank of q's shape, then B, S/P, Hq, Hkv and D.
using CallShape = std::array<int64_t, 6>;

CallShape shape_of(const Tensor& q, const Tensor& k) {
  const bool three = q.dim() == 3;
  const int64_t first = three ? 0 : 1;
  return {q.dim(), three ? 1 : q.size(0), q.size(first), q.size(first + 1), k.size(first + 1), q.size(first + 2)};
}

std::string text(const CallShape& s) {
  std::ostringstream out;
  out << "q [";
  if (s[0] == 4) out << s[1] << ", ";
  out << s[2] << ", " << s[3] << ", " << s[5] << "], k and v [";
  if (s[0] == 4) out << s[1] << ", ";
  out << s[2] << ", " << s[4] << ", " << s[5] << "]";
  return out.str();
}

// Every rank's CallShape, through one small all-to-all, so that ranks that disagree are
// refused on every rank, in the user's terms, before any of their data moves. Each
// value goes as three floats of 21 bits: exact, whatever its size.
std::vector<CallShape> shapes_of_ranks(const CallShape& mine, SequenceGroup& group, Device device) {
  constexpr int kWords = 3 * 6;
  const int ranks = group.size();
  std::vector<float> send(static_cast<size_t>(ranks) * kWords);
  for (int r = 0; r < ranks; ++r) {
    for (int n = 0; n < 6; ++n) {
      for (int w = 0; w < 3; ++w) {
        send[static_cast<size_t>(r * kWords + 3 * n + w)] = static_cast<float>((mine[n] >> (21 * (2 - w))) & 0x1fffff);
      }
    }
  }
  const Tensor input = Tensor::from_data({ranks, kWords}, send, Device::cpu()).to(device);
  Tensor output = Tensor::empty(input.shape(), device);
  group.all_to_all(output, input);
  const std::vector<float> got = output.to_vector();
  std::vector<CallShape> shapes(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (int n = 0; n < 6; ++n) {
      int64_t value = 0;
      for (int w = 0; w < 3; ++w) value = (value << 21) | static_cast<int64_t>(got[static_cast<size_t>(r * kWords + 3 * n + w)]);
      shapes[static_cast<size_t>(r)][n] = value;
    }
  }
  return shapes;
}

// Refuses ranks that passed different shapes, naming each rank's, and a sequence that
// was not cut into equal shards, naming S and sp.
void check_ranks_agree(const std::vector<CallShape>& shapes, const SequenceGroup& group) {
  bool same = true, same_tokens = true;
  int64_t sequence = 0;
  for (const CallShape& s : shapes) {
    CallShape without_tokens = s, first_without = shapes[0];
    without_tokens[2] = first_without[2] = 0;
    same = same && without_tokens == first_without;
    same_tokens = same_tokens && s[2] == shapes[0][2];
    sequence += s[2];
  }
  std::ostringstream each;
  for (size_t r = 0; r < shapes.size(); ++r) each << (r ? "; " : "") << "rank " << r << " " << text(shapes[r]);
  SEQPAR_CHECK(same, "UlyssesAttention: the ranks of group ", group.name(),
               " passed different batches, heads or head dims (each must pass its own tokens of the same "
               "sequences, every head): ", each.str());
  std::ostringstream tokens;
  for (size_t r = 0; r < shapes.size(); ++r) tokens << (r ? ", " : "") << "rank " << r << ": " << shapes[r][2];
  SEQPAR_CHECK(same_tokens, "UlyssesAttention: the ranks of group ", group.name(),
               " hold different numbers of tokens (", tokens.str(), "): each rank holds S/sp tokens of the "
               "sequence, and S = ", sequence, " does not split evenly over sp = ", group.size(),
               "; pad the sequence to a multiple of sp");
}

}  // namespace

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
  const CallShape mine = shape_of(q.data(), k.data());
  check_ranks_agree(shapes_of_ranks(mine, *group_, q.device()), *group_);
  const int64_t heads = mine[3], kv_heads = mine[4], head_dim = mine[5], sp = group_->size();
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
