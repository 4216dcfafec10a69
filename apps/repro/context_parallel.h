// The context-parallel scenario: a Llama-shaped attention block (QKV Linear, RoPE at
// global positions, causal attention, output Linear, L1 loss) trained over sp ranks
// with the sequence split inside attention (docs/context-parallel.md): context
// parallelism (CP) with contiguous and zigzag shards, USP (ulysses x cp), a classic
// online-softmax ring, and the mistakes users make with them, each from the same
// initial block on the same sequence as one rank training on it whole. Gradients are
// summed exactly over the ranks, so what differs from one rank is the schedule alone.
//
// The mistakes live here, not in nn: the library's layers are used as they are, or
// composed with a wrong reduction or permutation around its calls.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/repro/pitfall.h"
#include "apps/repro/sequence_kit.h"

namespace seqpar::repro {

enum class CpSchedule {
  Contiguous,     // nn::SequenceParallelAttention, ulysses 1 x cp sp, contiguous shards
  Zigzag,         // the same, zigzag shards
  Usp,            // ulysses U x cp C, zigzag
  HeadWall,       // Ulysses over all sp ranks (refused past the heads), then USP
  Ring,           // online-softmax ring merged by log-sum-exp (here, zigzag)
  StaleKv,        // the ring, its backward reading the K/V buffer its forward left
  DkvNotReduced,  // the ring, each rank keeping its own queries' dK and dV
  LossPerRank,    // zigzag, each rank's loss its own rows' mean
  Unpermuted,     // zigzag shards, RoPE at contiguous positions
};

struct CpVariant {
  std::string key;   // "zigzag": JSON and dump names
  std::string name;  // "exact CP, zigzag": the report's
  CpSchedule schedule = CpSchedule::Contiguous;
};

// One variant's run, gathered on world rank 0; rows in position order.
struct CpTrace {
  Tensor first_output;                   // [S, d_model] at step 1
  std::vector<float> first_gradients;    // step 1, summed over the ranks, before clipping
  std::vector<double> losses;            // per step, the loss the run reports
  std::vector<std::vector<float>> parameters;  // world rank 0's, after each step
  std::vector<double> rank_spread;             // per step: max |param_r - param_0|
  double seconds = 0;
};

struct CpFigures {
  CpVariant variant;
  CpTrace trace;
  double output_difference = 0;    // step 1, max |Δ| of y
  double gradient_difference = 0;  // step 1, max |Δg| / max |g| of one rank
  std::vector<double> gradient_difference_by_projection;  // the same per query, key, value, output
  double gradient_ratio = 0;       // step 1, max |g| / max |g| of one rank
  ParameterComparison parameters;  // after each step, against one rank's
  std::string verdict;
  bool as_expected = false;
};

struct CpResults {
  ReproConfig config;
  std::string placement;
  int64_t ulysses = 1, cp = 1;  // USP's split of sp
  CpTrace baseline;
  std::vector<CpFigures> variants;
  std::string head_wall_case, head_wall_message;  // Ulysses over sp ranks: the layer's refusal
  NamedTensors inputs;
};

CpResults run_context_parallel(const RankGroups& groups, const ReproConfig& config, Device device,
                               const std::string& placement);
void check_context_parallel_config(const ReproConfig& config);
// USP's Ulysses degree for `heads` over sp ranks: the largest that divides both and
// leaves cp > 1.
int64_t usp_ulysses_degree(int64_t heads, int64_t sp);

// context_parallel_report.cpp
// Score pairs (query, visible key) each cp rank computes under the causal mask.
std::vector<int64_t> causal_pairs_by_rank(int64_t sequence, int64_t ranks, bool zigzag);
void decide_context_parallel(CpResults& results);
std::string context_parallel_text(const CpResults& results);
nlohmann::json context_parallel_json(const CpResults& results);

}  // namespace seqpar::repro
