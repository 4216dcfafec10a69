// The scenario seqpar-repro runs, as configured (configs/issue6868.toml): [ds_config]
// holds the bug report's DeepSpeed keys by DeepSpeed's names, [repro] what its script
// hard-codes. The defaults are the report's, so `seqpar-repro` alone runs its scenario.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "optim/adamw.h"

namespace seqpar::repro {

// A key that was read but does not change what is reproduced, and why.
struct ConfigNote {
  std::string key, reason;  // "ds_config.steps_per_print = 10", "logging only"
};

struct ReproConfig {
  // [ds_config]. The report's script feeds x whole; only DeepSpeed's check reads these two:
  // train_batch_size = micro-batch x gradient_accumulation_steps x data_parallel_size.
  int64_t train_micro_batch_size_per_gpu = 4;
  std::optional<int64_t> train_batch_size;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 1.0;
  int64_t sequence_parallel_size = 4;
  int64_t data_parallel_size = 1;
  std::string optimizer_type = "AdamW";
  // zero_optimization.stage, -1 when not given; the zero-stage scenario runs its reduction.
  int64_t zero_stage = -1;
  optim::AdamWOptions adamw =
      optim::AdamWOptions().lr(1e-4).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01);
  // [repro]
  uint64_t seed = 12345;
  int64_t rows = 12000;  // rows of x per data-parallel replica
  int64_t in_features = 640;
  int64_t out_features = 16;
  int64_t steps = 1;
  double dropout = 0.1;  // the dropout scenario's drop probability
  // The ulysses and context-parallel scenarios' attention: heads of head_dim features
  // (d_model is in_features).
  int64_t heads = 8;
  int64_t head_dim = 16;
  std::string scenario = "issue-6868";  // apps/repro/scenario_list.h
  // Listed in the report: keys accepted without being modelled (DeepSpeed's logging,
  // ...), and "key = value" for each key a user's config leaves to the scenario.
  std::vector<ConfigNote> ignored;
  std::vector<std::string> taken_from_scenario;

  int64_t world_size() const { return sequence_parallel_size * data_parallel_size; }
};

// The formats --config reads (apps/repro/config_formats.h describes each): by the
// extension (.toml, .yaml/.yml, .json), else by the first line that is not blank or a
// comment: '{' is JSON, '[' or `key =` TOML, anything else YAML.
enum class ConfigFormat { Toml, Yaml, Json };
ConfigFormat config_format_for(const std::string& path, const std::string& text);

// Reads `text` with the "section.key=value" overrides of --set (the value in TOML, or a
// bare word as a string) over the defaults of the scenario it names (repro.scenario,
// else issue-6868), then validates. Every key must be known and of the right type, or a
// DeepSpeed key that does not change the scenario; all refusals come in one InputError.
ReproConfig parse_config(const std::string& text, const std::vector<std::string>& overrides,
                         const std::string& source_name, ConfigFormat format = ConfigFormat::Toml);

// For a user's config file: it must hold a setting; what it leaves out is listed.
ReproConfig parse_users_config(const std::string& text, const std::vector<std::string>& overrides,
                               const std::string& source_name, ConfigFormat format);
ReproConfig load_config(const std::string& path);  // a user's file, in any format

// The shortest text that reads back as `value` ("0.9", "1e-4", "1.0"), a TOML float.
std::string shortest_float_text(double value);

// Every key the scenarios read, dotted ("ds_config.optimizer.params.lr"), sorted.
std::vector<std::string> config_keys();

// The configuration as TOML text (what --print-config shows; it reads back the same).
std::string to_toml(const ReproConfig& config);

}  // namespace seqpar::repro
