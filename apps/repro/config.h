// The scenario seqpar-repro runs, as configured in TOML (configs/issue6868.toml).
//
// [ds_config] holds the bug report's DeepSpeed keys with DeepSpeed's names;
// [repro] holds what the report's script hard-codes. The defaults are the report's
// values, so `seqpar-repro` with no arguments is the report's scenario.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/adamw.h"

namespace seqpar::repro {

// A key that was read but does not change what is reproduced, and why.
struct ConfigNote {
  std::string key;  // "ds_config.steps_per_print = 10"
  std::string reason;
};

struct ReproConfig {
  // [ds_config]
  int64_t train_micro_batch_size_per_gpu = 4;  // recorded; the script feeds x directly
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 1.0;
  int64_t sequence_parallel_size = 4;
  int64_t data_parallel_size = 1;
  std::string optimizer_type = "AdamW";
  // ds_config.zero_optimization.stage; -1 when not given. Stages 0-2 reduce over the
  // same group; the zero-stage scenario runs only the given stage's reduction.
  int64_t zero_stage = -1;
  optim::AdamWOptions adamw{1e-4, 0.9, 0.999, 1e-8, 0.01};
  // [repro]
  uint64_t seed = 12345;
  int64_t rows = 12000;  // rows of x per data-parallel replica
  int64_t in_features = 640;
  int64_t out_features = 16;
  int64_t steps = 1;
  std::string scenario = "issue-6868";  // repro.scenario (apps/repro/scenario_list.h)
  // Keys accepted without being modelled (DeepSpeed's logging, ZeRO stages 0-2, ...),
  // listed in the report. Not part of the scenario: to_toml leaves them out.
  std::vector<ConfigNote> ignored;

  int64_t world_size() const { return sequence_parallel_size * data_parallel_size; }
};

// The formats --config reads (apps/repro/config_formats.h describes each).
enum class ConfigFormat { Toml, Yaml, Json };

// By the file's extension (.toml, .yaml/.yml, .json); for any other name, by its first
// character that is not blank or a comment: '{' is JSON, '[' or a `key =` line TOML,
// anything else YAML.
ConfigFormat config_format_for(const std::string& path, const std::string& text);

// Reads a config file in any of the formats; every key must be known and of the right
// type, or a DeepSpeed key that does not change the scenario (config_formats.h).
ReproConfig load_config(const std::string& path);

// Applies "section.key=value" overrides (the value in TOML syntax: 3, 1e-4, "AdamW",
// [0.9, 0.99]) to the configuration in `text` (empty for the defaults), then
// validates. Errors name the key and the value.
ReproConfig parse_config(const std::string& text, const std::vector<std::string>& overrides,
                         const std::string& source_name, ConfigFormat format = ConfigFormat::Toml);

// Checks that the values describe a scenario that can run; errors name key and value.
void validate(const ReproConfig& config);

// The configuration as TOML text (what --print-config shows; round-trips).
std::string to_toml(const ReproConfig& config);

}  // namespace seqpar::repro
