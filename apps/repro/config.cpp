#include "apps/repro/config.h"

#include "third_party/toml.h"

#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "apps/repro/config_formats.h"
#include "apps/repro/config_input.h"
#include "apps/repro/scenario_list.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

// ---------------------------------------------------------------- the schema
// Every key the file may hold, with how to read it into the configuration. A key not
// listed here is an error, so a typo never silently falls back to a default.

using Reader = std::function<void(const toml::node&, const std::string& key, ReproConfig&)>;

std::string describe(const toml::node& node) {
  std::ostringstream out;
  if (node.is_string()) {
    out << '"' << printable(node.value<std::string>().value_or("")) << '"';
  } else if (node.is_array() || node.is_table()) {
    out << (node.is_array() ? "an array" : "a table");
  } else {
    out << toml::node_view<const toml::node>(node);
  }
  return out.str();
}

int64_t read_integer(const toml::node& node, const std::string& key) {
  SEQPAR_INPUT_CHECK(node.is_integer(), "config key ", key, " must be an integer, got ", describe(node));
  return node.value<int64_t>().value();
}

double read_number(const toml::node& node, const std::string& key) {
  SEQPAR_INPUT_CHECK(node.is_number(), "config key ", key, " must be a number, got ", describe(node));
  // toml++ turns an integer into a double only up to 2^53 in magnitude, where every
  // integer is one exactly; past it, an error rather than a value rounded unseen.
  const std::optional<double> value = node.value<double>();
  SEQPAR_INPUT_CHECK(value.has_value(), "config key ", key, " must be a number a double holds exactly ",
                     "(an integer at most 2^53 in magnitude, or a float), got ", describe(node));
  return *value;
}

Reader integer_into(int64_t ReproConfig::*field) {
  return [field](const toml::node& node, const std::string& key, ReproConfig& config) {
    config.*field = read_integer(node, key);
  };
}

Reader number_into(double ReproConfig::*field) {
  return [field](const toml::node& node, const std::string& key, ReproConfig& config) {
    config.*field = read_number(node, key);
  };
}

Reader adamw_number_into(double optim::AdamWOptions::*field) {
  return [field](const toml::node& node, const std::string& key, ReproConfig& config) {
    config.adamw.*field = read_number(node, key);
  };
}

void read_betas(const toml::node& node, const std::string& key, ReproConfig& config) {
  const toml::array* betas = node.as_array();
  SEQPAR_INPUT_CHECK(betas && betas->size() == 2, "config key ", key,
               " must be an array of two numbers, got ", describe(node));
  config.adamw.beta1 = read_number(*betas->get(0), key + "[0]");
  config.adamw.beta2 = read_number(*betas->get(1), key + "[1]");
}

void read_optimizer_type(const toml::node& node, const std::string& key, ReproConfig& config) {
  SEQPAR_INPUT_CHECK(node.is_string(), "config key ", key, " must be a string, got ", describe(node));
  config.optimizer_type = node.value<std::string>().value();
  // DeepSpeed matches optimizer names without regard to case, and its "Adam" is AdamW
  // unless optimizer.params.adam_w_mode is false (which is refused).
  std::string lower = config.optimizer_type;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "adamw") config.optimizer_type = "AdamW";
  if (lower == "adam") {
    config.ignored.push_back({key + " = " + describe(node),
                              "DeepSpeed's Adam with adam_w_mode (its default) is AdamW"});
    config.optimizer_type = "AdamW";
  }
}

void read_scenario(const toml::node& node, const std::string& key, ReproConfig& config) {
  const std::optional<std::string> name = node.value<std::string>();
  SEQPAR_INPUT_CHECK(node.is_string() && is_scenario(*name), "config key ", key, " = ",
                     describe(node), ": expected one of ", scenario_names(),
                     " (seqpar-repro --list-scenarios)");
  config.scenario = *name;
}

void read_seed(const toml::node& node, const std::string& key, ReproConfig& config) {
  const int64_t seed = read_integer(node, key);
  SEQPAR_INPUT_CHECK(seed >= 0, "config key ", key, " = ", seed, ": the seed must not be negative");
  config.seed = static_cast<uint64_t>(seed);
}

void read_zero_stage(const toml::node& node, const std::string& key, ReproConfig& config) {
  const int64_t stage = read_integer(node, key);
  SEQPAR_INPUT_CHECK(stage >= 0 && stage <= 3, "config key ", key, " = ", stage,
                     ": DeepSpeed's ZeRO stages are 0, 1, 2 and 3");
  config.zero_stage = stage;
  if (stage <= 2) {
    config.ignored.push_back({key + " = " + std::to_string(stage),
                              "ZeRO stages 0-2 reduce gradients over the same group as stage 0, "
                              "which the scenario models; they only partition optimizer state "
                              "and gradients"});
  }
}

const std::map<std::string, Reader>& schema() {
  static const std::map<std::string, Reader> keys = {
      {"ds_config.train_micro_batch_size_per_gpu",
       integer_into(&ReproConfig::train_micro_batch_size_per_gpu)},
      {"ds_config.gradient_accumulation_steps",
       integer_into(&ReproConfig::gradient_accumulation_steps)},
      {"ds_config.gradient_clipping", number_into(&ReproConfig::gradient_clipping)},
      {"ds_config.sequence_parallel_size", integer_into(&ReproConfig::sequence_parallel_size)},
      {"ds_config.data_parallel_size", integer_into(&ReproConfig::data_parallel_size)},
      {"ds_config.optimizer.type", read_optimizer_type},
      {"ds_config.optimizer.params.lr", adamw_number_into(&optim::AdamWOptions::lr)},
      {"ds_config.optimizer.params.betas", read_betas},
      {"ds_config.optimizer.params.eps", adamw_number_into(&optim::AdamWOptions::eps)},
      {"ds_config.optimizer.params.weight_decay",
       adamw_number_into(&optim::AdamWOptions::weight_decay)},
      {"repro.seed", read_seed},
      {"repro.rows", integer_into(&ReproConfig::rows)},
      {"repro.in_features", integer_into(&ReproConfig::in_features)},
      {"repro.out_features", integer_into(&ReproConfig::out_features)},
      {"repro.steps", integer_into(&ReproConfig::steps)},
      {"repro.dropout", number_into(&ReproConfig::dropout)},
      {"repro.scenario", read_scenario},
      {"ds_config.zero_optimization.stage", read_zero_stage},
  };
  return keys;
}

bool is_known_table(const std::string& path) {
  for (const auto& entry : schema()) {
    if (entry.first.rfind(path + ".", 0) == 0) return true;
  }
  return false;
}

void read_unmodelled_key(const toml::node& node, const std::string& key, ReproConfig& config);

// Reads every leaf of `table` (recursively) through the schema.
void read_table(const toml::table& table, const std::string& prefix, ReproConfig& config) {
  for (const auto& [name, node] : table) {
    const std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    // "optimizer.params.lr" as one key would read as the nested lr: refused, not joined.
    SEQPAR_INPUT_CHECK(name.str().find('.') == std::string_view::npos, "config key \"",
                       printable(std::string(name.str())), "\"", prefix.empty() ? "" : " in " + prefix,
                       " has a '.' in its name; nest the keys instead");
    const auto known = schema().find(key);
    if (known != schema().end()) {
      known->second(node, key, config);
    } else if (node.is_table() && is_known_table(key)) {
      read_table(*node.as_table(), key, config);
    } else {
      read_unmodelled_key(node, key, config);
    }
  }
}

// A key outside the schema: a DeepSpeed key the scenario can do without, or an error.
void read_unmodelled_key(const toml::node& node, const std::string& key, ReproConfig& config) {
  const detail::KeyDecision decision = detail::deepspeed_key_decision(key, node);
  switch (decision.treatment) {
    case detail::KeyTreatment::Ignore:
      config.ignored.push_back(
          {node.is_value() ? key + " = " + describe(node) : key, decision.reason});
      return;
    case detail::KeyTreatment::Descend:
      read_table(*node.as_table(), key, config);
      return;
    case detail::KeyTreatment::Refuse:
      SEQPAR_INPUT_FAIL("config key ", printable(key), node.is_value() ? " = " + describe(node) : "",
                        " is not supported: ", decision.reason);
    case detail::KeyTreatment::Unknown:
      break;
  }
  SEQPAR_INPUT_FAIL("unknown config key ", printable(key), " (known keys: see configs/issue6868.toml)");
}

// ---------------------------------------------------------------- overrides

// "ds_config.optimizer.params.lr=3e-4": sets that key in `table`, creating tables on
// the way. The value is parsed as TOML, so its type is what it looks like. It must be
// one value on one line: a line break would let the rest of the text become more TOML
// (new tables and keys) that the parser would take in silence.
void apply_override(toml::table& table, const std::string& assignment) {
  for (const char c : assignment) {
    SEQPAR_INPUT_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7F, "--set ",
                       printable(assignment), ": control characters (line breaks, ...) are "
                       "not allowed; the value must be one TOML value on one line");
  }
  const size_t equals = assignment.find('=');
  SEQPAR_INPUT_CHECK(equals != std::string::npos && equals > 0, "--set ", assignment,
                     ": expected section.key=value");
  const std::string key = assignment.substr(0, equals);
  const std::string text = assignment.substr(equals + 1);
  const std::vector<std::string> parts = split_override_key(key);
  const std::string value_text = "value = " + text;
  check_config_text(value_text, "--set " + key);
  toml::table parsed;
  try {
    parsed = toml::parse(value_text);
  } catch (const toml::parse_error& error) {
    SEQPAR_INPUT_FAIL("--set ", key, "=", text, ": the value is not TOML (", error.description(),
                      "); strings need quotes, e.g. --set ds_config.optimizer.type='\"AdamW\"'");
  }
  SEQPAR_INPUT_CHECK(parsed.size() == 1 && parsed.contains("value"), "--set ", key, "=", text,
                     ": expected one TOML value");
  toml::table* where = &table;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!where->contains(parts[i])) where->insert(parts[i], toml::table{});
    where = (*where)[parts[i]].as_table();
    SEQPAR_INPUT_CHECK(where != nullptr, "--set ", key, ": ", parts[i], " is not a table");
  }
  where->insert_or_assign(parts.back(), *parsed.get("value"));
}

}  // namespace

// ---------------------------------------------------------------- public

ConfigFormat config_format_for(const std::string& path, const std::string& text) {
  auto ends_with = [&](const char* suffix) {
    const std::string tail(suffix);
    return path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with(".toml")) return ConfigFormat::Toml;
  if (ends_with(".yaml") || ends_with(".yml")) return ConfigFormat::Yaml;
  if (ends_with(".json")) return ConfigFormat::Json;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    if (line[first] == '{') return ConfigFormat::Json;
    if (line[first] == '[') return ConfigFormat::Toml;
    const size_t equals = line.find('='), colon = line.find(':');
    return equals != std::string::npos && (colon == std::string::npos || equals < colon)
               ? ConfigFormat::Toml
               : ConfigFormat::Yaml;
  }
  return ConfigFormat::Toml;
}

ReproConfig parse_config(const std::string& text, const std::vector<std::string>& overrides,
                         const std::string& source_name, ConfigFormat format) {
  toml::table table;
  std::vector<ConfigNote> ignored;
  if (format == ConfigFormat::Yaml) {
    table = detail::read_yaml_document(text, source_name, ignored);
  } else if (format == ConfigFormat::Json) {
    table = detail::read_json_document(text, source_name, ignored);
  } else {
    check_config_text(text, source_name);  // before toml++ sees it (config_input.h)
    try {
      table = toml::parse(text, source_name);
    } catch (const toml::parse_error& error) {
      SEQPAR_INPUT_FAIL("config ", source_name, " line ", error.source().begin.line, " column ",
                        error.source().begin.column, ": ", error.description());
    }
  }
  for (const std::string& assignment : overrides) apply_override(table, assignment);
  ReproConfig config;
  config.ignored = std::move(ignored);
  read_table(table, "", config);
  validate(config);
  return config;
}

ReproConfig load_config(const std::string& path) {
  const std::string text = read_config_file(path);
  return parse_config(text, {}, path, config_format_for(path, text));
}

std::string to_toml(const ReproConfig& c) {
  toml::table params{{"lr", c.adamw.lr},
                     {"betas", toml::array{c.adamw.beta1, c.adamw.beta2}},
                     {"eps", c.adamw.eps},
                     {"weight_decay", c.adamw.weight_decay}};
  toml::table optimizer{{"type", c.optimizer_type}, {"params", params}};
  toml::table ds_config{{"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
                        {"gradient_accumulation_steps", c.gradient_accumulation_steps},
                        {"gradient_clipping", c.gradient_clipping},
                        {"sequence_parallel_size", c.sequence_parallel_size},
                        {"data_parallel_size", c.data_parallel_size},
                        {"optimizer", optimizer}};
  // Only the zero-stage scenario reads the stage; elsewhere it is an ignored key.
  if (c.scenario == "zero-stage" && c.zero_stage >= 0) {
    ds_config.insert("zero_optimization", toml::table{{"stage", c.zero_stage}});
  }
  toml::table repro{{"seed", static_cast<int64_t>(c.seed)}, {"rows", c.rows},
                    {"in_features", c.in_features}, {"out_features", c.out_features},
                    {"steps", c.steps}, {"dropout", c.dropout}, {"scenario", c.scenario}};
  std::ostringstream out;
  out << toml::table{{"ds_config", ds_config}, {"repro", repro}} << '\n';
  return out.str();
}

}  // namespace seqpar::repro
