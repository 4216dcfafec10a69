#include "apps/diagnose/attention_evidence.h"

#include "apps/diagnose/attention_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>

#include "apps/common/text.h"
#include "apps/diagnose/context_parallel_evidence.h"
#include "apps/diagnose/diagnosis.h"
#include "core/error.h"

namespace seqpar::diagnose {

const char* const kAttentionOutput = "attention";
const char* const kAttentionQuery = "attention.query";
const char* const kAttentionKey = "attention.key";

bool is_activation_name(const std::string& name) {
  return name == kAttentionOutput || name == kAttentionQuery || name == kAttentionKey || name == kQueryGradient ||
         name == kKeyGradient || name == kValueGradient || name == "output";
}

double attention_tolerance(Precision precision, int64_t keys) {
  // The output of query t is a softmax-weighted sum over its keys, and the softmax's
  // denominator a sum over the same keys: the longest reductions on its path, S terms.
  // The scores' sums over the head dimension are shorter and not counted apart.
  return rounding_bound(precision, std::max<int64_t>(keys, 1));
}

double ShardDifference::relative() const {
  if (largest > 0) return max_difference / largest;
  return max_difference > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

bool TensorByShard::any_beyond(size_t first_shard) const {
  for (size_t r = first_shard; r < shards.size(); ++r) {
    if (shards[r].beyond_rounding()) return true;
  }
  return false;
}

TensorByShard compare_by_shard(const std::string& name, const std::vector<float>& values,
                               const std::vector<float>& baseline, int64_t width, int64_t rows_per_shard, int sp,
                               double tolerance) {
  SEQPAR_CHECK(values.size() == baseline.size() && width > 0 && rows_per_shard > 0 && sp > 0,
               "compare_by_shard: mismatched sizes");
  TensorByShard out{name, std::vector<ShardDifference>(size_t(sp))};
  for (ShardDifference& shard : out.shards) shard.tolerance = tolerance;
  const int64_t rows = int64_t(values.size()) / width;
  for (int64_t t = 0; t < rows; ++t) {
    ShardDifference& shard = out.shards[size_t((t / rows_per_shard) % sp)];
    bool unequal = false;
    for (size_t i = size_t(t * width); i < size_t((t + 1) * width); ++i) {
      unequal |= std::memcmp(&values[i], &baseline[i], sizeof(float)) != 0;
      shard.max_difference = std::fmax(shard.max_difference, std::fabs(double(values[i]) - baseline[i]));
      shard.largest = std::fmax(shard.largest, std::fabs(double(baseline[i])));
    }
    ++shard.rows;
    shard.rows_unequal += unequal;
  }
  return out;
}

AttentionSignature classify(const AttentionFigures& f) {
  if (f.non_finite > 0) return AttentionSignature::NotFinite;
  if (f.positions_not_zigzag) return AttentionSignature::PositionsNotZigzag;
  bool inputs_first = false, inputs_later = false;
  for (const TensorByShard& input : f.inputs) {
    inputs_first |= input.shards[0].beyond_rounding();
    inputs_later |= input.any_beyond(1);
  }
  // Rows in another order move q and k with them: checked before the inputs.
  if (f.row_chunks > 0) return AttentionSignature::RowsPermuted;
  if (inputs_first) return AttentionSignature::InputsDiffer;
  if (f.heads > 0) return AttentionSignature::HeadsPermuted;
  if (f.sp == 1) return f.output.any_beyond(0) ? AttentionSignature::Differs : AttentionSignature::Matches;
  if (f.output.shards[0].beyond_rounding()) return AttentionSignature::FirstShardDiffers;
  if (!f.output.any_beyond(1)) return AttentionSignature::Matches;
  if (f.inputs.empty()) return AttentionSignature::KeysOrPositionsLost;
  return inputs_later ? AttentionSignature::PositionsWrong : AttentionSignature::KeysLost;
}

std::vector<int64_t> zigzag_order(int64_t ranks) {
  std::vector<int64_t> order;
  for (int64_t r = 0; r < ranks; ++r) {
    order.push_back(r);
    order.push_back(2 * ranks - 1 - r);
  }
  return order;
}

std::vector<int64_t> permuted_rows(const std::vector<float>& values, const std::vector<float>& baseline,
                                   int64_t width, int64_t sequence_rows, int64_t chunks, double tolerance) {
  if (width <= 0 || chunks < 2 || sequence_rows % chunks != 0 || values.size() != baseline.size() ||
      values.empty() || int64_t(values.size()) % (sequence_rows * width) != 0) {
    return {};
  }
  double largest = 0;
  for (float value : baseline) largest = std::fmax(largest, std::fabs(double(value)));
  const double allowed = tolerance * largest;
  const int64_t block = sequence_rows / chunks * width, sequences = int64_t(values.size()) / (sequence_rows * width);
  const auto same = [&](int64_t a, int64_t b) {  // stacked block a against the baseline's block b, every sequence
    for (int64_t s = 0; s < sequences; ++s) {
      const size_t at = size_t(s * sequence_rows * width + a * block), from = size_t(s * sequence_rows * width + b * block);
      for (int64_t i = 0; i < block; ++i) {
        if (std::fabs(double(values[at + size_t(i)]) - baseline[from + size_t(i)]) > allowed) return false;
      }
    }
    return true;
  };
  std::vector<int64_t> order(size_t(chunks), -1);
  std::vector<bool> taken(size_t(chunks), false);
  bool identity = true;
  for (int64_t a = 0; a < chunks; ++a) {
    for (int64_t b = 0; b < chunks && order[size_t(a)] < 0; ++b) {
      if (taken[size_t(b)] || !same(a, b)) continue;
      order[size_t(a)] = b;
      taken[size_t(b)] = true;
      identity = identity && a == b;
    }
    if (order[size_t(a)] < 0) return {};
  }
  return identity ? std::vector<int64_t>{} : order;
}

std::pair<int64_t, std::vector<int64_t>> permuted_heads(const std::vector<float>& values,
                                                        const std::vector<float>& baseline, int64_t width,
                                                        double tolerance) {
  if (width <= 0 || values.size() != baseline.size() || values.empty()) return {0, {}};
  double largest = 0;
  for (float value : baseline) largest = std::fmax(largest, std::fabs(double(value)));
  const double allowed = tolerance * largest;
  const int64_t rows = int64_t(values.size()) / width;
  // A head has at least two features (RoPE rotates pairs): blocks of one are not tried.
  for (int64_t heads = 2; heads <= width / 2; ++heads) {
    if (width % heads != 0) continue;
    const int64_t dim = width / heads;
    // Block a of every row against block b of the same row.
    const auto same = [&](int64_t a, int64_t b) {
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t i = 0; i < dim; ++i) {
          const size_t at = size_t(t * width + a * dim + i), from = size_t(t * width + b * dim + i);
          if (std::fabs(double(values[at]) - baseline[from]) > allowed) return false;
        }
      }
      return true;
    };
    std::vector<int64_t> order(size_t(heads), -1);
    std::vector<bool> taken(size_t(heads), false);
    bool complete = true, identity = true;
    for (int64_t a = 0; a < heads && complete; ++a) {
      for (int64_t b = 0; b < heads; ++b) {
        if (taken[size_t(b)] || !same(a, b)) continue;
        order[size_t(a)] = b;
        taken[size_t(b)] = true;
        identity = identity && a == b;
        break;
      }
      complete = order[size_t(a)] >= 0;
    }
    if (complete && !identity) return {heads, order};
  }
  return {0, {}};
}

namespace {

int64_t non_finite_in(const std::vector<float>& values) {
  int64_t count = 0;
  for (float value : values) count += !std::isfinite(value);
  return count;
}

}  // namespace

std::optional<AttentionFigures> attention_figures(const RunFiles& run, int sp, int dp, Precision precision,
                                                  std::optional<AttentionLayout> hint) {
  const StoredTensor* baseline = run.baseline ? run.baseline->activations.find(kAttentionOutput) : nullptr;
  if (!baseline || !run.ranks[0].activations.find(kAttentionOutput)) return std::nullopt;
  AttentionFigures f;
  f.sp = std::max(sp, 1);
  f.sequences = std::max(dp, 1);
  const int64_t blocks = int64_t(f.sp) * f.sequences;
  SEQPAR_INPUT_CHECK(!baseline->values.empty(), "--baseline: '", kAttentionOutput, "' has shape ",
                     shape_text(baseline->shape), ": no values to compare");
  const AttentionRows output = gathered_rows(run, kAttentionOutput, *baseline, f.sp, int(f.sequences), hint);
  f.layout = output.layout;
  SEQPAR_INPUT_CHECK(output.rows % blocks == 0, "--baseline: '", kAttentionOutput, "' has shape ",
                     shape_text(baseline->shape), "; its ", output.rows, " rows (tokens) do not split into sp ",
                     f.sp, " x dp ", f.sequences, " blocks");
  f.rows_per_shard = output.rows / blocks;
  f.precision = precision;
  f.tolerance = attention_tolerance(precision, f.rows_per_shard * f.sp);
  SEQPAR_INPUT_CHECK(f.rows_per_shard > 0 && output.width > 0, "--baseline: '", kAttentionOutput,
                     "' has shape ", shape_text(baseline->shape), ": no values to compare");
  const auto compare = [&](const std::string& name, const AttentionRows& rows) {
    SEQPAR_INPUT_CHECK(rows.values.size() == rows.baseline.size(), "'", name, "': the ranks' rows add up to ",
                       int64_t(rows.values.size()) / rows.width, ", the baseline's are ", rows.rows,
                       ": every rank's file, and the baseline of the same sequences, are needed");
    f.non_finite += non_finite_in(rows.values) + non_finite_in(rows.baseline);
    return compare_by_shard(name, rows.values, rows.baseline, rows.width, f.rows_per_shard, f.sp, f.tolerance);
  };
  f.output = compare(kAttentionOutput, output);
  std::vector<std::pair<std::string, AttentionRows>> inputs;
  for (const char* name : {kAttentionQuery, kAttentionKey}) {
    const StoredTensor* reference = run.baseline->activations.find(name);
    if (reference && run.ranks[0].activations.find(name)) {
      inputs.emplace_back(name, gathered_rows(run, name, *reference, f.sp, int(f.sequences), hint));
      f.inputs.push_back(compare(name, inputs.back().second));
    }
  }
  if (f.output.any_beyond(0) && f.non_finite == 0) {
    std::tie(f.heads, f.head_order) = permuted_heads(output.values, output.baseline, output.width, f.tolerance);
    // The ranks' blocks out of order (sp blocks), or context parallelism's zigzag chunks.
    for (const int64_t chunks : {int64_t(f.sp), int64_t(2) * f.sp}) {
      if (f.sp < 2 || f.row_chunks > 0) break;
      f.row_order = permuted_rows(output.values, output.baseline, output.width, f.rows_per_shard * f.sp, chunks,
                                  f.tolerance);
      if (!f.row_order.empty()) f.row_chunks = chunks;
    }
    f.zigzag = f.row_chunks == 2 * f.sp && f.row_order == zigzag_order(f.sp);
    // The output moves with the positions; the query's and key's norms do not: zigzag
    // tokens are told by them when the output is not the baseline's in any order.
    std::vector<std::pair<std::vector<float>, std::vector<float>>> query_key;
    for (const auto& [name, rows] : inputs) {
      if (rows.width == inputs[0].second.width) query_key.emplace_back(rows.values, rows.baseline);
    }
    if (!f.zigzag && !query_key.empty()) check_zigzag_positions(f, query_key, inputs[0].second.width);
    if (f.zigzag && !f.positions_not_zigzag) {
      // Put back in global order and taken by zigzag chunk, the figures are the
      // attention's own, and a zigzag run's other mistakes show the signatures above:
      // chunk 0's queries, like a contiguous shard 0's, attend to their own rank's keys.
      const int64_t sequence_rows = f.rows_per_shard * f.sp;
      const auto global = [&](const std::string& name, const AttentionRows& rows) {
        return compare_by_shard(name, to_global_order(rows.values, rows.width, sequence_rows, zigzag_order(f.sp)),
                                rows.baseline, rows.width, f.rows_per_shard / 2, 2 * f.sp, f.tolerance);
      };
      f.output = global(kAttentionOutput, output);
      for (size_t i = 0; i < inputs.size(); ++i) f.inputs[i] = global(inputs[i].first, inputs[i].second);
    }
    // Each sequence's first row: one key, whatever the softmax's scale.
    const int64_t length = f.rows_per_shard * f.sp;
    double largest = 0;
    for (float value : output.baseline) largest = std::fmax(largest, std::fabs(double(value)));
    for (int64_t first = 0; first < output.rows; first += length) {
      for (int64_t i = 0; i < output.width; ++i) {
        const size_t at = size_t(first * output.width + i);
        f.first_rows_match = f.first_rows_match &&
                             std::fabs(double(output.values[at]) - output.baseline[at]) <= f.tolerance * largest;
      }
    }
  }
  f.signature = classify(f);
  std::vector<SavedGradient> gradients;
  for (const char* name : {kQueryGradient, kKeyGradient, kValueGradient}) {
    const StoredTensor* reference = run.baseline->activations.find(name);
    if (!reference || !run.ranks[0].activations.find(name)) continue;
    // dK and dV may be the gathered K's and V's gradients, over the whole sequence.
    if (name != kQueryGradient) {
      if (std::optional<SavedGradient> whole = whole_sequence_gradient(
              run, name, attention_gradient_tolerance(precision, f.rows_per_shard * f.sp))) {
        f.non_finite += non_finite_in(whole->values) + non_finite_in(whole->baseline);
        gradients.push_back(std::move(*whole));
        continue;
      }
    }
    AttentionRows rows = gathered_rows(run, name, *reference, f.sp, int(f.sequences), hint);
    SEQPAR_INPUT_CHECK(rows.values.size() == rows.baseline.size() && rows.rows == output.rows, "'", name,
                       "': the ranks' rows do not add up to the baseline's ", output.rows,
                       " tokens (dQ, dK and dV saved as the query and key are)");
    f.non_finite += non_finite_in(rows.values) + non_finite_in(rows.baseline);
    gradients.push_back({name, std::move(rows.values), std::move(rows.baseline), rows.width, false, false});
  }
  if (f.non_finite > 0) f.signature = AttentionSignature::NotFinite;
  f.backward = backward_figures(f, gradients);
  return f;
}

std::string attention_not_checked(const RunFiles& run, int sp) {
  const bool ranks_have = run.ranks[0].activations.find(kAttentionOutput) != nullptr;
  const bool baseline_has = run.baseline && run.baseline->activations.find(kAttentionOutput);
  if (sp <= 1 || (ranks_have && baseline_has)) return "";
  if (ranks_have) {
    return "the ranks saved 'attention', but " + std::string(run.baseline ? "the baseline did not" : "no --baseline "
           "was given") + ": save the one-rank run's attention output as 'attention' too";
  }
  return "Ulysses' attention mistakes cannot be seen from parameters alone: save 'attention' on every rank and in "
         "the baseline";
}

std::string signature_name(AttentionSignature signature) {
  switch (signature) {
    case AttentionSignature::Matches: return "the attention matches one-rank attention on every shard";
    case AttentionSignature::KeysOrPositionsLost:
      return "keys or positions lost across shards (no all-to-all, or RoPE positions restarting at 0 per shard)";
    case AttentionSignature::PositionsWrong:
      return "RoPE positions restarting at 0 on every shard: the query and key of later shards are rotated by "
             "shard-local positions";
    case AttentionSignature::KeysLost:
      return "keys lost across shards: each rank attended within its own shard (no all-to-all); its query and key "
             "(after RoPE) agree, so the positions are right";
    case AttentionSignature::FirstShardDiffers:
      return "the attention itself differs on the first shard, where no other shard is involved: a causal mask on "
             "shard-local indices, a wrong softmax scale, or another bug inside the attention";
    case AttentionSignature::RowsPermuted:
      return "the ranks' rows are the baseline's, in another order: not the sequence's contiguous blocks in rank "
             "order (context parallelism's zigzag layout, or files whose rank numbers do not follow the sequence)";
    case AttentionSignature::HeadsPermuted:
      return "the heads are in the wrong order after the second all-to-all: each row is the one-rank row with its "
             "head blocks permuted";
    case AttentionSignature::InputsDiffer:
      return "the attention's query or key differ on the first shard too: the runs did not feed attention the same "
             "inputs (batch, parameters), so no attention signature is drawn";
    case AttentionSignature::NotFinite: return "inf or NaN in the attention tensors: no signature is drawn";
    case AttentionSignature::PositionsNotZigzag:
      return "positions not following the zigzag permutation: the ranks hold the zigzag chunks, their query and "
             "key are rotated at other positions";
    case AttentionSignature::Differs:
      return "the attention differs from one-rank attention; with sp 1 there are no shards to draw a Ulysses "
             "signature from";
  }
  return "?";
}

namespace {

// "shard 0 bitwise equal, shard 1 up to 0.31 (relative 0.4), ..."
std::string shards_text(const TensorByShard& t) {
  std::string text;
  for (size_t r = 0; r < t.shards.size(); ++r) {
    if (r == 4 && t.shards.size() > 5) {
      text += ", ... (" + std::to_string(t.shards.size() - 4) + " more shards)";
      break;
    }
    const ShardDifference& s = t.shards[r];
    text += (r ? ", " : "") + std::string("shard ") + std::to_string(r) + " " +
            (s.bitwise() ? "bitwise equal"
                         : "up to " + number_text(s.max_difference) + " (relative " + number_text(s.relative()) +
                               (s.beyond_rounding() ? ")" : ": rounding)"));
  }
  return text;
}

}  // namespace

std::string signature_evidence(const AttentionFigures& f) {
  std::string text = "against the baseline's, per " +
                     (f.zigzag ? "zigzag chunk of " + std::to_string(f.rows_per_shard / 2) + " rows in global order"
                               : "sequence shard of " + std::to_string(f.rows_per_shard) + " rows") +
                     ": attention " + shards_text(f.output);
  for (const TensorByShard& input : f.inputs) text += "; " + input.name + " " + shards_text(input);
  return text;
}

void print_attention(std::ostream& out, const AttentionFigures& f) {
  out << "  attention (" << attention_layout_name(f.layout) << ") against the baseline, by "
      << (f.zigzag ? "zigzag chunk of " + std::to_string(f.rows_per_shard / 2) + " rows in global order"
                   : "sequence shard of " + std::to_string(f.rows_per_shard) + " rows")
      << (f.sequences > 1 ? ", over " + std::to_string(f.sequences) + " sequences" : "")
      << ":\n    [shard] max |difference| (relative: to the shard's largest value; rounding up to "
      << number_text(f.tolerance) << ", 2 sqrt(S) u in " << precision_name(f.precision) << ")\n";
  std::vector<const TensorByShard*> tensors = {&f.output};
  for (const TensorByShard& input : f.inputs) tensors.push_back(&input);
  for (const TensorByShard* t : tensors) {
    out << "    " << t->name << ":";
    for (size_t r = 0; r < t->shards.size(); ++r) {
      const ShardDifference& s = t->shards[r];
      out << (r == 0 ? " " : r % 4 == 0 ? ",\n      " : ", ") << "[" << r << "] "
          << (s.bitwise() ? "bitwise" : number_text(s.max_difference) + " (" + number_text(s.relative()) + ")");
    }
    out << '\n';
  }
  print_backward(out, f);
}

namespace {

const char* signature_key(AttentionSignature signature) {
  switch (signature) {
    case AttentionSignature::Matches: return "matches";
    case AttentionSignature::KeysOrPositionsLost: return "keys-or-positions-lost";
    case AttentionSignature::PositionsWrong: return "positions-wrong";
    case AttentionSignature::KeysLost: return "keys-lost";
    case AttentionSignature::FirstShardDiffers: return "first-shard-differs";
    case AttentionSignature::HeadsPermuted: return "heads-permuted";
    case AttentionSignature::RowsPermuted: return "rows-permuted";
    case AttentionSignature::InputsDiffer: return "inputs-differ";
    case AttentionSignature::NotFinite: return "not-finite";
    case AttentionSignature::PositionsNotZigzag: return "positions-not-zigzag";
    case AttentionSignature::Differs: return "differs";
  }
  return "?";
}

nlohmann::json shards_json(const TensorByShard& t) {
  nlohmann::json shards = nlohmann::json::array();
  for (const ShardDifference& s : t.shards) {
    const double relative = s.relative();
    shards.push_back({{"bitwise", s.bitwise()}, {"rows", s.rows}, {"rows_unequal", s.rows_unequal},
                      {"max_difference", s.max_difference},
                      {"relative", std::isfinite(relative) ? nlohmann::json(relative) : nlohmann::json(nullptr)},
                      {"beyond_rounding", s.beyond_rounding()}});
  }
  return {{"name", t.name}, {"shards", shards}};
}

}  // namespace

nlohmann::json attention_json(const std::optional<AttentionFigures>& f) {
  if (!f) return nullptr;
  nlohmann::json inputs = nlohmann::json::array();
  for (const TensorByShard& input : f->inputs) inputs.push_back(shards_json(input));
  return {{"signature", signature_key(f->signature)}, {"signature_text", signature_name(f->signature)},
          {"first_rows_match", f->first_rows_match}, {"heads", f->heads}, {"head_order", f->head_order},
          {"row_chunks", f->row_chunks}, {"row_order", f->row_order},
          {"sp", f->sp}, {"sequences", f->sequences}, {"rows_per_shard", f->rows_per_shard},
          {"precision", precision_name(f->precision)}, {"tolerance", f->tolerance},
          {"layout", attention_layout_name(f->layout)}, {"zigzag", f->zigzag},
          {"contiguous_positions", f->contiguous_positions}, {"backward", backward_json(*f)},
          {"non_finite", f->non_finite}, {"output", shards_json(f->output)}, {"inputs", inputs}};
}

}  // namespace seqpar::diagnose

// The hooks into the diagnosis (diagnosis.h).
namespace seqpar::diagnose {

namespace {

const char* const kAttentionCheck = "attention against one-rank training";

Cause attention_cause(const AttentionFigures& f) {
  // Zigzag rows are context parallelism's; contiguous ones may be Ulysses' or CP's.
  const std::string gather = "gather every rank's K and V (an all-gather, or a ring that visits every block) "
                             "before attending";
  const std::string exchange =
      f.zigzag ? gather
               : "exchange q, k and v to head shards before the attention and back after it (the all-to-alls of "
                 "DeepSpeed's DistributedAttention); under context parallelism, " + gather;
  const std::string positions = "give RoPE each token's global position r*S/P + i, before the exchange";
  const std::string scenario = "seqpar-repro --scenario ulysses (variant ";
  const std::string name = signature_name(f.signature), evidence = signature_evidence(f);
  switch (f.signature) {
    case AttentionSignature::KeysOrPositionsLost:
      // Two causes, one pattern of shards: no fix until the inputs tell which.
      return {name, evidence, "", "seqpar-repro --scenario ulysses (variants no-all-to-all, local-positions)",
              "save the attention's query and key after RoPE as attention.query and attention.key on the ranks and "
              "the baseline: wrong positions change them on later shards, lost keys leave them equal"};
    case AttentionSignature::PositionsWrong: return {name, evidence, positions, scenario + "local-positions)"};
    case AttentionSignature::KeysLost: return {name, evidence, exchange, scenario + "no-all-to-all)"};
    case AttentionSignature::HeadsPermuted: {
      std::string order;
      for (size_t a = 0; a < f.head_order.size() && a < 16; ++a) {
        order += (a ? ", " : "") + std::to_string(f.head_order[a]);
      }
      if (f.head_order.size() > 16) order += ", ...";
      return {name, evidence + "; with " + std::to_string(f.heads) + " head blocks per row, the ranks' blocks hold "
                  "the baseline's blocks " + order + " on every row",
              "after the second all-to-all, place the head blocks received from rank r at heads r*H/P .. "
              "(r+1)*H/P - 1 (concatenate them in source-rank order) before the output projection",
              "none (seqpar-repro has no variant of it)"};
    }
    case AttentionSignature::FirstShardDiffers: {
      const std::string first_row =
          f.first_rows_match
              ? "each sequence's first row (its first token, which attends to itself alone: weight 1 whatever the "
                "scale) is within rounding, as a wrong scale or softmax temperature leaves it and a shard-local "
                "mask would not"
              : "each sequence's first row (its first token, which attends to itself alone) differs too, as a "
                "shard-local mask makes it (it sees keys of later shards) and a wrong scale would not; so would "
                "other inputs";
      std::string tell = "check the softmax scale is 1/sqrt(D) (D the head dimension), and that the causal mask "
                         "is built on global indices after the exchange (token t attends to keys u <= t)";
      if (f.inputs.empty()) {
        tell += "; save attention.query and attention.key (after RoPE) to rule out other inputs (and, for zigzag "
                "context parallelism, to tell positions that do not follow the zigzag)";
      }
      return {name, evidence + "; " + first_row, "", scenario + "local-mask)", tell};
    }
    default: return {};
  }
}

}  // namespace

bool explains_the_gradient(const AttentionFigures& figures) {
  return names_a_mistake(figures.signature) || backward_names_a_mistake(figures.backward.signature);
}

bool names_a_mistake(AttentionSignature signature) {
  return signature == AttentionSignature::KeysOrPositionsLost || signature == AttentionSignature::PositionsWrong ||
         signature == AttentionSignature::KeysLost || signature == AttentionSignature::FirstShardDiffers ||
         signature == AttentionSignature::HeadsPermuted || signature == AttentionSignature::PositionsNotZigzag;
}

void compare_attention(const RunFiles& run, const Settings& settings, Diagnosis& diagnosis) {
  diagnosis.attention =
      attention_figures(run, settings.sp, settings.dp, settings.precision.precision, settings.attention_layout);
  if (!diagnosis.attention) return;
  const AttentionSignature signature = diagnosis.attention->signature;
  if (signature == AttentionSignature::PositionsNotZigzag) {
    diagnosis.causes.push_back(positions_cause(*diagnosis.attention));
  } else if (names_a_mistake(signature)) {
    diagnosis.causes.push_back(attention_cause(*diagnosis.attention));
  }
  BackwardFigures& backward = diagnosis.attention->backward;
  if (backward.signature == BackwardSignature::KeysValuesPartial && diagnosis.scale &&
      diagnosis.scale->zero.empty() &&
      diagnosis.scale->direction_error <= tolerances_of(settings, diagnosis.attention).gradient) {
    // The weight gradients the step used are one rank's: the parts were saved before a
    // reduction that then ran.
    backward.signature = BackwardSignature::Matches;
    diagnosis.notes.push_back("dK and dV were saved over the whole sequence before their reduction: each rank's "
                              "holds its own queries' part, their sum over the ranks is one-rank training's, and "
                              "the weight gradients (" + diagnosis.scale->from + ") show the reduction ran");
  }
  if (backward_names_a_mistake(backward.signature)) {
    Cause cause = backward_cause(*diagnosis.attention);
    // Used as they are, the parts turn the weight gradient; without grad.* nobody can tell.
    if (backward.signature == BackwardSignature::KeysValuesPartial && diagnosis.scale) {
      cause.evidence += "; the weight gradients the step used (" + diagnosis.scale->from + ") are not one-rank "
                        "training's: the parts were used as they are";
    } else if (backward.signature == BackwardSignature::KeysValuesPartial) {
      cause.fix.clear();
      cause.tell_apart = "saved before their reduction the parts are expected: save grad.* (the weight gradients "
                         "the step used), or dK and dV on the rank's own tokens after the reduction";
    }
    diagnosis.causes.push_back(cause);
  }
  if (signature == AttentionSignature::InputsDiffer || signature == AttentionSignature::NotFinite ||
      signature == AttentionSignature::Differs) {
    diagnosis.notes.push_back(signature_name(signature));
  }
  if (signature == AttentionSignature::RowsPermuted) {
    const AttentionFigures& f = *diagnosis.attention;
    const bool zigzag = f.row_chunks == 2 * f.sp && f.row_order == zigzag_order(f.sp);
    std::string order;
    for (size_t a = 0; a < f.row_order.size() && a < 16; ++a) order += (a ? ", " : "") + std::to_string(f.row_order[a]);
    diagnosis.notes.push_back(
        signature_name(signature) + ": cut into " + std::to_string(f.row_chunks) + " blocks of rows, the ranks' " +
        "blocks in rank order hold the baseline's blocks " + order +
        (zigzag ? ", exactly context parallelism's zigzag layout (rank r holds chunks r and 2C-1-r): read in "
                  "global order (the figures above), the attention matches, and the gradients of its inputs, when "
                  "saved, are compared in that order"
                : ". The attention itself matches; check that rank w's file holds the w-th block of the sequence "
                  "(world rank w = dp_rank x sp + sp_rank)"));
  }
}

void attention_evidence(Diagnosis& diagnosis, const RunFiles& run, const Settings& settings) {
  if (!diagnosis.attention) {
    const std::string why = attention_not_checked(run, settings.sp);
    if (!why.empty()) diagnosis.evidence.push_back({kAttentionCheck, false, why});
    return;
  }
  const AttentionFigures& f = *diagnosis.attention;
  diagnosis.evidence.push_back({kAttentionCheck, true, signature_name(f.signature)});
  if (f.backward.signature != BackwardSignature::NotSaved) {
    diagnosis.evidence.push_back({"the attention's backward against one-rank training", true,
                                  backward_name(f.backward.signature)});
  }
  // The parameters alone can look fine after one step (Adam moves each by about lr
  // whatever the gradient's size); wrong attention is still a wrong model.
  if (explains_the_gradient(f) && diagnosis.kind != Verdict::Skipped && !names_a_fault(diagnosis.kind)) {
    diagnosis.kind = Verdict::UnlikeOneRank;
    diagnosis.verdict = verdict_name(diagnosis.kind);
    diagnosis.verdict_text = "the attention output is not one-rank training's (below); the parameters alone "
                             "said: " + diagnosis.verdict_text;
  }
}

Diagnosis diagnose_attention_only(const RunFiles& run, const Settings& settings) {
  Diagnosis d;
  d.ranks = int(run.ranks.size());
  d.kind = Verdict::Skipped;
  d.verdict = verdict_name(d.kind);
  compare_attention(run, settings, d);
  d.verdict_text = std::string("the files hold attention tensors and no parameters: no verdict on the training "
                                "step is drawn, only the attention's signature (above). ") +
                   (d.attention ? "" : "Nothing to compare the attention with: give --baseline with the one-rank "
                                       "run's 'attention'.");
  d.evidence.push_back({"parameters", false, "the files hold none: save them to check the step (docs/diagnosing.md)"});
  attention_evidence(d, run, settings);
  return d;
}

}  // namespace seqpar::diagnose
