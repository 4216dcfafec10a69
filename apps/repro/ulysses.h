// The ulysses scenario: a DeepSpeed-Ulysses attention block (nn/ulysses_block.h) trained
// over sp x dp ranks, correctly and in the ways users get it wrong (docs/ulysses.md),
// each variant from the same initial block on the same data as one rank training on
// whole sequences. The mistakes of attention use the exact gradient sync, so what
// differs from one-rank training is the mistake alone.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/repro/pitfall.h"

namespace seqpar::repro {

// RoundedPartials: each rank's gradient as its backward rounded it to float32, summed
// over sp x dp (all_reduce's Sum: those rounded partials added exactly, rounded once; the
// partials' own roundings are what differs from one rank). Exact: the rows' exact sums
// added over sp x dp before the one rounding. DeepSpeed016: each rank's own rows' mean,
// summed over the dp group alone (#6868).
enum class UlyssesSync { RoundedPartials, Exact, DeepSpeed016 };
enum class UlyssesMistake { None, NoAllToAll, LocalPositions, LocalMask };

struct UlyssesVariant {
  std::string key;   // "no-all-to-all": JSON and dump names
  std::string name;  // "no all-to-all": the report's
  UlyssesMistake mistake = UlyssesMistake::None;
  UlyssesSync sync = UlyssesSync::Exact;
};

// What one variant's run gave, gathered on world rank 0 (rows in one-rank order:
// sequence b's token t is row b * S + t).
struct UlyssesTrace {
  Tensor first_attention;  // [dp * S, H * D] at step 1 (the output projection's input)
  Tensor first_output;     // [dp * S, d_model] at step 1
  std::vector<double> losses;  // per step, before its update: mean |y - target| over all rows
  std::vector<std::vector<float>> parameters;  // world rank 0's, after each step
  std::vector<double> rank_spread;  // per step: max |param_r - param_0| over ranks r
  double seconds = 0;
};

struct UlyssesFigures {
  UlyssesVariant variant;
  UlyssesTrace trace;
  std::vector<double> attention_difference_by_shard;  // step 1, max |Δ| per shard's rows
  double output_difference = 0;                        // step 1, max |Δ| of y
  int64_t parameters_differing = 0;  // after the last step, not bitwise the baseline's
  double parameter_difference = 0;   // after the last step, max |Δ|
  int64_t diverged_at_step = 0;      // first step whose parameters differ (0: none)
  std::string verdict;
  bool as_expected = false;  // the verdict is the one the variant must give
};

struct UlyssesResults {
  ReproConfig config;
  std::string placement;
  UlyssesTrace baseline;
  std::vector<UlyssesFigures> variants;
  std::vector<double> mass_lost_by_shard;  // no all-to-all: mean attention mass on other shards' keys
  std::string uneven_heads_message;        // the layer's refusal of H + 1 heads over sp
  std::string uneven_heads_case;           // "H = 9, sp = 4"
  NamedTensors inputs;                     // x, the targets and the initial block, for the dump
};

UlyssesResults run_ulysses(const RankGroups& groups, const ReproConfig& config, Device device,
                           const std::string& placement);
void check_ulysses_config(const ReproConfig& config);

// ulysses_report.cpp
void decide_ulysses(UlyssesResults& results);
std::string ulysses_text(const UlyssesResults& results);
nlohmann::json ulysses_json(const UlyssesResults& results);

}  // namespace seqpar::repro
