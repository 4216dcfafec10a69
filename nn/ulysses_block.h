// UlyssesBlock: the smallest model that trains through Ulysses attention, shaped as a
// Llama layer's attention (grouped-query heads, a batch, packed documents), built from
// the public API alone (nn::AttentionProjections around nn::UlyssesAttention):
//
//   x [B, S/P, d_model]                 this rank's rows of B sequences of S tokens
//                                       ([S/P, d_model]: one sequence)
//   q = Linear(x), k, v = Linear(x)     [B, S/P, Hq, D] and [B, S/P, Hkv, D]
//   q, k    = rope(q / k, positions)    at global positions sp_rank * S/P + i, or
//                                       within their document when documents are packed
//   a       = UlyssesAttention(q, k, v) [B, S/P, Hq * D]  (two all-to-alls inside)
//   y       = Linear(a)                 [B, S/P, d_model]
//
// Everything outside attention stays sequence-sharded, as in DeepSpeed-Ulysses: the
// projections see only this rank's rows, so their weight gradients are sums over rows
// that other ranks hold too. Summed exactly over the ranks (nn/exact_gradients.h, and an
// exact all-reduce over sp x dp) they give one-rank training's gradients bit for bit;
// summed in float per rank they would not (DeepSpeed #6868's ground).
//
// Parameters, in order: query, key, value, output (each a Linear's weight and bias),
// drawn from the generator in that order: the same seed gives every rank, and a
// one-rank baseline, the same initial model.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention_projections.h"
#include "nn/module.h"
#include "nn/sequence_group.h"
#include "nn/ulysses_attention.h"

namespace seqpar::nn {

struct UlyssesBlockOptions {
  int64_t model_dim = 128;  // d_model: x's and y's columns
  int64_t heads = 8;        // Hq, a multiple of the group's size
  int64_t kv_heads = 0;     // Hkv dividing Hq (grouped-query heads); 0: Hq (multi-head)
  int64_t head_dim = 16;    // D, even (RoPE rotates pairs)
  bool causal = true;
  // Packed documents: the global boundaries of each sequence's documents (as
  // AttentionMask::documents, the same for every sequence); empty: one document. Each
  // document attends within itself, and RoPE restarts at its first token.
  std::vector<int64_t> documents;
  float rope_base = 10000.0f;
  // The mistakes seqpar-repro's ulysses scenario shows, each off by default:
  // RoPE at 0..S/P-1 on every shard instead of the global positions (Megatron-DeepSpeed
  // #392): every shard but the first gets the first shard's positions.
  bool shard_local_positions = false;
  bool exchange = true;      // false: no all-to-all (UlyssesAttentionOptions::exchange)
  LocalAttention attention;  // empty: the ordinary attention (UlyssesAttentionOptions)
};

class UlyssesBlock : public Module {
 public:
  UlyssesBlock(const UlyssesBlockOptions& options, std::shared_ptr<SequenceGroup> group,
               Generator& generator, Device device = Device::cpu());

  // x: this rank's rows [B, S/P, d_model] (or [S/P, d_model]) of the sequences (rank r
  // holds rows r * S/P ...). Collective over the group, in forward and in backward.
  // `attention`, when given, receives the attention's output [B, S/P, Hq * D] (the output
  // projection's input, 2-D for a 2-D x), for a report or a test.
  autograd::Variable forward(const autograd::Variable& x, autograd::Variable* attention = nullptr) const;

  // RoPE's positions of this rank's `rows` tokens: the global rank * rows + i, or with
  // packed documents each token's position within its document. A shard-local
  // 0..rows-1 would give every shard the first shard's positions (Megatron-DeepSpeed #392;
  // what options.shard_local_positions does, to show it).
  std::vector<int64_t> positions(int64_t rows) const;

  const UlyssesBlockOptions& options() const { return options_; }

 private:
  UlyssesBlockOptions options_;
  AttentionProjections projections_;
  std::shared_ptr<UlyssesAttention> attention_;
};

}  // namespace seqpar::nn
