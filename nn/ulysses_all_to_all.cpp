#include "nn/ulysses_all_to_all.h"

#include <string>
#include <utility>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/attention.h"

namespace seqpar::nn {

namespace {

class SingleRankGroup final : public SequenceGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single rank"; }
  void all_to_all(Tensor& output, const Tensor& input) override {
    SEQPAR_CHECK(input.defined() && output.defined() && output.shape() == input.shape(),
                 "all_to_all on group single rank: output ", output.shape(),
                 " should be the input's ", input.shape());
    output.copy_(input);
  }
};

// x as [B, T, H, D]: a 3-D [T, H, D] is one sequence.
Tensor four_dims(const char* op, const Tensor& x) {
  SEQPAR_CHECK(x.defined() && (x.dim() == 3 || x.dim() == 4), op,
               ": expects a tensor [tokens, heads, head_dim] or [batch, tokens, heads, head_dim], got ",
               x.defined() ? x.shape() : Shape{});
  return detail::batch_first(x);
}

}  // namespace

std::shared_ptr<SequenceGroup> single_rank_group() { return std::make_shared<SingleRankGroup>(); }

void SequenceGroup::all_gather(Tensor& output, const Tensor& input) {
  const Tensor one = input.contiguous();
  Shape copies_shape = one.shape();
  SEQPAR_CHECK(!copies_shape.empty(), "all_gather on group ", name(), ": the input needs a first dim");
  copies_shape[0] *= size();
  Tensor copies = Tensor::empty(copies_shape, one.device());
  for (int r = 0; r < size(); ++r) copies.narrow(0, r * one.size(0), one.size(0)).copy_(one);
  all_to_all(output, copies);
}

void check_heads_split(const char* op, int64_t heads, const SequenceGroup& group) {
  SEQPAR_CHECK(heads % group.size() == 0, op, ": H = ", heads, " heads do not split evenly over sp = ",
               group.size(), " ranks of group ", group.name(),
               " (H must be a multiple of sp; uneven head splits are not supported)");
}

// Rank r's [B, S/P, H, D] becomes P chunks [B, S/P, H/P, D], chunk j holding heads
// group j; after the exchange, chunk i holds rank i's tokens of this rank's heads, and
// the chunks side by side along the tokens are the whole sequence in order.
Tensor shard_heads(const Tensor& input, SequenceGroup& group) {
  const Tensor x = four_dims("shard_heads", input);
  check_heads_split("shard_heads", x.size(2), group);
  const int64_t ranks = group.size(), batch = x.size(0), tokens = x.size(1);
  const int64_t group_heads = x.size(2) / ranks, head_dim = x.size(3);
  Tensor send = Tensor::empty({ranks * batch, tokens, group_heads, head_dim}, x.device());
  for (int64_t j = 0; j < ranks; ++j) {
    send.narrow(0, j * batch, batch).copy_(x.narrow(2, j * group_heads, group_heads));
  }
  Tensor received = Tensor::empty(send.shape(), x.device());
  group.all_to_all(received, send);
  Tensor output = Tensor::empty({batch, ranks * tokens, group_heads, head_dim}, x.device());
  for (int64_t i = 0; i < ranks; ++i) {
    output.narrow(1, i * tokens, tokens).copy_(received.narrow(0, i * batch, batch));
  }
  return detail::in_callers_rank(output, input.dim() == 3);
}

// The sequence's P chunks of S/P tokens go back to their ranks; what arrives from rank
// j is this rank's tokens of heads group j, put back in its columns of heads.
Tensor shard_sequence(const Tensor& input, SequenceGroup& group) {
  const Tensor x = four_dims("shard_sequence", input);
  const int64_t ranks = group.size(), batch = x.size(0);
  SEQPAR_CHECK(x.size(1) % ranks == 0, "shard_sequence: ", x.size(1),
               " tokens do not split evenly over sp = ", ranks, " ranks of group ", group.name());
  const int64_t tokens = x.size(1) / ranks, group_heads = x.size(2), head_dim = x.size(3);
  Tensor send = Tensor::empty({ranks * batch, tokens, group_heads, head_dim}, x.device());
  for (int64_t j = 0; j < ranks; ++j) {
    send.narrow(0, j * batch, batch).copy_(x.narrow(1, j * tokens, tokens));
  }
  Tensor received = Tensor::empty(send.shape(), x.device());
  group.all_to_all(received, send);
  Tensor output = Tensor::empty({batch, tokens, ranks * group_heads, head_dim}, x.device());
  for (int64_t i = 0; i < ranks; ++i) {
    output.narrow(2, i * group_heads, group_heads).copy_(received.narrow(0, i * batch, batch));
  }
  return detail::in_callers_rank(output, input.dim() == 3);
}

// ---------------------------------------------------------------- autograd

namespace {

enum class Exchange { ShardHeads, ShardSequence, AllToAll };

Tensor exchange(Exchange which, const Tensor& x, SequenceGroup& group) {
  switch (which) {
    case Exchange::ShardHeads: return shard_heads(x, group);
    case Exchange::ShardSequence: return shard_sequence(x, group);
    case Exchange::AllToAll: {
      Tensor output = Tensor::empty(x.shape(), x.device());
      group.all_to_all(output, x);
      return output;
    }
  }
  SEQPAR_FAIL("unknown exchange");
}

Exchange inverse(Exchange which) {
  switch (which) {
    case Exchange::ShardHeads: return Exchange::ShardSequence;
    case Exchange::ShardSequence: return Exchange::ShardHeads;
    case Exchange::AllToAll: return Exchange::AllToAll;
  }
  SEQPAR_FAIL("unknown exchange");
}

// The gradient of a permutation of values is the inverse permutation of the gradient.
struct ExchangeBackward : autograd::Node {
  ExchangeBackward(Exchange forward, std::shared_ptr<SequenceGroup> group)
      : forward(forward), group(std::move(group)) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    return {exchange(inverse(forward), grad_output, *group)};
  }
  std::string name() const override {
    switch (forward) {
      case Exchange::ShardHeads: return "ShardHeadsBackward";
      case Exchange::ShardSequence: return "ShardSequenceBackward";
      case Exchange::AllToAll: return "AllToAllBackward";
    }
    return "ExchangeBackward";
  }
  Exchange forward;
  std::shared_ptr<SequenceGroup> group;
};

autograd::Variable differentiable(Exchange which, const autograd::Variable& x,
                                  std::shared_ptr<SequenceGroup> group) {
  SEQPAR_CHECK(group != nullptr, "sequence-parallel exchange: no group");
  SEQPAR_CHECK(x.defined(), "sequence-parallel exchange: the input is undefined");
  Tensor output = exchange(which, x.data(), *group);
  if (!autograd::any_requires_grad({&x})) return autograd::Variable(std::move(output));
  auto node = std::make_shared<ExchangeBackward>(which, std::move(group));
  node->add_input(x);
  return autograd::Variable::from_op(std::move(output), std::move(node));
}

}  // namespace

autograd::Variable shard_heads(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group) {
  return differentiable(Exchange::ShardHeads, x, std::move(group));
}

autograd::Variable shard_sequence(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group) {
  return differentiable(Exchange::ShardSequence, x, std::move(group));
}

autograd::Variable all_to_all(const autograd::Variable& x, std::shared_ptr<SequenceGroup> group) {
  return differentiable(Exchange::AllToAll, x, std::move(group));
}

}  // namespace seqpar::nn
