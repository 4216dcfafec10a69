// What a context-parallel run's saved attention tensors show about the CP mistakes
// (docs/context-parallel.md; apps/diagnose/README.md, "Context parallelism").
//
// Context parallelism (CP) keeps every head on every rank and splits the sequence: rank
// r holds the contiguous block r of S/C rows, or, zigzag, chunks r and 2C-1-r of
// S/(2C) rows. Its mistakes, against a one-rank run:
//   - positions that do not follow the zigzag permutation: the tokens are the zigzag
//     chunks, RoPE rotates them at the positions of contiguous blocks. RoPE rotates each
//     token's query and key, and a rotation keeps a row's norm: the ranks' q and k rows
//     have the norms of the baseline's rows in the zigzag order (the tokens are right)
//     but not their values (the rotations are not). Under contiguous positions the chunks
//     whose zigzag place is their contiguous place (chunk 0 always) are rotated right and
//     agree: that pattern names the cause, and gets the fix;
//   - the backward alone wrong: the forward's output agrees with one rank's, the
//     gradients of the attention's inputs (dQ, dK, dV on the rank's tokens, saved as
//     attention.query.grad, attention.key.grad, attention.value.grad) do not:
//       * every one of them the same multiple of the baseline's, the direction right: a
//         scale from the loss (normalized per rank: x C), the one mistake that scales
//         every gradient alike;
//       * dQ right everywhere, dK or dV not: dQ sums over keys, which every rank holds
//         (gathered, or visited), and needs no reduction; dK and dV sum over every
//         rank's queries and do. Their reduction over the CP ranks is missing (each rank
//         kept its own queries' part). Under a causal mask the last block's keys are
//         seen by their own rank's queries alone and stay right;
//       * dQ right on the first block of rows (their keys are all on their own rank) and
//         wrong on later ones: the backward computed with the wrong keys and values where
//         other ranks' blocks are involved: stale K/V in the ring's backward (the rank's
//         own saved block used instead of the visiting one);
//       * dK and dV saved over the whole sequence on every rank (the gradients of the
//         gathered K and V), differing, and summing over the ranks to the baseline's:
//         each rank's own queries' part, right before a reduction. Whether the step used
//         them unreduced only the weight gradients tell (compare_attention);
//       * otherwise the backward differs, with no cause told apart.
// The backward is judged only when the forward agrees (a wrong forward turns every
// gradient too). The gradients are compared in global row order (zigzag rows put back),
// by block of rows: the ranks' blocks (contiguous) or the 2C chunks (zigzag).
// Tolerances: precision.h. Each gradient of the attention's inputs sums S terms on top
// of the forward's S-term softmax: two S-term reductions, rounding_bound(u, 2S).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/diagnose/attention_evidence.h"
#include "apps/diagnose/diagnosis.h"

namespace seqpar::diagnose {

extern const char* const kQueryGradient;  // "attention.query.grad"
extern const char* const kKeyGradient;    // "attention.key.grad"
extern const char* const kValueGradient;  // "attention.value.grad"

// What two correct backward passes over S keys differ by, relative to a block's largest
// value (above).
double attention_gradient_tolerance(Precision precision, int64_t keys);

// The Euclidean norm of each row of `width` values.
std::vector<float> row_norms(const std::vector<float>& values, int64_t width);
// The stacked rows of `values` put back in global order: per sequence of `sequence_rows`
// rows, stacked block a (of sequence_rows / order.size() rows) goes to block order[a].
std::vector<float> to_global_order(const std::vector<float>& values, int64_t width, int64_t sequence_rows,
                                   const std::vector<int64_t>& order);

// The zigzag checks on the ranks' query and key (rows stacked in rank order, and the
// baseline's in global order), filled into `figures`: `zigzag` (the tokens are in the
// zigzag layout) and, when their rotations are not, PositionsNotZigzag with
// `contiguous_positions`.
void check_zigzag_positions(AttentionFigures& figures, const std::vector<std::pair<std::vector<float>,
                            std::vector<float>>>& query_key, int64_t width);

// One gradient of the attention's inputs: the ranks' rows stacked in rank order, and the
// baseline's, rows of `width` values (dK and dV narrower than dQ with fewer kv heads).
struct SavedGradient {
  std::string name;
  std::vector<float> values, baseline;
  int64_t width = 0;
  bool global_order = false;  // saved over the whole sequence, in position order: not reordered
  bool partial = false;       // the sum over the ranks of copies that differ from the baseline's
};

// dK or dV saved over the whole sequence on every rank (the baseline's shape: the gradient
// of the gathered K or V), nullopt when not. Every rank's copy within `tolerance` of the
// baseline's is reduced (rank 0's is compared); otherwise each holds a part, and their
// sum over the ranks is compared (`partial`).
std::optional<SavedGradient> whole_sequence_gradient(const RunFiles& run, const std::string& name,
                                                     double tolerance);

// The gradients of the attention's inputs against the baseline's.
BackwardFigures backward_figures(const AttentionFigures& figures, const std::vector<SavedGradient>& gradients);

std::string backward_name(BackwardSignature signature);  // the pitfall, in a line
bool backward_names_a_mistake(BackwardSignature signature);
// Scaled, by cp (sp) within rounding: the loss normalized per rank.
bool loss_normalized_per_rank(const AttentionFigures& figures);
// The cause a CP signature names (positions not following the zigzag, or the backward's).
Cause positions_cause(const AttentionFigures& figures);
Cause backward_cause(const AttentionFigures& figures);
void print_backward(std::ostream& out, const AttentionFigures& figures);
nlohmann::json backward_json(const AttentionFigures& figures);

}  // namespace seqpar::diagnose
