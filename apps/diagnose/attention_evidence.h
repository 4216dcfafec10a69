// What a run's saved attention tensors show about the Ulysses mistakes (docs/ulysses.md,
// "Can seqpar-diagnose see them from saved tensors?").
//
// The mistakes of sequence-parallel attention (no all-to-all, RoPE positions restarting
// at 0 on every shard, a causal mask on shard-local indices) leave the ranks' parameters
// bitwise equal: only a one-rank run's attention can tell them. When the ranks and the
// baseline saved the attention's output as `attention` (and, optionally, its inputs
// after RoPE as `attention.query` and `attention.key`), the ranks' rows, stacked in rank
// order, are the baseline's rows (world rank w = dp_rank * sp + sp_rank holds the w-th
// block of S/sp rows), and each block is compared with the baseline's, by sequence shard.
// A tensor's first dimension is its tokens; the others are read as one row.
//
// The signatures, from which shards differ (a causal token t of shard r attends to keys
// 0..t, all of them in shards 0..r):
//   - every shard within rounding: the attention is one-rank attention;
//   - shard 0 within rounding, a later shard not: what shard 0 computes alone (its own
//     keys, positions 0..S/P-1) is right, what needs other shards is not: keys lost
//     across shards (no all-to-all) or positions restarting at 0 per shard. Which shards
//     differ cannot tell those two apart: with the query and key saved it can, since wrong
//     positions change q and k of the later shards, lost keys leave them equal;
//   - the output's rows are the baseline's with whole head blocks (D columns) in another
//     order, the same on every row: the heads were put back in the wrong order after the
//     second all-to-all. Only a permutation does that, so this is told apart (and fixed);
//   - the rows are the baseline's, whole blocks of them in another order: the ranks' rows
//     are not the contiguous blocks of the sequence in rank order. Context parallelism's
//     zigzag layout (rank r holds chunks r and 2C-1-r) gives exactly that with right
//     numbers, and so do files whose rank numbers do not follow the sequence: the output
//     may be right, so this is a note, never a mistake. Zigzag rows (told by the output,
//     or by q's and k's norms: context_parallel_evidence.h) are then read in global
//     order, by zigzag chunk;
//   - shard 0 differs: the attention itself differs where no other shard is involved: a
//     mask on shard-local indices shows shard 0 the future keys of later shards, a wrong
//     softmax scale (1/D for 1/sqrt(D)) changes every weight, or another bug. These are
//     not told apart, and no fix is printed: the report says what would tell them apart.
//     One row helps: each sequence's first token attends to itself alone, so its output
//     is its own v whatever the scale or temperature, while a shard-local mask shows it
//     keys of later shards (first_rows_match);
//   - q or k differ on shard 0 as well: the attention's inputs are not the baseline's at
//     all (another batch, other parameters): no attention signature is drawn;
//   - with sp 1 there are no shards: a difference is only named as one.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/diagnose/inputs.h"
#include "apps/diagnose/precision.h"

namespace seqpar::diagnose {

// The names read as attention tensors rather than parameters. `output` (the block's
// output in seqpar-repro's ulysses dumps) is read and not compared.
bool is_activation_name(const std::string& name);
extern const char* const kAttentionOutput;  // "attention"
extern const char* const kAttentionQuery;   // "attention.query"
extern const char* const kAttentionKey;     // "attention.key"

// A difference within `tolerance` of the shard's largest baseline value is rounding:
// attention_tolerance() derives it from the run's precision and the keys a query
// attends to (precision.h: 2 sqrt(S) u). Every mistake above moves a shard by ~0.3 or
// more of it at seqpar-repro's sizes; a bf16 run of many thousand keys blurs the smaller
// ones, and the report says how wide the tolerance was.
double attention_tolerance(Precision precision, int64_t keys);

// One tensor's rows against the baseline's, per sequence shard (over every sequence).
struct ShardDifference {
  int64_t rows = 0, rows_unequal = 0;  // rows not bitwise equal
  double max_difference = 0;           // max |x - x_baseline|
  double largest = 0;                  // max |x_baseline|
  double tolerance = 0;                // relative; rounding up to it
  bool bitwise() const { return rows_unequal == 0; }
  double relative() const;  // max_difference / largest (inf when only the rank's is nonzero)
  bool beyond_rounding() const { return relative() > tolerance; }
};

struct TensorByShard {
  std::string name;
  std::vector<ShardDifference> shards;  // [sp]
  bool any_beyond(size_t first_shard) const;
};

// How the ranks saved their attention tensors (attention_layout.h):
// tokens first ([S/sp, ...]: seqpar-repro's, DeepSpeed's [s, b, h, d]), batch first
// ([b, S/sp, h*d]: Hugging Face's), or head-sharded inside the all-to-all ([S, H/sp*D]).
enum class AttentionLayout { TokensFirst, BatchFirst, HeadSharded };
std::string attention_layout_name(AttentionLayout layout);  // "tokens-first", "batch-first", "head-sharded"
std::optional<AttentionLayout> parse_attention_layout(const std::string& text);

enum class AttentionSignature {
  Matches,              // every shard within rounding
  KeysOrPositionsLost,  // shard 0 within rounding, a later shard not; q, k not saved
  PositionsWrong,       // ... and q or k differ on a later shard, not on shard 0
  KeysLost,             // ... and q, k within rounding everywhere
  FirstShardDiffers,    // shard 0's attention differs (q, k, if saved, agree there)
  HeadsPermuted,        // the rows are the baseline's with head blocks in another order
  RowsPermuted,         // the rows are the baseline's, blocks of them in another order
  InputsDiffer,         // q or k differ on shard 0: not an attention mistake
  Differs,              // sp 1: the attention differs, with no shards to tell a Ulysses mistake by
  NotFinite,            // inf or NaN in the tensors: nothing drawn
  PositionsNotZigzag    // q and k: the zigzag's tokens (their norms) at other positions (context_parallel_evidence.h)
};

// The gradients of the attention's inputs, when saved (context_parallel_evidence.h).
enum class BackwardSignature {
  NotSaved,              // no attention.query.grad, .key.grad or .value.grad on both sides
  NotJudged,             // the forward already differs
  Matches,               // every block within rounding
  Scaled,                // every gradient the same multiple of the baseline's, the direction right
  KeysValuesNotReduced,  // dQ right, dK or dV not: their reduction over the CP ranks is missing
  StaleKeysValues,       // dQ right on the first block, wrong later: the ring's backward used stale K/V
  KeysValuesPartial,     // dK, dV saved over the whole sequence: the ranks' differ, their sum is the baseline's
  Differs                // otherwise
};

struct BackwardFigures {
  // attention.query.grad, .key.grad, .value.grad (those saved), in global row order, by
  // block of rows (`blocks` per sequence: sp contiguous, 2 sp zigzag).
  std::vector<TensorByShard> gradients;
  std::vector<double> ratios;  // per gradient: ||g|| / ||g_baseline||
  int64_t blocks = 0, block_rows = 0;
  double tolerance = 0;
  double scale = 0;  // Scaled: the common ratio
  // dK or dV saved over the whole sequence on every rank (the gradient of the gathered K
  // or V), unlike the baseline's: their sum over the ranks is what was compared.
  bool partials = false;
  BackwardSignature signature = BackwardSignature::NotSaved;
};

struct AttentionFigures {
  int sp = 1;
  int64_t sequences = 1, rows_per_shard = 0;
  Precision precision = Precision::Float32;
  double tolerance = 0;  // attention_tolerance(precision, rows_per_shard * sp)
  AttentionLayout layout = AttentionLayout::TokensFirst;  // the ranks' tensors' layout
  TensorByShard output;
  std::vector<TensorByShard> inputs;  // attention.query, attention.key: those saved
  int64_t non_finite = 0;
  // Each sequence's first row (its first token: one key, weight 1) within rounding.
  bool first_rows_match = true;
  // With HeadsPermuted: the head count and, per output head block, the baseline's block
  // it holds.
  int64_t heads = 0;
  std::vector<int64_t> head_order;
  // With RowsPermuted: each sequence cut into `row_chunks` blocks of rows (sp: the ranks'
  // blocks; 2 sp: context parallelism's zigzag chunks), and per stacked block the
  // baseline's block it holds.
  int64_t row_chunks = 0;
  std::vector<int64_t> row_order;
  AttentionSignature signature = AttentionSignature::Matches;
  // Context parallelism: the ranks' rows hold the zigzag chunks (by the output's order, or
  // by q's and k's norms); with PositionsNotZigzag, whether exactly the chunks whose
  // zigzag place is their contiguous place agree (positions of contiguous blocks).
  bool zigzag = false, positions_not_zigzag = false, contiguous_positions = false;
  BackwardFigures backward;
};

// Whether the stacked rows are the baseline's, each sequence's `chunks` blocks of rows in
// one other order (the same in every sequence, within `tolerance` of the largest baseline
// value): the order (per stacked block, the baseline's block), or empty.
std::vector<int64_t> permuted_rows(const std::vector<float>& values, const std::vector<float>& baseline,
                                   int64_t width, int64_t sequence_rows, int64_t chunks, double tolerance);
// Rank r of a zigzag layout holds chunks r and 2C-1-r: the order of the ranks' chunks
// stacked in rank order (0, 2C-1, 1, 2C-2, ...).
std::vector<int64_t> zigzag_order(int64_t ranks);

// The smallest head count H >= 2 dividing `width` (heads of at least 2 values) for which every row of `values` is the
// baseline's row with its H blocks of width/H values in one other order (within
// `tolerance` of the largest baseline value); {0, {}} when there is none.
std::pair<int64_t, std::vector<int64_t>> permuted_heads(const std::vector<float>& values,
                                                        const std::vector<float>& baseline, int64_t width,
                                                        double tolerance);

// `values` and `baseline` hold the same rows of `width` values; row t is in shard
// (t / rows_per_shard) mod sp. `tolerance`: relative to a shard's largest value.
TensorByShard compare_by_shard(const std::string& name, const std::vector<float>& values,
                               const std::vector<float>& baseline, int64_t width, int64_t rows_per_shard, int sp,
                               double tolerance);
AttentionSignature classify(const AttentionFigures& figures);
// Whether the signature is one of the Ulysses mistakes (lost keys or positions, a mask
// on shard-local indices), which then explains a gradient that points elsewhere too.
bool names_a_mistake(AttentionSignature signature);
// ... or, with the gradients of the attention's inputs, a mistake of its backward.
bool explains_the_gradient(const AttentionFigures& figures);

// The ranks' attention against the baseline's, over sp x dp; nullopt when the ranks or
// the baseline did not save `attention`. InputError when the rows do not add up, or the
// shapes fit no layout or two (then `layout` must say which: --attention-layout).
std::optional<AttentionFigures> attention_figures(const RunFiles& run, int sp, int dp,
                                                 Precision precision = Precision::Float32,
                                                 std::optional<AttentionLayout> layout = std::nullopt);

// Why the attention could not be compared, for a sequence-parallel run ("" when it was,
// or when the run is not sequence-parallel).
std::string attention_not_checked(const RunFiles& run, int sp);

std::string signature_name(AttentionSignature signature);  // the pitfall, in a line
std::string signature_evidence(const AttentionFigures& figures);
void print_attention(std::ostream& out, const AttentionFigures& figures);
nlohmann::json attention_json(const std::optional<AttentionFigures>& figures);

}  // namespace seqpar::diagnose
