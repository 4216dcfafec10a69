#include "nn/context_parallel_attention.h"

#include <string>
#include <utility>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "nn/sequence_shapes.h"

namespace seqpar::nn {

using autograd::Variable;
using detail::batch_first;
using detail::in_callers_rank;

namespace {

// A run of consecutive positions a rank holds: `length` tokens from `position`, at
// `offset` in the rank's own tokens.
struct Run {
  int64_t position, length, offset;
};

std::vector<Run> runs_of(int64_t sequence, int ranks, int rank, ContextParallelLayout layout) {
  SEQPAR_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "context parallelism: rank ", rank, " of ", ranks);
  if (layout == ContextParallelLayout::Contiguous) {
    SEQPAR_CHECK(sequence % ranks == 0, "context parallelism: S = ", sequence,
                 " tokens do not split evenly over cp = ", ranks, " ranks");
    const int64_t tokens = sequence / ranks;
    return {{rank * tokens, tokens, 0}};
  }
  SEQPAR_CHECK(sequence % (2 * ranks) == 0, "context parallelism, zigzag: S = ", sequence,
               " tokens do not split into 2 · cp = ", 2 * ranks, " equal chunks");
  const int64_t chunk = sequence / (2 * ranks);
  return {{rank * chunk, chunk, 0}, {(2 * ranks - 1 - rank) * chunk, chunk, chunk}};
}

std::vector<int64_t> all_positions(int64_t sequence) {
  std::vector<int64_t> positions(static_cast<size_t>(sequence));
  for (int64_t t = 0; t < sequence; ++t) positions[static_cast<size_t>(t)] = t;
  return positions;
}

// Every rank's `local` (one all-gather), its tokens (along `dim`) laid out in position
// order: the sequence's chains then run over them as one rank's do.
Tensor gather_in_order(const Tensor& local, int64_t dim, SequenceGroup& group, ContextParallelLayout layout) {
  const Tensor mine = local.contiguous();
  const int ranks = group.size();
  const int64_t sequence = mine.size(dim) * ranks;
  Tensor gathered = Tensor::empty({ranks, mine.numel()}, mine.device());
  group.all_gather(gathered, mine.view({1, mine.numel()}));
  Shape whole = mine.shape();
  whole[static_cast<size_t>(dim)] = sequence;
  Tensor out = Tensor::empty(whole, mine.device());
  for (int r = 0; r < ranks; ++r) {
    const Tensor theirs = gathered.narrow(0, r, 1).view(mine.shape());
    for (const Run& run : runs_of(sequence, ranks, r, layout)) {
      out.narrow(dim, run.position, run.length).copy_(theirs.narrow(dim, run.offset, run.length));
    }
  }
  return out;
}

// What one rank's call needs in backward, and the backward itself.
struct ContextParallelBackward : autograd::Node {
  std::shared_ptr<SequenceGroup> group;
  ContextParallelOptions options;
  bool three_dims = false;
  Tensor q, k, v;        // this rank's, [B, S/C, H, D]
  Tensor keys, values;   // every rank's k and v, in position order
  AttentionForward forward;
  AttentionMask queries_mask, keys_mask;  // this rank's queries against every key, and the converse

  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const Tensor g = batch_first(grad_output);
    const std::optional<float> c = options.scale;
    const Tensor dq = attention_backward_queries(g, q, keys, values, forward, queries_mask, c);
    // Every rank's queries, their dO and their forward, for this rank's keys' chains.
    const ContextParallelLayout layout = options.layout;
    const AttentionForward all_rows{gather_in_order(forward.out, 1, *group, layout),
                                    gather_in_order(forward.row_max, 2, *group, layout),
                                    gather_in_order(forward.row_sum, 2, *group, layout)};
    const AttentionKeyGrads dkv = attention_backward_keys(
        gather_in_order(g, 1, *group, layout), gather_in_order(q, 1, *group, layout), k, v, all_rows, keys_mask, c);
    return {in_callers_rank(dq, three_dims), in_callers_rank(dkv.k, three_dims), in_callers_rank(dkv.v, three_dims)};
  }
  std::string name() const override { return "ContextParallelAttentionBackward"; }
};

}  // namespace

std::vector<int64_t> context_parallel_positions(int64_t sequence, int ranks, int rank,
                                                ContextParallelLayout layout) {
  std::vector<int64_t> positions;
  for (const Run& run : runs_of(sequence, ranks, rank, layout)) {
    for (int64_t t = 0; t < run.length; ++t) positions.push_back(run.position + t);
  }
  return positions;
}

ContextParallelAttention::ContextParallelAttention(std::shared_ptr<SequenceGroup> group,
                                                   ContextParallelOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  SEQPAR_CHECK(group_ != nullptr, "ContextParallelAttention: no context-parallel group");
  SEQPAR_CHECK(!options_.mask.has_positions(),
               "ContextParallelAttention: the mask must not carry positions: the layer gives each rank's "
               "tokens their global positions from its layout");
}

std::vector<int64_t> ContextParallelAttention::positions(int64_t tokens) const {
  return context_parallel_positions(tokens * group_->size(), group_->size(), group_->rank(), options_.layout);
}

Variable ContextParallelAttention::forward(const Variable& q, const Variable& k, const Variable& v) const {
  const char* op = "ContextParallelAttention";
  SEQPAR_CHECK(q.defined() && k.defined() && v.defined(), op, ": q, k or v is undefined");
  SEQPAR_CHECK(q.data().dim() == 3 || q.data().dim() == 4, op, ": q must be [B, S/cp, Hq, D] or [S/cp, Hq, D], got ",
               q.shape());
  SEQPAR_CHECK(k.data().dim() == q.data().dim() && v.shape() == k.shape(), op,
               ": k and v must be one shape, of q's rank; got q ", q.shape(), ", k ", k.shape(), ", v ", v.shape());
  const CallShape shape = check_ranks_agree(op, "cp", q.data(), k.data(), *group_);
  const std::vector<int64_t> mine = positions(shape.tokens);
  const std::vector<int64_t> every = all_positions(shape.tokens * group_->size());
  auto node = std::make_shared<ContextParallelBackward>();
  node->group = group_;
  node->options = options_;
  node->three_dims = shape.three_dims;
  node->q = batch_first(q.data());
  node->k = batch_first(k.data());
  node->v = batch_first(v.data());
  node->keys = gather_in_order(node->k, 1, *group_, options_.layout);
  node->values = gather_in_order(node->v, 1, *group_, options_.layout);
  node->queries_mask = options_.mask.at_positions(mine, every);
  node->keys_mask = options_.mask.at_positions(every, mine);
  node->forward = attention_forward(node->q, node->keys, node->values, node->queries_mask, options_.scale);
  Tensor out = in_callers_rank(node->forward.out, shape.three_dims);
  if (!autograd::any_requires_grad({&q, &k, &v})) return Variable(std::move(out));
  node->add_input(q);
  node->add_input(k);
  node->add_input(v);
  return Variable::from_op(std::move(out), std::move(node));
}

}  // namespace seqpar::nn
