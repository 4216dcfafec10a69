#include "apps/diagnose/context_parallel_evidence.h"

#include <algorithm>
#include <cmath>

#include "apps/common/text.h"

namespace seqpar::diagnose {

const char* const kQueryGradient = "attention.query.grad";
const char* const kKeyGradient = "attention.key.grad";
const char* const kValueGradient = "attention.value.grad";

double attention_gradient_tolerance(Precision precision, int64_t keys) {
  // dQ sums over the keys, dK and dV over the queries, each term built from the forward's
  // softmax weights, themselves an S-term reduction: two of them, rounded independently.
  return rounding_bound(precision, 2 * std::max<int64_t>(keys, 1));
}

std::vector<float> row_norms(const std::vector<float>& values, int64_t width) {
  std::vector<float> norms(values.size() / size_t(std::max<int64_t>(width, 1)));
  for (size_t t = 0; t < norms.size(); ++t) {
    double sum = 0;
    for (size_t i = t * size_t(width); i < (t + 1) * size_t(width); ++i) sum += double(values[i]) * values[i];
    norms[t] = float(std::sqrt(sum));
  }
  return norms;
}

std::vector<float> to_global_order(const std::vector<float>& values, int64_t width, int64_t sequence_rows,
                                   const std::vector<int64_t>& order) {
  std::vector<float> out(values.size());
  const int64_t chunks = int64_t(order.size()), block = sequence_rows / chunks * width;
  const int64_t sequences = int64_t(values.size()) / (sequence_rows * width);
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t base = s * sequence_rows * width;
    for (int64_t a = 0; a < chunks; ++a) {
      std::copy(values.begin() + base + a * block, values.begin() + base + (a + 1) * block,
                out.begin() + base + order[size_t(a)] * block);
    }
  }
  return out;
}

namespace {

double norm_of(const std::vector<float>& values) {
  double sum = 0;
  for (float value : values) sum += double(value) * value;
  return std::sqrt(sum);
}

// Stacked block a of every sequence against the baseline's block b, within `allowed`.
bool block_agrees(const std::vector<float>& values, const std::vector<float>& baseline, int64_t width,
                  int64_t sequence_rows, int64_t chunks, int64_t a, int64_t b, double allowed) {
  const int64_t block = sequence_rows / chunks * width, sequences = int64_t(values.size()) / (sequence_rows * width);
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t base = s * sequence_rows * width;
    for (int64_t i = 0; i < block; ++i) {
      if (std::fabs(double(values[size_t(base + a * block + i)]) - baseline[size_t(base + b * block + i)]) > allowed) {
        return false;
      }
    }
  }
  return true;
}

double largest_of(const std::vector<float>& values) {
  double largest = 0;
  for (float value : values) largest = std::fmax(largest, std::fabs(double(value)));
  return largest;
}

}  // namespace

void check_zigzag_positions(AttentionFigures& f,
                            const std::vector<std::pair<std::vector<float>, std::vector<float>>>& query_key,
                            int64_t width) {
  const int64_t sequence_rows = f.rows_per_shard * f.sp, chunks = 2 * int64_t(f.sp);
  if (f.sp < 2 || query_key.empty() || sequence_rows % chunks != 0 || f.non_finite > 0) return;
  const std::vector<int64_t> zigzag = zigzag_order(f.sp);
  // A row's norm is a sum of `width` squares: its rounding, relative to the largest norm.
  const double norm_tolerance = rounding_bound(f.precision, width);
  bool tokens = true, rotations = true;
  for (const auto& [values, baseline] : query_key) {
    tokens = tokens && permuted_rows(row_norms(values, width), row_norms(baseline, width), 1, sequence_rows, chunks,
                                     norm_tolerance) == zigzag;
    rotations = rotations && permuted_rows(values, baseline, width, sequence_rows, chunks, f.tolerance) == zigzag;
  }
  if (!tokens) return;
  f.zigzag = true;
  if (rotations) return;
  f.positions_not_zigzag = true;
  // Positions of contiguous blocks give stacked block a the positions of chunk a: right
  // exactly where the zigzag put chunk a there.
  bool right_where_placed = true, wrong_elsewhere = false;
  for (const auto& [values, baseline] : query_key) {
    const double allowed = f.tolerance * largest_of(baseline);
    for (int64_t a = 0; a < chunks; ++a) {
      const bool agrees = block_agrees(values, baseline, width, sequence_rows, chunks, a, zigzag[size_t(a)], allowed);
      if (zigzag[size_t(a)] == a) right_where_placed = right_where_placed && agrees;
      else wrong_elsewhere = wrong_elsewhere || !agrees;
    }
  }
  f.contiguous_positions = right_where_placed && wrong_elsewhere;
}

std::optional<SavedGradient> whole_sequence_gradient(const RunFiles& run, const std::string& name,
                                                     double tolerance) {
  const StoredTensor* baseline = run.baseline ? run.baseline->activations.find(name) : nullptr;
  if (!baseline || run.ranks.size() < 2 || baseline->shape.empty()) return std::nullopt;
  for (const RankState& rank : run.ranks) {
    const StoredTensor* own = rank.activations.find(name);
    if (!own || own->shape != baseline->shape) return std::nullopt;
  }
  SavedGradient g{name, run.ranks[0].activations.find(name)->values, baseline->values, 1, true, false};
  for (size_t d = 1; d < baseline->shape.size(); ++d) g.width *= baseline->shape[d];
  const double allowed = tolerance * largest_of(baseline->values);
  bool reduced = true;
  for (const RankState& rank : run.ranks) {
    const std::vector<float>& own = rank.activations.find(name)->values;
    for (size_t i = 0; i < own.size() && reduced; ++i) reduced = std::fabs(double(own[i]) - g.baseline[i]) <= allowed;
  }
  if (reduced) return g;
  // Each rank's part: the reduction the backward owes is their sum, in double and rounded once.
  std::vector<double> sum(g.baseline.size(), 0.0);
  for (const RankState& rank : run.ranks) {
    const std::vector<float>& own = rank.activations.find(name)->values;
    for (size_t i = 0; i < own.size(); ++i) sum[i] += own[i];
  }
  g.values.assign(sum.begin(), sum.end());
  g.partial = true;
  return g;
}

BackwardFigures backward_figures(const AttentionFigures& f, const std::vector<SavedGradient>& gradients) {
  BackwardFigures b;
  if (gradients.empty()) return b;
  const bool forward_right =
      f.signature == AttentionSignature::Matches || (f.signature == AttentionSignature::RowsPermuted && f.zigzag);
  if (!forward_right) {
    b.signature = BackwardSignature::NotJudged;
    return b;
  }
  const int64_t sequence_rows = f.rows_per_shard * f.sp;
  b.blocks = f.zigzag ? 2 * int64_t(f.sp) : int64_t(f.sp);
  b.block_rows = sequence_rows / b.blocks;
  b.tolerance = attention_gradient_tolerance(f.precision, sequence_rows);
  std::vector<std::vector<float>> global;
  bool query_saved = false;
  for (const auto& [name, values, baseline, width, in_order, partial] : gradients) {
    global.push_back(f.zigzag && !in_order ? to_global_order(values, width, sequence_rows, zigzag_order(f.sp))
                                           : values);
    b.partials = b.partials || partial;
    b.gradients.push_back(compare_by_shard(name, global.back(), baseline, width, b.block_rows, int(b.blocks),
                                           b.tolerance));
    const double reference = norm_of(baseline);
    b.ratios.push_back(reference > 0 ? norm_of(values) / reference : 0.0);
    query_saved = query_saved || name == kQueryGradient;
  }
  bool any_beyond = false;
  for (const TensorByShard& g : b.gradients) any_beyond = any_beyond || g.any_beyond(0);
  if (!any_beyond) {
    // Summed, the parts are one rank's: right before the reduction; whether the step used
    // them reduced, the weight gradients tell (compare_attention).
    b.signature = b.partials ? BackwardSignature::KeysValuesPartial : BackwardSignature::Matches;
    return b;
  }
  // One multiple of every gradient, and with it taken out every block within rounding.
  const double ratio = b.ratios[0];
  bool scaled = ratio > 0 && std::fabs(ratio - 1) > b.tolerance;
  for (size_t i = 0; i < gradients.size() && scaled; ++i) {
    scaled = std::fabs(b.ratios[i] / ratio - 1) <= b.tolerance;
    std::vector<float> unscaled = global[i];
    for (float& value : unscaled) value = float(value / ratio);
    scaled = scaled && !compare_by_shard("", unscaled, gradients[i].baseline, gradients[i].width, b.block_rows,
                                         int(b.blocks), b.tolerance).any_beyond(0);
  }
  if (scaled) {
    b.scale = ratio;
    b.signature = BackwardSignature::Scaled;
    return b;
  }
  const TensorByShard* query = nullptr;
  bool keys_values_differ = false;
  for (const TensorByShard& g : b.gradients) {
    if (g.name == kQueryGradient) query = &g;
    else keys_values_differ = keys_values_differ || g.any_beyond(0);
  }
  if (query_saved && !query->any_beyond(0) && keys_values_differ) {
    b.signature = BackwardSignature::KeysValuesNotReduced;
  } else if (query_saved && !query->shards[0].beyond_rounding() && query->any_beyond(1)) {
    b.signature = BackwardSignature::StaleKeysValues;
  } else {
    b.signature = BackwardSignature::Differs;
  }
  return b;
}

std::string backward_name(BackwardSignature signature) {
  switch (signature) {
    case BackwardSignature::NotSaved: return "the gradients of the attention's inputs were not saved";
    case BackwardSignature::NotJudged:
      return "the gradients of the attention's inputs are not judged: the forward already differs";
    case BackwardSignature::Matches: return "the attention's backward matches one-rank training on every block";
    case BackwardSignature::Scaled:
      return "every gradient of the attention's inputs is one multiple of one-rank training's, its direction "
             "right: a scale from the loss, not the attention";
    case BackwardSignature::KeysValuesNotReduced:
      return "dK and dV not reduced across the context-parallel ranks: dQ is right everywhere, the keys' and "
             "values' gradients hold only part of their sums over the queries";
    case BackwardSignature::StaleKeysValues:
      return "stale K/V in the ring's backward: the forward is right, dQ is right where a query's keys are all on "
             "its own rank and wrong where other ranks' blocks are involved";
    case BackwardSignature::Differs:
      return "the attention's backward differs from one-rank training while its forward matches";
    case BackwardSignature::KeysValuesPartial:
      return "dK and dV not reduced across the context-parallel ranks: saved over the whole sequence, each rank's "
             "holds its own queries' part, and their sum over the ranks is one-rank training's";
  }
  return "?";
}

bool backward_names_a_mistake(BackwardSignature signature) {
  return signature == BackwardSignature::Scaled || signature == BackwardSignature::KeysValuesNotReduced ||
         signature == BackwardSignature::KeysValuesPartial ||
         signature == BackwardSignature::StaleKeysValues || signature == BackwardSignature::Differs;
}

bool loss_normalized_per_rank(const AttentionFigures& f) {
  return f.backward.signature == BackwardSignature::Scaled &&
         std::fabs(f.backward.scale / f.sp - 1) <= f.backward.tolerance;
}

namespace {

// The scenario that shows a cause beside one-rank training, and its variants.
std::string reproduce(const char* variants) {
  return std::string("seqpar-repro --scenario context-parallel (") + variants + ")";
}

// "block 0 bitwise equal, block 1 up to 0.31 (relative 0.4), ..."
std::string blocks_text(const TensorByShard& t) {
  std::string text;
  for (size_t r = 0; r < t.shards.size(); ++r) {
    if (r == 4 && t.shards.size() > 5) {
      text += ", ... (" + std::to_string(t.shards.size() - 4) + " more blocks)";
      break;
    }
    const ShardDifference& s = t.shards[r];
    text += (r ? ", " : "") + std::string("block ") + std::to_string(r) + " " +
            (s.bitwise() ? "bitwise equal"
                         : "up to " + number_text(s.max_difference) + " (relative " + number_text(s.relative()) +
                               (s.beyond_rounding() ? ")" : ": rounding)"));
  }
  return text;
}

std::string backward_evidence(const BackwardFigures& b, int sp, bool zigzag) {
  std::string text = std::string(b.partials ? "dK and dV summed over the ranks; " : "") +
                     "the forward matches; against the baseline's, in global row order by " +
                     std::string(zigzag ? "zigzag chunk" : "rank's block") + " of " + std::to_string(b.block_rows) +
                     " rows (cp " + std::to_string(sp) + "; rounding up to " + number_text(b.tolerance) + "): ";
  for (size_t i = 0; i < b.gradients.size(); ++i) {
    const TensorByShard& g = b.gradients[i];
    double largest = 0;
    for (const ShardDifference& s : g.shards) largest = std::fmax(largest, s.relative());
    text += (i ? "; " : "") + g.name + " " +
            (g.any_beyond(0) ? blocks_text(g) : "within rounding on every block (relative up to " +
                                                    number_text(largest) + ")") +
            " (" + number_text(b.ratios[i]) + "x its norm)";
  }
  return text;
}

}  // namespace

Cause positions_cause(const AttentionFigures& f) {
  const std::string name = "positions not following the zigzag permutation: the ranks hold the zigzag chunks "
                           "(rank r: chunks r and 2C-1-r), RoPE rotated them at other positions";
  std::string evidence = "the ranks' attention.query and attention.key rows, stacked in rank order, have the norms "
                         "of the baseline's rows in the zigzag order (" + std::to_string(2 * f.sp) +
                         " chunks; a rotation keeps a row's norm, so the tokens are right) but not their values";
  const std::string fix = "rotate (and mask) each token at its global position under the zigzag permutation: rank "
                          "r's rows at r*k .. (r+1)*k - 1, then (2C-1-r)*k .. (2C-r)*k - 1, k = S/(2C)";
  if (f.contiguous_positions) {
    evidence += "; exactly the chunks whose zigzag place is their contiguous place (chunk 0 always) agree: each "
                "rank's rows were rotated at the positions of the contiguous block r*S/C .. (r+1)*S/C - 1";
    return {name, evidence, fix, reproduce("variant unpermuted-positions")};
  }
  return {name, evidence, "", reproduce("variant unpermuted-positions"),
          "print the position ids each rank passes to RoPE: they should be its zigzag chunks' global positions; "
          "chunk 0 disagreeing too points at the rotation itself (its base, its pairing of features)"};
}

Cause backward_cause(const AttentionFigures& f) {
  const BackwardFigures& b = f.backward;
  const std::string name = backward_name(b.signature), evidence = backward_evidence(b, f.sp, f.zigzag);
  switch (b.signature) {
    case BackwardSignature::Scaled: {
      std::string ratios;
      for (size_t i = 0; i < b.gradients.size(); ++i) {
        ratios += (i ? ", " : "") + b.gradients[i].name + " " + number_text(b.ratios[i]) + "x";
      }
      const std::string scaled = "the forward matches; the gradients of the attention's inputs are " + ratios +
                                 " the baseline's norms, and divided by " + number_text(b.scale) + " every " +
                                 (f.zigzag ? "zigzag chunk" : "rank's block") + " is within rounding (" +
                                 number_text(b.tolerance) + ") of the baseline's";
      if (loss_normalized_per_rank(f)) {
        return {"the loss normalized per rank: each CP rank divided its loss by its own S/C tokens and the ranks' "
                "gradients were summed, so every gradient is cp (" + std::to_string(f.sp) + ") times one-rank "
                "training's (and a loss reported as the ranks' sum is cp times too large)",
                scaled,
                "divide each rank's loss sum by the token count of the whole sequence (every CP rank's tokens), "
                "or average the gradients over the CP ranks instead of summing",
                reproduce("variant loss-per-rank")};
      }
      return {name, scaled, "",
              reproduce("variant loss-per-rank"),
              "compare the loss's normalization (the token count it divides by) and the gradients' reduction (sum or "
              "mean, over which ranks) with one-rank training's"};
    }
    case BackwardSignature::KeysValuesPartial:
      return {name, evidence,
              "sum dK and dV over the CP ranks before the key and value projections' backward (the reduce-scatter "
              "that is the all-gather's backward, or the ring's dK and dV carried back to their owner)",
              reproduce("variant dkv-not-reduced")};
    case BackwardSignature::KeysValuesNotReduced: {
      bool last_right = true;
      for (const TensorByShard& g : b.gradients) last_right = last_right && !g.shards.back().beyond_rounding();
      return {name, evidence + (last_right ? "; the last block's keys, which under a causal mask only their own "
                                             "rank's queries see, are right" : ""),
              "sum dK and dV over the CP ranks before the key and value projections' backward (the reduce-scatter "
              "that is the all-gather's backward, or the ring's dK and dV carried back to their owner)",
              reproduce("variant dkv-not-reduced")};
    }
    case BackwardSignature::StaleKeysValues:
      return {name, evidence + "; the first block's queries attend to their own rank's keys alone",
              "in the ring's backward compute each hop with the K and V block received at that hop (the block whose "
              "dK and dV are being accumulated), not the rank's own K and V saved by the forward",
              reproduce("variant stale-kv")};
    case BackwardSignature::Differs:
      return {name, evidence, "", reproduce("variants stale-kv, dkv-not-reduced"),
              std::string(b.gradients.size() < 3 ? "save attention.query.grad, attention.key.grad and "
                                                   "attention.value.grad (dQ, dK, dV on the rank's tokens) on the "
                                                   "ranks and the baseline: " : "") +
                  "dQ right and dK, dV wrong is their missing reduction; dQ right on the first block alone is "
                  "stale K/V in the ring's backward"};
    default: return {};
  }
}

void print_backward(std::ostream& out, const AttentionFigures& f) {
  const BackwardFigures& b = f.backward;
  if (b.gradients.empty()) return;
  out << "  the attention's input gradients against the baseline, by " << (f.zigzag ? "zigzag chunk" : "block")
      << " of " << b.block_rows << " rows in global order (rounding up to " << number_text(b.tolerance)
      << ", 2 sqrt(2S) u):\n";
  for (size_t i = 0; i < b.gradients.size(); ++i) {
    const TensorByShard& t = b.gradients[i];
    out << "    " << t.name << " (" << number_text(b.ratios[i]) << "x the norm):";
    for (size_t r = 0; r < t.shards.size(); ++r) {
      const ShardDifference& s = t.shards[r];
      out << (r == 0 ? " " : r % 4 == 0 ? ",\n      " : ", ") << "[" << r << "] "
          << (s.bitwise() ? "bitwise" : number_text(s.max_difference) + " (" + number_text(s.relative()) + ")");
    }
    out << '\n';
  }
}

nlohmann::json backward_json(const AttentionFigures& f) {
  const BackwardFigures& b = f.backward;
  static const char* const keys[] = {"not-saved", "not-judged", "matches", "scaled", "keys-values-not-reduced",
                                     "stale-keys-values", "keys-values-partial", "differs"};
  nlohmann::json gradients = nlohmann::json::array();
  for (size_t i = 0; i < b.gradients.size(); ++i) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const ShardDifference& s : b.gradients[i].shards) {
      const double relative = s.relative();
      blocks.push_back({{"bitwise", s.bitwise()}, {"max_difference", s.max_difference},
                        {"relative", std::isfinite(relative) ? nlohmann::json(relative) : nlohmann::json(nullptr)},
                        {"beyond_rounding", s.beyond_rounding()}});
    }
    gradients.push_back({{"name", b.gradients[i].name}, {"ratio", b.ratios[i]}, {"blocks", blocks}});
  }
  return {{"signature", keys[int(b.signature)]}, {"signature_text", backward_name(b.signature)},
          {"partials", b.partials},
          {"blocks", b.blocks}, {"block_rows", b.block_rows}, {"tolerance", b.tolerance},
          {"scale", b.scale}, {"gradients", gradients}};
}

}  // namespace seqpar::diagnose
