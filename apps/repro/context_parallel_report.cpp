// The context-parallel scenario's figures, verdicts, report and JSON (context_parallel.h).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "apps/common/text.h"
#include "apps/repro/context_parallel.h"
#include "apps/repro/report.h"
#include "apps/repro/sequence_kit.h"
#include "nn/context_parallel_attention.h"

namespace seqpar::repro {

std::vector<int64_t> causal_pairs_by_rank(int64_t sequence, int64_t ranks, bool zigzag) {
  std::vector<int64_t> pairs;
  for (int64_t r = 0; r < ranks; ++r) {
    int64_t count = 0;  // query at position t sees keys 0..t
    for (const int64_t t : nn::context_parallel_positions(
             sequence, int(ranks), int(r),
             zigzag ? nn::ContextParallelLayout::Zigzag : nn::ContextParallelLayout::Contiguous)) {
      count += t + 1;
    }
    pairs.push_back(count);
  }
  return pairs;
}

namespace {

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (const float x : a) m = std::fmax(m, std::fabs(x));
  return m;
}

void measure(CpFigures& f, const CpTrace& baseline, const ReproConfig& c) {
  const std::vector<float> y = f.trace.first_output.to_vector(), y0 = baseline.first_output.to_vector();
  f.output_difference = max_difference(y, y0, 0, y.size());
  const std::vector<float>& g = f.trace.first_gradients;
  const double scale = max_abs(baseline.first_gradients);
  f.gradient_difference = max_difference(g, baseline.first_gradients, 0, g.size()) / scale;
  f.gradient_ratio = max_abs(g) / scale;
  // The flat gradient holds query, key, value (each [H·D, d] and H·D), then output.
  const size_t projection = size_t(c.heads * c.head_dim * (c.in_features + 1));
  for (size_t i = 0; i < 4; ++i) {
    const size_t last = i == 3 ? g.size() : (i + 1) * projection;
    f.gradient_difference_by_projection.push_back(
        max_difference(g, baseline.first_gradients, i * projection, last) / scale);
  }
  f.parameters = compare_parameters(f.trace.parameters, baseline.parameters);
}

bool bitwise(const CpFigures& f) {
  return f.output_difference == 0 && f.gradient_difference == 0 && f.parameters.diverged_at_step == 0;
}

std::string verdict(CpFigures& f, const CpResults& r) {
  const ReproConfig& c = r.config;
  const bool agree = ranks_agree(f.trace.rank_spread);
  const std::string exact = "one-rank training bit for bit, all " + std::to_string(c.steps) + " step(s)";
  switch (f.variant.schedule) {
    case CpSchedule::Contiguous:
    case CpSchedule::Zigzag:
    case CpSchedule::Usp:
      f.as_expected = agree && bitwise(f);
      return f.as_expected ? exact : "NOT bitwise one-rank training: a bug";
    case CpSchedule::HeadWall: {
      // With sp dividing the heads there is no wall to refuse: USP is run all the same.
      const bool wall = c.heads % c.sequence_parallel_size != 0;
      f.as_expected = wall == !r.head_wall_message.empty() && agree && bitwise(f);
      if (!wall) return "no wall (sp divides H); USP ulysses " + std::to_string(r.ulysses) + " x cp " +
                        std::to_string(r.cp) + (bitwise(f) ? ": " + exact : ": NOT bitwise one-rank training");
      if (r.head_wall_message.empty()) return "NOT refused past the wall: a bug";
      return "refused; as USP ulysses " + std::to_string(r.ulysses) + " x cp " + std::to_string(r.cp) +
             (bitwise(f) ? ": " + exact : ": NOT bitwise one-rank training");
    }
    case CpSchedule::Ring:
      f.as_expected = agree && f.output_difference < 1e-4 && f.gradient_difference < 1e-3;
      return std::string(agree ? "consistent (ranks agree)" : "ranks DIFFER") + ", close, " +
             (bitwise(f) ? "bitwise at this size" : "not exact") + " (float merges in arrival order: below)";
    case CpSchedule::StaleKv:
    case CpSchedule::DkvNotReduced: {
      // Stale K/V spoil dq as well; unreduced dK/dV leave dq (the query projection) right.
      const std::vector<double>& by = f.gradient_difference_by_projection;
      const bool stale = f.variant.schedule == CpSchedule::StaleKv;
      f.as_expected = agree && f.output_difference < 1e-4 && by[1] > 1e-2 && by[2] > 1e-2 &&
                      (stale ? by[0] > 1e-2 : by[0] < 1e-4);
      if (!f.as_expected) return "NOT caught as expected";
      return stale ? "WRONG gradient of q, k and v: block b's scores use rank b+1's K/V (ranks agree)"
                   : "WRONG gradient of k and v, q's right: each key misses the other ranks' queries";
    }
    case CpSchedule::LossPerRank: {
      const double loss_ratio = f.trace.losses.front() / r.baseline.losses.front(), cp = double(r.config.sequence_parallel_size);
      f.as_expected = f.output_difference == 0 && std::fabs(loss_ratio - cp) < 1e-3 * cp &&
                      std::fabs(f.gradient_ratio - cp) < 1e-6 * cp;
      return "loss " + number_text(loss_ratio) + " x one rank's, gradients " + number_text(f.gradient_ratio) +
             " x (each rank's own mean, summed over cp);\n      Adam hides the scale but for eps and clipping";
    }
    case CpSchedule::Unpermuted:
      f.as_expected = agree && f.output_difference > 1e-4;
      return std::string(f.as_expected ? "WRONG model" : "NOT caught") +
             " (RoPE at the contiguous positions of zigzag rows: the mask and RoPE disagree)";
  }
  return "";
}

std::string counts_text(const std::vector<int64_t>& values) {
  std::vector<double> figures(values.begin(), values.end());
  return shard_figures(figures);
}

void print_work(std::ostream& out, const ReproConfig& c) {
  const int64_t cp = c.sequence_parallel_size;
  for (const bool zigzag : {false, true}) {
    const std::vector<int64_t> pairs = causal_pairs_by_rank(c.rows, cp, zigzag);
    const auto [low, high] = std::minmax_element(pairs.begin(), pairs.end());
    out << "    " << (zigzag ? "zigzag:     " : "contiguous: ") << counts_text(pairs) << ", busiest / idlest "
        << number_text(double(*high) / double(*low)) << "\n";
  }
}

void print_shapes(std::ostream& out, const CpResults& r) {
  const ReproConfig& c = r.config;
  const int64_t sp = c.sequence_parallel_size, S = c.rows, H = c.heads, D = c.head_dim, s = S / sp;
  const int64_t u = r.ulysses, cp = r.cp;
  out << "  shapes on each rank (S " << S << ", H " << H << ", D " << D << ", sp " << sp << "), bytes received per "
      << "rank:\n    CP over " << sp << ": q, k, v [" << s << ", " << H << ", " << D << "]; forward all-gathers K, V -> ["
      << S << ", " << H << ", " << D << "]: " << 2 * all_gather_bytes(s * H * D, sp) << "\n"
      << "      backward all-gathers Q, dO, O [" << S << ", " << H << ", " << D << "] and m, l [" << H << ", " << S
      << "]: " << 3 * all_gather_bytes(s * H * D, sp) + 2 * all_gather_bytes(H * s, sp) << "\n"
      << "    USP ulysses " << u << " x cp " << cp << ": q, k, v [" << s << ", " << H << ", " << D
      << "] -> all-to-all (x3) -> [" << S / cp << ", " << H / u << ", " << D
      << "] and out back:\n      " << 8 * all_to_all_bytes(s, H, D, u) << " (4 forward, 4 backward)\n"
      << "      the cp level gathers [" << S << ", " << H / u << ", " << D << "]: "
      << 2 * all_gather_bytes(S / cp * H / u * D, cp) + 3 * all_gather_bytes(S / cp * H / u * D, cp) +
             2 * all_gather_bytes(H / u * S / cp, cp)
      << "\n    ring over " << sp << ": K, V pass " << sp - 1 << " times forward, dK, dV partials back to their owner: "
      << 4 * all_gather_bytes(s * H * D, sp) << "\n";
}

std::string refusal_text(const CpResults& r) {
  if (r.head_wall_message.empty()) return "(runs: sp divides the heads)";
  const size_t start = r.head_wall_message.find("UlyssesAttention:");
  return start == std::string::npos ? r.head_wall_message : r.head_wall_message.substr(start);
}

}  // namespace

void decide_context_parallel(CpResults& results) {
  for (CpFigures& f : results.variants) {
    measure(f, results.baseline, results.config);
    f.verdict = verdict(f, results);
  }
}

std::string context_parallel_text(const CpResults& r) {
  const ReproConfig& c = r.config;
  std::ostringstream out;
  out << "Scenario context-parallel: attention with the sequence split over sp " << c.sequence_parallel_size
      << " ranks,\n  each variant against one rank (" << c.steps << " step(s), lr " << number_text(c.adamw.lr())
      << ")\n  " << r.placement << "\n" << config_notes(c) << "\n";
  print_shapes(out, r);
  out << "  score pairs each cp rank computes under the causal mask (S " << c.rows << "):\n";
  print_work(out, c);
  out << "\n  one rank: loss " << number_text(r.baseline.losses.front()) << " at step 1\n\n";
  for (const CpFigures& f : r.variants) {
    out << "  " << f.variant.name << ":\n      " << f.verdict << "\n"
        << "      loss step 1 " << number_text(f.trace.losses.front()) << "; output max |Δ| "
        << number_text(f.output_difference) << "; gradient max |Δ| " << number_text(f.gradient_difference)
        << " of its largest,\n      by projection (q, k, v, out) " << shard_figures(f.gradient_difference_by_projection)
        << "\n      params differing " << f.parameters.differing << " (max |Δ| "
        << number_text(f.parameters.max_difference) << "), ranks " << (ranks_agree(f.trace.rank_spread) ? "agree" : "differ")
        << ", " << number_text(f.trace.seconds / double(c.steps)) << " s/step\n";
    if (f.variant.schedule == CpSchedule::HeadWall) {
      out << "      Ulysses over all " << c.sequence_parallel_size << " ranks (" << r.head_wall_case
          << "):\n      " << wrap_text(refusal_text(r), 6, 100) << "\n";
    }
  }
  out << "\n  why the ring is not exact: each rank merges the blocks' partial softmaxes (their m, l and\n"
         "  output) by log-sum-exp in the order the blocks arrive, and each key's dK, dV adds the\n"
         "  ranks' partials in float: the same terms as one rank's, summed in another order. Exact CP\n"
         "  gathers the operands instead, so one owner walks each chain whole, in key order.\n";
  return out.str();
}

nlohmann::json context_parallel_json(const CpResults& r) {
  const ReproConfig& c = r.config;
  nlohmann::json variants = nlohmann::json::array();
  for (const CpFigures& f : r.variants) {
    variants.push_back({{"key", f.variant.key}, {"name", f.variant.name}, {"verdict", f.verdict},
                        {"as_expected", f.as_expected}, {"losses", f.trace.losses},
                        {"output_difference", f.output_difference}, {"gradient_difference", f.gradient_difference},
                        {"gradient_difference_by_projection", f.gradient_difference_by_projection},
                        {"gradient_ratio", f.gradient_ratio}, {"parameters_differing", f.parameters.differing},
                        {"parameter_difference", f.parameters.max_difference},
                        {"diverged_at_step", f.parameters.diverged_at_step},
                        {"rank_spread", f.trace.rank_spread}, {"seconds_per_step", f.trace.seconds / double(c.steps)}});
  }
  return {{"schema", "seqpar-repro-context-parallel/1"},
          {"sequence_parallel_size", c.sequence_parallel_size},
          {"ulysses", r.ulysses}, {"cp", r.cp}, {"sequence", c.rows}, {"model_dim", c.in_features},
          {"heads", c.heads}, {"head_dim", c.head_dim}, {"steps", c.steps}, {"placement", r.placement},
          {"baseline_losses", r.baseline.losses},
          {"causal_pairs_by_rank", {{"contiguous", causal_pairs_by_rank(c.rows, c.sequence_parallel_size, false)},
                                    {"zigzag", causal_pairs_by_rank(c.rows, c.sequence_parallel_size, true)}}},
          {"head_wall", {{"case", r.head_wall_case}, {"refusal", r.head_wall_message}}},
          {"variants", variants}};
}

}  // namespace seqpar::repro
