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

// In --list-scenarios' order; the first is the default.
const std::vector<ScenarioInfo>& scenario_list();
bool is_scenario(const std::string& name);
bool scenario_accumulates_gradients(const std::string& name);
// "\"issue-6868\", \"zero-stage\", ..." for error messages.
std::string scenario_names();
// What --list-scenarios prints.
std::string scenario_list_text();

}  // namespace seqpar::repro
