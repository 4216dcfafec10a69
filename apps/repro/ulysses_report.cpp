// The ulysses scenario's figures, verdicts, report and JSON (ulysses.h), and the
// shard-local mask's (ulysses_mask.h).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "apps/repro/report.h"
#include "apps/repro/sequence_kit.h"
#include "apps/repro/ulysses.h"
#include "apps/repro/ulysses_mask.h"

namespace seqpar::repro {

std::vector<int64_t> shard_local_positions(int64_t tokens, int64_t tokens_per_shard) {
  std::vector<int64_t> positions(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) positions[static_cast<size_t>(t)] = t % tokens_per_shard;
  return positions;
}

MaskDifference shard_local_mask_difference(int64_t tokens, int64_t tokens_per_shard) {
  MaskDifference difference;
  for (int64_t i = 0; i < tokens; ++i) {
    for (int64_t j = 0; j < tokens; ++j) {
      const bool causal = j <= i, local = j % tokens_per_shard <= i % tokens_per_shard;
      difference.causal_pairs += causal;
      difference.hidden_past += causal && !local;
      difference.visible_future += !causal && local;
    }
  }
  return difference;
}

namespace {

void measure(UlyssesFigures& f, const UlyssesTrace& baseline, const ReproConfig& c) {
  const std::vector<float> a = f.trace.first_attention.to_vector(), a0 = baseline.first_attention.to_vector();
  const size_t shard_values = size_t(c.rows / c.sequence_parallel_size * c.heads * c.head_dim);
  f.attention_difference_by_shard.assign(size_t(c.sequence_parallel_size), 0.0);
  for (size_t i = 0; i < a.size(); i += shard_values) {  // every sequence's shards
    double& worst = f.attention_difference_by_shard[(i / shard_values) % size_t(c.sequence_parallel_size)];
    worst = std::fmax(worst, max_difference(a, a0, i, i + shard_values));
  }
  const std::vector<float> y = f.trace.first_output.to_vector(), y0 = baseline.first_output.to_vector();
  f.output_difference = max_difference(y, y0, 0, y.size());
  const ParameterComparison p = compare_parameters(f.trace.parameters, baseline.parameters);
  f.parameters_differing = p.differing;
  f.parameter_difference = p.max_difference;
  f.diverged_at_step = p.diverged_at_step;
}

bool ranks_agree(const UlyssesTrace& trace) { return repro::ranks_agree(trace.rank_spread); }

std::string verdict(UlyssesFigures& f, const ReproConfig& c) {
  const bool agree = ranks_agree(f.trace), attention_same = f.output_difference == 0 &&
      *std::max_element(f.attention_difference_by_shard.begin(), f.attention_difference_by_shard.end()) == 0;
  const double lr = c.adamw.lr();
  switch (f.variant.mistake) {
    case UlyssesMistake::None:
      if (f.variant.sync == UlyssesSync::Exact) {
        f.as_expected = agree && attention_same && f.diverged_at_step == 0;
        return f.as_expected ? "one-rank training, bit for bit, at each of " + std::to_string(c.steps) +
                                   " step(s) (--steps N for more)"
                             : "NOT bitwise one-rank training: a bug";
      }
      if (f.variant.sync == UlyssesSync::RoundedPartials) {
        f.as_expected = agree && attention_same && f.parameter_difference < 1e-2 * lr * double(c.steps) + 1e-6;
        return "consistent (ranks agree); attention bitwise one rank's; parameters within " +
               number_text(f.parameter_difference) + " (float32 gradient sums in another order)";
      }
      f.as_expected = !agree && attention_same;
      if (agree) return "ranks agree: with one sequence-parallel rank there is no shard to part from";
      return "ranks DIVERGE: max |Δ| between ranks " + number_text(f.trace.rank_spread.front() / lr) +
             "·lr after step 1 (each rank steps on its own shard's gradient)";
    default:
      f.as_expected = agree && !attention_same;
      return std::string(attention_same ? "NOT caught: attention unchanged" : "WRONG model") +
             " (ranks agree: the sync is exact, the attention is not one rank's)";
  }
}

void print_shapes(std::ostream& out, const ReproConfig& c) {
  const int64_t p = c.sequence_parallel_size, s = c.rows, h = c.heads, d = c.head_dim;
  const int64_t bytes = all_to_all_bytes(s / p, h, d, p);  // to the other ranks, each exchange
  out << "  shapes on each rank (S " << s << ", H " << h << ", D " << d << ", sp " << p << "):\n"
      << "    x [" << s / p << ", " << c.in_features << "] -> q, k, v [" << s / p << ", " << h << ", " << d
      << "] -> all-to-all (x3) -> [" << s << ", " << h / p << ", " << d << "]\n"
      << "    -> attention -> [" << s << ", " << h / p << ", " << d << "] -> all-to-all -> [" << s / p << ", "
      << h * d << "] -> output Linear -> [" << s / p << ", " << c.in_features << "]\n"
      << "    each all-to-all sends " << bytes << " bytes per rank (" << (p - 1) << "/" << p << " of [" << s / p
      << ", " << h << ", " << d << "] float32);\n    4 forward + 4 backward per layer and step: " << 8 * bytes
      << " bytes; ring attention passes K and V " << (p - 1) << " times:\n    "
      << 2 * (p - 1) * s / p * h * d * 4 << " bytes per rank in forward alone\n";
}

void print_mistake_detail(std::ostream& out, const UlyssesFigures& f, const UlyssesResults& r) {
  const ReproConfig& c = r.config;
  const int64_t shard = c.rows / c.sequence_parallel_size;
  switch (f.variant.mistake) {
    case UlyssesMistake::NoAllToAll:
      out << "      attention mass each shard's tokens lose (keys on earlier shards), mean: "
          << shard_figures(r.mass_lost_by_shard) << "\n";
      break;
    case UlyssesMistake::LocalPositions:
      out << "      tokens " << shard << ".." << c.rows - 1 << " of each sequence get positions 0.." << shard - 1
          << " (shard r: off by r*" << shard << "); RoPE is relative,\n"
          << "      so pairs within a shard keep their scores and only cross-shard pairs see a wrong distance\n";
      break;
    case UlyssesMistake::LocalMask: {
      const MaskDifference m = shard_local_mask_difference(c.rows, shard);
      out << "      of " << m.causal_pairs << " causal pairs the mask hides " << m.hidden_past << " and shows "
          << m.visible_future << " future ones (a token sees later shards' keys)\n";
      break;
    }
    case UlyssesMistake::None: break;
  }
}

// The layer's message without the check's location and condition (kept in the JSON).
std::string refusal_text(const UlyssesResults& r) {
  if (r.uneven_heads_case.empty()) return "(sp 1: every H divides)";
  if (r.uneven_heads_message.empty()) return "NOT refused: a bug";
  const size_t start = r.uneven_heads_message.find("UlyssesAttention:");
  return start == std::string::npos ? r.uneven_heads_message : r.uneven_heads_message.substr(start);
}

}  // namespace

void decide_ulysses(UlyssesResults& results) {
  for (UlyssesFigures& f : results.variants) {
    measure(f, results.baseline, results.config);
    f.verdict = verdict(f, results.config);
  }
}

std::string ulysses_text(const UlyssesResults& r) {
  const ReproConfig& c = r.config;
  std::ostringstream out;
  out << "Scenario ulysses: DeepSpeed-Ulysses attention over sp " << c.sequence_parallel_size << " x dp "
      << c.data_parallel_size << ", each variant against one rank (" << c.steps << " step(s), lr "
      << number_text(c.adamw.lr()) << ")\n  " << r.placement << "\n" << config_notes(c) << "\n";
  print_shapes(out, c);
  out << "\n  one rank: loss " << number_text(r.baseline.losses.front()) << " at step 1\n\n";
  for (const UlyssesFigures& f : r.variants) {
    out << "  " << f.variant.name << ": " << f.verdict << "\n"
        << "      loss step 1 " << number_text(f.trace.losses.front()) << "; attention max |Δ| by shard "
        << shard_figures(f.attention_difference_by_shard) << "; output " << number_text(f.output_difference)
        << "\n      params differing " << f.parameters_differing << " (max |Δ| " << number_text(f.parameter_difference)
        << "), first differs at step " << (f.diverged_at_step ? std::to_string(f.diverged_at_step) : std::string("-"))
        << ", ranks " << (ranks_agree(f.trace) ? "agree" : "differ") << ", "
        << number_text(f.trace.seconds / double(c.steps)) << " s/step\n";
    print_mistake_detail(out, f, r);
  }
  out << "  heads not divisible by sp (" << r.uneven_heads_case << "): the layer refuses:\n      "
      << refusal_text(r)
      << "\n\n  why the correct run is not exact: its attention is one rank's bit for bit (each head runs\n"
         "  whole on one rank), but the projections' weight gradients are sums over all S rows, and\n"
         "  float32 sums of per-rank partial sums round differently; the exact variant adds them\n"
         "  exactly over sp x dp and rounds once.\n";
  return out.str();
}

nlohmann::json ulysses_json(const UlyssesResults& r) {
  const ReproConfig& c = r.config;
  nlohmann::json variants = nlohmann::json::array();
  for (const UlyssesFigures& f : r.variants) {
    variants.push_back({{"key", f.variant.key}, {"name", f.variant.name}, {"verdict", f.verdict},
                        {"as_expected", f.as_expected}, {"losses", f.trace.losses},
                        {"attention_difference_by_shard", f.attention_difference_by_shard},
                        {"output_difference", f.output_difference},
                        {"parameters_differing", f.parameters_differing},
                        {"parameter_difference", f.parameter_difference},
                        {"diverged_at_step", f.diverged_at_step}, {"rank_spread", f.trace.rank_spread},
                        {"seconds_per_step", f.trace.seconds / double(c.steps)}});
  }
  return {{"schema", "seqpar-repro-ulysses/1"}, {"sequence_parallel_size", c.sequence_parallel_size},
          {"data_parallel_size", c.data_parallel_size}, {"sequence", c.rows}, {"model_dim", c.in_features},
          {"heads", c.heads}, {"head_dim", c.head_dim}, {"steps", c.steps}, {"placement", r.placement},
          {"baseline_losses", r.baseline.losses}, {"mass_lost_by_shard", r.mass_lost_by_shard},
          {"uneven_heads", {{"case", r.uneven_heads_case}, {"refusal", r.uneven_heads_message}}},
          {"variants", variants}};
}

}  // namespace seqpar::repro
