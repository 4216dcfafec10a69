// The scenarios seqpar-repro runs, by name: what --list-scenarios prints and what the
// repro.scenario key and --scenario accept. Names only, so the option and config
// parsers link without the scenarios' code.
#pragma once

#include <string>
#include <vector>

namespace seqpar::repro {

struct ScenarioInfo {
  const char* name;
  const char* summary;  // --list-scenarios' lines, after the name
  // Whether it trains with ds_config.gradient_accumulation_steps micro-batches per step
  // (the others take one, and validate() refuses another value for them).
  bool accumulates_gradients = false;
};

// A scenario's defaults: the text of its file in configs/, compiled in, under which a
// user's config and --set are read. So `--scenario NAME` and `--config configs/FILE`
// run the same thing, and a key a user's config leaves out takes the scenario's value.
struct ScenarioConfig {
  const char* scenario;  // "issue-6868"
  const char* file;      // "configs/issue6868.toml"
  const char* toml;      // its text
};
const std::vector<ScenarioConfig>& scenario_configs();  // generated from configs/*.toml
// The defaults of the scenario `name`, or of the first one when `name` is none of them.
const ScenarioConfig& scenario_config(const std::string& name);

// In --list-scenarios' order; the first is the default.
const std::vector<ScenarioInfo>& scenario_list();
bool is_scenario(const std::string& name);
bool scenario_accumulates_gradients(const std::string& name);
// "\"issue-6868\", \"zero-stage\", ..." for error messages.
std::string scenario_names();
// What --list-scenarios prints.
std::string scenario_list_text();

}  // namespace seqpar::repro
