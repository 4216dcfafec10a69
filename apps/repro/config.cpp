// Reading a configuration: the document (config_formats.h) with the --set overrides,
// over the scenario's defaults, key by key through one table of keys, then validated.
#include "apps/repro/config.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "apps/repro/config_formats.h"
#include "apps/repro/config_input.h"
#include "apps/repro/scenario_list.h"
#include "apps/repro/validate.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

using detail::Json;
using C = ReproConfig;

// A value as an error message quotes it.
std::string describe(const Json& node) {
  if (node.is_string()) return '"' + abbreviated(node.get<std::string>()) + '"';
  if (node.is_structured()) return node.is_array() ? "an array" : "a table";
  return node.is_number_float() ? shortest_float_text(node.get<double>()) : node.dump();
}

// A value as TOML writes it, floats in their shortest form.
std::string toml_value(const Json& node) {
  if (node.is_string()) return "'" + node.get<std::string>() + "'";
  if (!node.is_array()) return describe(node);
  std::string text;
  for (const Json& item : node) text += (text.empty() ? "" : ", ") + toml_value(item);
  return "[" + text + "]";
}

int64_t read_integer(const Json& node, const std::string& key, int64_t low, int64_t high = INT64_MAX) {
  SEQPAR_INPUT_CHECK(node.is_number_integer(), "config key ", key, " must be an integer, got ", describe(node));
  SEQPAR_INPUT_CHECK(!node.is_number_unsigned() || node.get<uint64_t>() <= uint64_t(INT64_MAX), "config key ",
                     key, " = ", describe(node), " is too large");
  const int64_t value = node.get<int64_t>();
  SEQPAR_INPUT_CHECK(value >= low, "config key ", key, " = ", value, ": must be at least ", low);
  SEQPAR_INPUT_CHECK(value <= high, "config key ", key, " = ", value, ": must be at most ", high);
  return value;
}

// The floats reach float32 kernels: a value must be finite, survive the rounding to
// float32 without overflowing or flushing to zero, and lie in its range, whose open upper
// end (Adam's betas, the drop probability: 1 divides by zero) holds in float32 too.
struct Range {
  double low, high;
  bool low_included, high_included;
  const char* what = "";  // what the value is, when the key does not say
};

double read_number(const Json& node, const std::string& key, const Range& range) {
  SEQPAR_INPUT_CHECK(node.is_number(), "config key ", key, " must be a number, got ", describe(node));
  // Past 2^53 an integer would be rounded unseen.
  constexpr int64_t kExact = int64_t(1) << 53;
  SEQPAR_INPUT_CHECK(node.is_number_float() || (node.is_number_unsigned() ? node.get<uint64_t>() <= uint64_t(kExact)
                                                : node >= -kExact && node <= kExact),
                     "config key ", key, " must be a number a double holds exactly (an integer at most 2^53 in "
                     "magnitude, or a float), got ", describe(node));
  const double value = node.get<double>();
  char digits[32];  // enough to tell 0.99999999 from 1
  std::snprintf(digits, sizeof digits, "%.10g", value);
  const std::string at = "config key " + key + " = " + digits + ": ";
  SEQPAR_INPUT_CHECK(std::isfinite(value), at, "must be a finite number");
  SEQPAR_INPUT_CHECK(value == 0 || (std::abs(value) >= FLT_MIN && std::abs(value) <= FLT_MAX), at,
                     "not representable in float32 (", FLT_MIN, " to ", FLT_MAX, ")");
  const bool above = range.low_included ? value >= range.low : value > range.low;
  const bool below = range.high_included ? value <= range.high : static_cast<float>(value) < range.high;
  SEQPAR_INPUT_CHECK(above && below, at, range.what, "must be in ", range.low_included ? "[" : "(", range.low, ", ",
                     range.high, range.high_included ? "]" : ")",
                     !range.high_included && value < range.high ? " also in float32 (it rounds to 1)" : "");
  return value;
}

// Every key a config may set: how its value is checked and stored, and how to_toml
// writes it (a null: left out). A key not listed is an error, so a typo never silently
// falls back to a default.
struct Key {
  std::function<void(const Json&, const std::string& key, C&)> read;
  std::function<Json(const C&)> write;
};

template <typename Integer>
Key integer_key(Integer C::*field, int64_t low, int64_t high = INT64_MAX,
                std::vector<std::string> only_in_scenarios = {}) {
  return {[=](const Json& node, const std::string& key, C& c) { c.*field = read_integer(node, key, low, high); },
          [=](const C& c) {
            const bool read = only_in_scenarios.empty() ||
                std::find(only_in_scenarios.begin(), only_in_scenarios.end(), c.scenario) != only_in_scenarios.end();
            return read ? Json(c.*field) : Json();
          }};
}

Key number_key(double C::*field, Range range) {
  return {[=](const Json& node, const std::string& key, C& c) { c.*field = read_number(node, key, range); },
          [=](const C& c) { return Json(c.*field); }};
}

// An AdamW hyperparameter, by its setter and getter (&optim::AdamWOptions::lr twice).
Key adamw_key(optim::AdamWOptions& (optim::AdamWOptions::*set)(double), double (optim::AdamWOptions::*get)() const,
              Range range) {
  return {[=](const Json& node, const std::string& key, C& c) { (c.adamw.*set)(read_number(node, key, range)); },
          [=](const C& c) { return Json((c.adamw.*get)()); }};
}

void read_betas(const Json& node, const std::string& key, C& c) {
  SEQPAR_INPUT_CHECK(node.is_array() && node.size() == 2, "config key ", key, " must be an array of two numbers, got ",
                     describe(node));
  const Range beta{0, 1, true, false};
  c.adamw.betas({read_number(node[0], key + "[0]", beta), read_number(node[1], key + "[1]", beta)});
}

void read_optimizer_type(const Json& node, const std::string& key, C& c) {
  SEQPAR_INPUT_CHECK(node.is_string(), "config key ", key, " must be a string, got ", describe(node));
  // DeepSpeed matches optimizer names without regard to case, and its "Adam" is AdamW
  // unless optimizer.params.adam_w_mode is false (which is refused).
  std::string name = node.get<std::string>();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  SEQPAR_INPUT_CHECK(name == "adamw" || name == "adam", "config key ", key, " = ", describe(node),
                     ": only \"AdamW\" is supported");
  if (name == "adam") {
    c.ignored.push_back({key + " = " + describe(node), "DeepSpeed's Adam with adam_w_mode (its default) is AdamW"});
  }
  c.optimizer_type = "AdamW";
}

void read_zero_stage(const Json& node, const std::string& key, C& c) {
  c.zero_stage = read_integer(node, key, 0, 3);
  if (c.zero_stage <= 2) {
    c.ignored.push_back({key + " = " + std::to_string(c.zero_stage), "ZeRO stages 0-2 reduce gradients over the "
                         "same group as stage 0, which the scenario models; they only partition optimizer state "
                         "and gradients"});
  }
}

void read_scenario(const Json& node, const std::string& key, C& c) {
  SEQPAR_INPUT_CHECK(node.is_string() && is_scenario(node.get<std::string>()), "config key ", key, " = ",
                     describe(node), ": expected one of ", scenario_names(), " (seqpar-repro --list-scenarios)");
  c.scenario = node.get<std::string>();
}

const std::map<std::string, Key>& keys() {
  using optim::AdamWOptions;
  static const std::map<std::string, Key> table = {
      {"ds_config.train_micro_batch_size_per_gpu", integer_key(&C::train_micro_batch_size_per_gpu, 1)},
      {"ds_config.train_batch_size",
       {[](const Json& node, const std::string& key, C& c) { c.train_batch_size = read_integer(node, key, 1); },
        [](const C& c) { return c.train_batch_size ? Json(*c.train_batch_size) : Json(); }}},
      // 1 but in scenario masked-tokens (validate.cpp).
      {"ds_config.gradient_accumulation_steps", integer_key(&C::gradient_accumulation_steps, 1, 1000)},
      {"ds_config.gradient_clipping", number_key(&C::gradient_clipping, {0, FLT_MAX, true, true})},  // 0: off
      {"ds_config.sequence_parallel_size", integer_key(&C::sequence_parallel_size, 1)},
      {"ds_config.data_parallel_size", integer_key(&C::data_parallel_size, 1)},
      {"ds_config.optimizer.type", {read_optimizer_type, [](const C& c) { return Json(c.optimizer_type); }}},
      // Larger values do not train (Adam moves every parameter by about lr a step).
      {"ds_config.optimizer.params.lr", adamw_key(&AdamWOptions::lr, &AdamWOptions::lr, {0, 1, false, true})},
      {"ds_config.optimizer.params.betas",
       {read_betas, [](const C& c) { return Json::array({c.adamw.beta1(), c.adamw.beta2()}); }}},
      {"ds_config.optimizer.params.eps", adamw_key(&AdamWOptions::eps, &AdamWOptions::eps, {0, 1, false, true})},
      {"ds_config.optimizer.params.weight_decay",
       adamw_key(&AdamWOptions::weight_decay, &AdamWOptions::weight_decay, {0, 100, true, true})},
      {"ds_config.zero_optimization.stage",  // only the zero-stage scenario reads it
       {read_zero_stage,
        [](const C& c) { return c.scenario == "zero-stage" && c.zero_stage >= 0 ? Json(c.zero_stage) : Json(); }}},
      {"repro.seed", integer_key(&C::seed, 0)},
      {"repro.rows", integer_key(&C::rows, 1)},
      {"repro.in_features", integer_key(&C::in_features, 1)},
      {"repro.out_features", integer_key(&C::out_features, 1)},
      {"repro.steps", integer_key(&C::steps, 1, 1000000)},  // a million steps is days of compute
      {"repro.dropout", number_key(&C::dropout, {0, 1, true, false, "the drop probability "})},
      {"repro.heads", integer_key(&C::heads, INT64_MIN, INT64_MAX, {"ulysses", "context-parallel"})},  // checked by its scenario
      {"repro.head_dim", integer_key(&C::head_dim, INT64_MIN, INT64_MAX, {"ulysses", "context-parallel"})},
      {"repro.scenario", {read_scenario, [](const C& c) { return Json(c.scenario); }}},
  };
  return table;
}

bool is_known_table(const std::string& path) {
  const auto next = keys().lower_bound(path + ".");
  return next != keys().end() && next->first.rfind(path + ".", 0) == 0;
}

// A configuration being read, with every refusal kept: all are reported at once.
struct Reading {
  C& config;
  std::vector<std::string> refusals;
};

void read_table(const Json& table, const std::string& prefix, Reading& reading);

// A key outside the table: a DeepSpeed key the scenario can do without, or an error.
void read_other_key(const Json& node, const std::string& key, Reading& reading) {
  const detail::KeyDecision decision = detail::deepspeed_key_decision(key, node);
  const std::string shown = node.is_structured() ? printable(key) : printable(key) + " = " + describe(node);
  using detail::KeyTreatment;
  if (decision.treatment == KeyTreatment::Ignore) return reading.config.ignored.push_back({shown, decision.reason});
  if (decision.treatment == KeyTreatment::Descend) return read_table(node, key, reading);
  SEQPAR_INPUT_CHECK(decision.treatment != KeyTreatment::Refuse, "config key ", shown, " is not supported: ",
                     decision.reason);
  // A typo is looked for among the keys of the same table ("repro.setps": repro.steps).
  const std::string table = key.substr(0, key.rfind('.') + 1);
  std::vector<std::string> near;
  for (const auto& [name, known] : keys()) {
    if (name.rfind(table, 0) == 0 && name.find('.', table.size()) == std::string::npos) {
      near.push_back(name.substr(table.size()));
    }
  }
  const std::string match = closest_name(key.substr(table.size()), near);
  const std::string hint = match.empty() ? "" : "; did you mean " + table + match + "?";
  SEQPAR_INPUT_FAIL("unknown config key ", abbreviated(key), hint, " (seqpar-repro --print-config shows every key)");
}

// Reads every leaf of `table` (recursively) through the keys' table.
void read_table(const Json& table, const std::string& prefix, Reading& reading) {
  for (const auto& [name, node] : table.items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const auto found = keys().find(key);
    const Key* known = found == keys().end() ? nullptr : &found->second;
    try {
      // "optimizer.params.lr" as one key would read as the nested lr: refused, not joined.
      SEQPAR_INPUT_CHECK(name.find('.') == std::string::npos, "config key \"", printable(name), "\"",
                         prefix.empty() ? "" : " in " + prefix, " has a '.' in its name; nest the keys instead");
      if (node.is_null()) {
        // DeepSpeed's "not set": no default is guessed for a key the scenario reads.
        SEQPAR_INPUT_CHECK(!known, "config key ", key, " is null: write a value",
                           key == "ds_config.gradient_clipping" ? " (0 turns clipping off)" : "",
                           ", or leave the key out to take the scenario's");
        reading.config.ignored.push_back({printable(key), "null: DeepSpeed's default"});
      } else if (known) {
        // Hugging Face's Trainer fills "auto" in before DeepSpeed reads the config; here is no Trainer.
        SEQPAR_INPUT_CHECK(node != "auto", "config key ", key, " = \"auto\": a placeholder the Hugging Face Trainer "
                           "fills in; write the value (or leave the key out for the scenario's)");
        known->read(node, key, reading.config);
      } else if (node.is_object() && is_known_table(key)) {
        read_table(node, key, reading);
      } else {
        read_other_key(node, key, reading);
      }
    } catch (const InputError& error) {
      reading.refusals.emplace_back(error.what());
    }
  }
}

// `from` merged into `into`: tables key by key, any other value replacing.
void merge(Json& into, const Json& from) {
  for (const auto& [name, node] : from.items()) {
    if (node.is_object() && into.contains(name) && into[name].is_object()) merge(into[name], node);
    else into[name] = node;
  }
}

// "key = value" for every leaf of `defaults` that `given` lacks: what a user's config
// takes from the scenario (but the micro-batch size, which only the train_batch_size
// check reads, and which names it itself).
void list_taken_from(const Json& defaults, const Json& given, const std::string& prefix, C& config) {
  for (const auto& [name, node] : defaults.items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const Json mine = given.is_object() && given.contains(name) ? given[name] : Json();
    if (node.is_object()) {
      list_taken_from(node, mine, key, config);
    } else if (mine.is_null() && key != "repro.scenario" && key != "ds_config.train_micro_batch_size_per_gpu") {
      config.taken_from_scenario.push_back(key + " = " + toml_value(node));
    }
  }
}

void throw_refusals(const std::vector<std::string>& refusals, const std::string& source_name) {
  if (refusals.size() == 1) throw InputError(refusals.front());
  // One line, as every usage error: the refusals side by side, numbered.
  std::string message = "config " + source_name + ": " + std::to_string(refusals.size()) + " settings refused:";
  for (size_t i = 0; i < refusals.size(); ++i) {
    message += (i ? "; (" : " (") + std::to_string(i + 1) + ") " + refusals[i];
  }
  throw InputError(message);
}

bool has_settings(const Json& table) {
  return std::any_of(table.begin(), table.end(),
                     [](const Json& node) { return !node.is_object() || has_settings(node); });
}

ReproConfig read_config(const std::string& text, const std::vector<std::string>& overrides,
                        const std::string& source_name, ConfigFormat format, bool users_file) {
  C config;
  Json given = detail::read_document(text, source_name, format, config.ignored);
  SEQPAR_INPUT_CHECK(!users_file || has_settings(given) || !config.ignored.empty(), "config ", source_name,
                     " holds no settings: leave out --config to run the built-in scenario, or start from what "
                     "seqpar-repro --print-config prints");
  for (const std::string& assignment : overrides) merge(given, detail::read_override(assignment));

  // Read over the defaults of the scenario it names, else the first (an unknown name is
  // refused when the key itself is read).
  const Json repro = given.value("repro", Json());
  const Json named = repro.is_object() ? repro.value("scenario", Json()) : Json();
  const ScenarioConfig& scenario = scenario_config(named.is_string() ? named.get<std::string>() : "");
  Json merged = detail::read_document(scenario.toml, scenario.file, ConfigFormat::Toml, config.ignored);
  if (users_file) list_taken_from(merged, given, "", config);
  merge(merged, given);
  Reading reading{config, {}};
  read_table(merged, "", reading);
  // A value that the checks of validate() refuse (ZeRO-3 outside its scenario, say) is
  // named beside the keys refused while reading, not on the next run.
  try {
    validate(config);
  } catch (const InputError& error) {
    reading.refusals.emplace_back(error.what());
  }
  if (!reading.refusals.empty()) throw_refusals(reading.refusals, source_name);
  // The report's script feeds x whole: the micro-batch size only takes part in
  // DeepSpeed's check of train_batch_size.
  config.ignored.push_back({"ds_config.train_micro_batch_size_per_gpu = " +
                                std::to_string(config.train_micro_batch_size_per_gpu),
                            "unused: x is fed whole, as in the report's script; checked against train_batch_size"});
  return config;
}

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> names;
  for (const auto& [name, key] : keys()) names.push_back(name);
  return names;
}

std::string to_toml(const ReproConfig& config) {
  // Each section under its header, the keys below it dotted: optimizer.params.lr = 1e-4.
  std::string out, section;
  for (const auto& [name, key] : keys()) {
    const Json value = key.write(config);
    const std::string table = name.substr(0, name.find('.'));
    if (value.is_null()) continue;
    if (table != section) out += (out.empty() ? "[" : "\n[") + (section = table) + "]\n";
    out += name.substr(table.size() + 1) + " = " + toml_value(value) + "\n";
  }
  return out;
}

std::string shortest_float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const std::string text(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
  const size_t e = text.find('e');
  if (e == std::string::npos) return text.find('.') == std::string::npos ? text + ".0" : text;
  // 1e-04 -> 1e-4, 5e+08 -> 5e8: the exponent without a plus sign or leading zeros.
  return text.substr(0, e + 1) + std::to_string(std::stoi(text.substr(e + 1)));
}

ConfigFormat config_format_for(const std::string& path, const std::string& text) {
  const std::string extension = std::filesystem::path(path).extension();
  if (extension == ".toml") return ConfigFormat::Toml;
  if (extension == ".json") return ConfigFormat::Json;
  if (extension == ".yaml" || extension == ".yml") return ConfigFormat::Yaml;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    if (line[first] == '{') return ConfigFormat::Json;
    // `key =` is TOML: an '=' before any ':' (npos, when there is none, is the largest).
    return line[first] == '[' || line.find('=') < line.find(':') ? ConfigFormat::Toml : ConfigFormat::Yaml;
  }
  return ConfigFormat::Toml;
}

ReproConfig parse_config(const std::string& text, const std::vector<std::string>& overrides,
                         const std::string& source_name, ConfigFormat format) {
  return read_config(text, overrides, source_name, format, false);
}

ReproConfig parse_users_config(const std::string& text, const std::vector<std::string>& overrides,
                               const std::string& source_name, ConfigFormat format) {
  return read_config(text, overrides, source_name, format, true);
}

ReproConfig load_config(const std::string& path) {
  const std::string text = read_config_file(path);
  return parse_users_config(text, {}, path, config_format_for(path, text));
}

}  // namespace seqpar::repro
