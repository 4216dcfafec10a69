// LongContextBlock: a Llama layer's attention (grouped-query heads, a batch, packed
// documents) whose sequence splits over sp = ulysses x cp ranks through
// SequenceParallelAttention (USP), inside nn::AttentionProjections as UlyssesBlock is:
//
//   x [B, S/sp, d_model]                this rank's rows, at positions() (the layout's)
//   q = Linear(x), k, v = Linear(x)     [B, S/sp, Hq, D] and [B, S/sp, Hkv, D]
//   q, k    = rope(q / k, positions)    at the rows' global positions, or within their
//                                       document when documents are packed
//   a       = SequenceParallelAttention(q, k, v)   [B, S/sp, Hq · D]
//   y       = Linear(a)                 [B, S/sp, d_model]
//
// The projections see only this rank's rows; their weight gradients, summed exactly
// over the ranks (nn::ExactGradientSync over sp x dp), are one-rank training's, bit for
// bit (tests/dist/sequence_parallel_test.cpp). A rank's rows are not contiguous under the
// zigzag layout: the caller feeds each rank the rows at positions(), and its targets.
//
// Parameters, in order: query, key, value, output (each a Linear's weight and bias),
// drawn from the generator in that order, as UlyssesBlock's.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention_projections.h"
#include "nn/module.h"
#include "nn/sequence_group.h"
#include "nn/sequence_parallel_attention.h"

namespace seqpar::nn {

struct LongContextBlockOptions {
  int64_t model_dim = 128;  // d_model
  int64_t heads = 8;        // Hq, a multiple of the Ulysses degree
  int64_t kv_heads = 0;     // Hkv dividing Hq; 0: Hq
  int64_t head_dim = 16;    // D, even (RoPE rotates pairs)
  // Packed documents: each sequence's global document boundaries (AttentionMask::documents);
  // empty: one document. Causal within each document either way.
  std::vector<int64_t> documents;
  ContextParallelLayout layout = ContextParallelLayout::Zigzag;  // causal: zigzag evens the work
  float rope_base = 10000.0f;
};

class LongContextBlock : public Module {
 public:
  LongContextBlock(const LongContextBlockOptions& options, std::shared_ptr<SequenceGroup> ulysses,
                   std::shared_ptr<SequenceGroup> cp, Generator& generator, Device device = Device::cpu());

  // x: this rank's rows [B, S/sp, d_model] (or [S/sp, d_model]), those at positions().
  // Collective over both groups, in forward and in backward.
  autograd::Variable forward(const autograd::Variable& x) const;

  // The global positions of this rank's `rows` rows (SequenceParallelAttention::positions).
  std::vector<int64_t> positions(int64_t rows) const { return attention_->positions(rows); }

  const LongContextBlockOptions& options() const { return options_; }
  const SequenceParallelAttention& attention() const { return *attention_; }

 private:
  LongContextBlockOptions options_;
  AttentionProjections projections_;
  std::shared_ptr<SequenceParallelAttention> attention_;
};

}  // namespace seqpar::nn
