#include "apps/repro/scenario_list.h"

#include <algorithm>

namespace seqpar::repro {

const std::vector<ScenarioInfo>& scenario_list() {
  static const std::vector<ScenarioInfo> list = {
      {"issue-6868",
       "DeepSpeed #6868: the report's sp 4 run; the bug, the usual fix and the exact\n"
       "policy, each against one-rank training (the default)"},
      {"zero-stage",
       "the gradient's scale under ZeRO 0-2's and ZeRO-3's reductions with each loss\n"
       "convention (local mean, global count, all-gather with a sum or a slice\n"
       "backward): 1, sp or 1/sp, measured (configs/zero-stage.toml)"},
      {"shifted-targets",
       "next-row targets: a shift inside each shard loses the row at every shard\n"
       "boundary; shifting before sharding is exact (configs/shifted-targets.toml)"},
      {"clipping-norms",
       "the norm gradient clipping uses: a mean of per-rank norms, a replicated\n"
       "gradient counted on every rank (sqrt(sp)), each element once\n"
       "(configs/clipping-norms.toml)"},
      {"dropout",
       "dropout on the Linear's output: the same seed and offset on every rank gives\n"
       "every shard the first shard's mask; a mask keyed by the global row is exact\n"
       "(configs/dropout.toml)"},
      {"masked-tokens",
       "ignored tokens (label -100) with gradient accumulation: means per micro-batch\n"
       "or per rank weigh tokens by their part's count; the global valid count\n"
       "(num_items_in_batch) is right (configs/masked-tokens.toml)",
       true},
      {"ulysses",
       "DeepSpeed-Ulysses attention (all-to-all, RoPE, causal mask) trained over sp:\n"
       "correct, exact, and the mistakes (no all-to-all, shard-local positions or mask,\n"
       "#6868's sync, heads not divisible by sp) against one rank (configs/ulysses.toml)"},
      {"context-parallel",
       "attention with the sequence split over sp: exact CP (contiguous, zigzag), USP,\n"
       "an online-softmax ring, and the mistakes (stale K/V, dK/dV not reduced, loss\n"
       "per rank, unpermuted positions, the head wall) against one rank\n"
       "(configs/context_parallel.toml)"},
  };
  return list;
}

bool is_scenario(const std::string& name) {
  for (const ScenarioInfo& info : scenario_list()) {
    if (name == info.name) return true;
  }
  return false;
}

bool scenario_accumulates_gradients(const std::string& name) {
  for (const ScenarioInfo& info : scenario_list()) {
    if (name == info.name) return info.accumulates_gradients;
  }
  return false;
}

const ScenarioConfig& scenario_config(const std::string& name) {
  for (const ScenarioConfig& config : scenario_configs()) {
    if (name == config.scenario) return config;
  }
  return scenario_configs().front();
}

std::string scenario_names() {
  std::string names;
  for (const ScenarioInfo& info : scenario_list()) {
    names += (names.empty() ? "\"" : ", \"") + std::string(info.name) + "\"";
  }
  return names;
}

std::string scenario_list_text() {
  std::string text;
  for (const ScenarioInfo& info : scenario_list()) {
    std::string name = info.name;
    name.resize(std::max<size_t>(name.size() + 1, 17), ' ');
    text += name;
    for (const char* c = info.summary; *c != '\0'; ++c) {
      text += *c;
      if (*c == '\n') text += std::string(17, ' ');
    }
    text += '\n';
  }
  return text;
}

}  // namespace seqpar::repro
