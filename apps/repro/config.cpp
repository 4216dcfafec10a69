#include "apps/repro/config.h"

#include "third_party/toml.h"

#include <algorithm>
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

using detail::Json;
using Reader = std::function<void(const Json&, const std::string& key, ReproConfig&)>;

std::string describe(const Json& node) {
  if (node.is_string()) return '"' + abbreviated(node.get<std::string>()) + '"';
  if (node.is_array() || node.is_object()) return node.is_array() ? "an array" : "a table";
  return node.is_number_float() ? shortest_float_text(node.get<double>()) : node.dump();
}

// Hugging Face's Trainer writes "auto" into a DeepSpeed config and fills the values in
// before DeepSpeed reads it; seqpar-repro has no Trainer to ask.
void check_not_auto(const Json& node, const std::string& key) {
  SEQPAR_INPUT_CHECK(node != "auto",
                     "config key ", key, " = \"auto\": a placeholder the Hugging Face Trainer "
                     "fills in; write the value (or leave the key out for the scenario's)");
}

// The value as TOML text, floats in their shortest form.
std::string toml_value_text(const Json& node) {
  if (!node.is_array()) return describe(node);
  std::string text;
  for (const Json& item : node) text += (text.empty() ? "" : ", ") + toml_value_text(item);
  return "[" + text + "]";
}

int64_t read_integer(const Json& node, const std::string& key) {
  check_not_auto(node, key);
  SEQPAR_INPUT_CHECK(node.is_number_integer(), "config key ", key, " must be an integer, got ", describe(node));
  SEQPAR_INPUT_CHECK(!node.is_number_unsigned() || node.get<uint64_t>() <= uint64_t(INT64_MAX),
                     "config key ", key, " = ", describe(node), " is too large");
  return node.get<int64_t>();
}

double read_number(const Json& node, const std::string& key) {
  check_not_auto(node, key);
  SEQPAR_INPUT_CHECK(node.is_number(), "config key ", key, " must be a number, got ", describe(node));
  // An integer is a double exactly only up to 2^53 in magnitude; past it, an error
  // rather than a value rounded unseen.
  constexpr int64_t kExact = int64_t(1) << 53;
  const bool exact = node.is_number_float() ||
                     (node.is_number_unsigned() ? node.get<uint64_t>() <= uint64_t(kExact)
                                                : node >= -kExact && node <= kExact);
  SEQPAR_INPUT_CHECK(exact, "config key ", key,
                     " must be a number a double holds exactly (an integer at most 2^53 in "
                     "magnitude, or a float), got ", describe(node));
  return node.get<double>();
}

Reader integer_into(int64_t ReproConfig::*field) {
  return [field](const Json& node, const std::string& key, ReproConfig& config) {
    config.*field = read_integer(node, key);
  };
}

Reader number_into(double ReproConfig::*field) {
  return [field](const Json& node, const std::string& key, ReproConfig& config) {
    config.*field = read_number(node, key);
  };
}

// `setter` is one of AdamWOptions' named setters (&optim::AdamWOptions::lr).
Reader adamw_number_into(optim::AdamWOptions& (optim::AdamWOptions::*setter)(double)) {
  return [setter](const Json& node, const std::string& key, ReproConfig& config) {
    (config.adamw.*setter)(read_number(node, key));
  };
}

void read_betas(const Json& node, const std::string& key, ReproConfig& config) {
  check_not_auto(node, key);
  SEQPAR_INPUT_CHECK(node.is_array() && node.size() == 2, "config key ", key,
               " must be an array of two numbers, got ", describe(node));
  config.adamw.betas({read_number(node[0], key + "[0]"), read_number(node[1], key + "[1]")});
}

void read_optimizer_type(const Json& node, const std::string& key, ReproConfig& config) {
  check_not_auto(node, key);
  SEQPAR_INPUT_CHECK(node.is_string(), "config key ", key, " must be a string, got ", describe(node));
  config.optimizer_type = node.get<std::string>();
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

void read_scenario(const Json& node, const std::string& key, ReproConfig& config) {
  SEQPAR_INPUT_CHECK(node.is_string() && is_scenario(node.get<std::string>()), "config key ", key,
                     " = ", describe(node), ": expected one of ", scenario_names(),
                     " (seqpar-repro --list-scenarios)");
  config.scenario = node.get<std::string>();
}

void read_seed(const Json& node, const std::string& key, ReproConfig& config) {
  const int64_t seed = read_integer(node, key);
  SEQPAR_INPUT_CHECK(seed >= 0, "config key ", key, " = ", seed, ": the seed must not be negative");
  config.seed = static_cast<uint64_t>(seed);
}

void read_zero_stage(const Json& node, const std::string& key, ReproConfig& config) {
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

// The report's script feeds x whole, so the micro-batch size only takes part in
// DeepSpeed's check of train_batch_size (validate()).
void read_micro_batch(const Json& node, const std::string& key, ReproConfig& config) {
  config.train_micro_batch_size_per_gpu = read_integer(node, key);
  config.ignored.push_back({key + " = " + describe(node),
                            "unused: x is fed whole, as in the report's script; checked "
                            "against train_batch_size"});
}

void read_train_batch(const Json& node, const std::string& key, ReproConfig& config) {
  config.train_batch_size = read_integer(node, key);
}

const std::map<std::string, Reader>& schema() {
  static const std::map<std::string, Reader> keys = {
      {"ds_config.train_micro_batch_size_per_gpu", read_micro_batch},
      {"ds_config.train_batch_size", read_train_batch},
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
      {"repro.heads", integer_into(&ReproConfig::heads)},
      {"repro.head_dim", integer_into(&ReproConfig::head_dim)},
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

// A tree of keys being read into a configuration. Every refusal is kept, so that all of
// a config's problems are reported at once rather than one a run.
struct Reading {
  ReproConfig& config;
  std::vector<std::string> refusals;
};

void read_unmodelled_key(const Json& node, const std::string& key, Reading& reading);

// A null in YAML or JSON is DeepSpeed's "not set": no default is guessed for a key the
// scenario reads, DeepSpeed's or the scenario's; any other key is left to DeepSpeed.
void read_null(const std::string& key, Reading& reading) {
  SEQPAR_INPUT_CHECK(schema().count(key) == 0, "config key ", key, " is null: write a value",
                     key == "ds_config.gradient_clipping" ? " (0 turns clipping off)" : "",
                     ", or leave the key out to take the scenario's");
  reading.config.ignored.push_back({key, "null: DeepSpeed's default"});
}

// Reads every leaf of `table` (recursively) through the schema.
void read_table(const Json& table, const std::string& prefix, Reading& reading) {
  for (const auto& [name, node] : table.items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    // "optimizer.params.lr" as one key would read as the nested lr: refused, not joined.
    SEQPAR_INPUT_CHECK(name.find('.') == std::string::npos, "config key \"", printable(name), "\"",
                       prefix.empty() ? "" : " in " + prefix, " has a '.' in its name; nest the keys instead");
    const auto known = schema().find(key);
    try {
      if (node.is_null()) {
        read_null(key, reading);
      } else if (known != schema().end()) {
        known->second(node, key, reading.config);
      } else if (node.is_object() && is_known_table(key)) {
        read_table(node, key, reading);
      } else {
        read_unmodelled_key(node, key, reading);
      }
    } catch (const InputError& error) {
      reading.refusals.emplace_back(error.what());
    }
  }
}

// A key outside the schema: a DeepSpeed key the scenario can do without, or an error.
void read_unmodelled_key(const Json& node, const std::string& key, Reading& reading) {
  const detail::KeyDecision decision = detail::deepspeed_key_decision(key, node);
  switch (decision.treatment) {
    case detail::KeyTreatment::Ignore:
      reading.config.ignored.push_back(
          {node.is_structured() ? key : key + " = " + describe(node), decision.reason});
      return;
    case detail::KeyTreatment::Descend:
      read_table(node, key, reading);
      return;
    case detail::KeyTreatment::Refuse:
      SEQPAR_INPUT_FAIL("config key ", printable(key), node.is_structured() ? "" : " = " + describe(node),
                        " is not supported: ", decision.reason);
    case detail::KeyTreatment::Unknown:
      break;
  }
  // A typo is looked for among the keys of the same table ("repro.setps": repro.steps).
  const size_t dot = key.rfind('.');
  const std::string table = key.substr(0, dot + 1);
  std::vector<std::string> known;
  for (const auto& entry : schema()) {
    if (entry.first.rfind(table, 0) == 0 && entry.first.find('.', table.size()) == std::string::npos) {
      known.push_back(entry.first.substr(table.size()));
    }
  }
  const std::string last = closest_name(key.substr(dot + 1), known);
  const std::string near = last.empty() ? "" : table + last;
  SEQPAR_INPUT_FAIL("unknown config key ", abbreviated(key),
                    near.empty() ? "" : "; did you mean " + near + "?",
                    " (seqpar-repro --print-config shows every key)");
}

// ---------------------------------------------------------------- overrides

// An override's value as TOML, or else, when it is a bare word (letters, digits and
// -_.+:/ only, as `AdamW` or `issue-6868`), as that string: so `--set
// ds_config.optimizer.type=AdamW` needs no quotes. Anything else that is not TOML
// (an unclosed array, a stray quote) is an error.
Json parse_override_value(const std::string& key, const std::string& text) {
  const std::string value_text = "value = " + text;
  check_config_text(value_text, "--set " + key);
  toml::table parsed;
  try {
    parsed = toml::parse(value_text);
  } catch (const toml::parse_error& error) {
    const bool bare_word = !text.empty() && text.find_first_not_of(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.+:/") == std::string::npos;
    SEQPAR_INPUT_CHECK(bare_word, "--set ", key, "=", text, ": the value is not TOML (",
                       error.description(), ")");
    return text;
  }
  SEQPAR_INPUT_CHECK(parsed.size() == 1 && parsed.contains("value"), "--set ", key, "=", text,
                     ": expected one TOML value");
  return detail::from_toml(*parsed.get("value"));
}

// "ds_config.optimizer.params.lr=3e-4": sets that key in `table`, creating tables on
// the way. The value is parsed as TOML, so its type is what it looks like. It must be
// one value on one line: a line break would let the rest of the text become more TOML
// (new tables and keys) that the parser would take in silence.
void apply_override(Json& table, const std::string& assignment) {
  for (const char c : assignment) {
    SEQPAR_INPUT_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7F, "--set ",
                       printable(assignment), ": control characters (line breaks, ...) are "
                       "not allowed; the value must be one TOML value on one line");
  }
  const size_t equals = assignment.find('=');
  SEQPAR_INPUT_CHECK(equals != std::string::npos && equals > 0, "--set ", assignment,
                     ": expected section.key=value");
  const std::string key = assignment.substr(0, equals);
  const std::vector<std::string> parts = split_override_key(key);
  Json value = parse_override_value(key, assignment.substr(equals + 1));
  Json* where = &table;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!where->contains(parts[i])) (*where)[parts[i]] = Json::object();
    where = &(*where)[parts[i]];
    SEQPAR_INPUT_CHECK(where->is_object(), "--set ", key, ": ", parts[i], " is not a table");
  }
  (*where)[parts.back()] = std::move(value);
}

// ---------------------------------------------------------------- reading a config

Json read_document(const std::string& text, const std::string& source_name,
                   ConfigFormat format, std::vector<ConfigNote>& notes) {
  if (format == ConfigFormat::Yaml) return detail::read_yaml_document(text, source_name, notes);
  if (format == ConfigFormat::Json) return detail::read_json_document(text, source_name, notes);
  return detail::read_toml_document(text, source_name);
}

// table[name], or null when `table` is not a table or lacks the key (--set can make
// any key any value).
const Json* member(const Json& table, const std::string& name) {
  const auto found = table.is_object() ? table.find(name) : table.end();
  return found == table.end() ? nullptr : &*found;
}

bool has_settings(const Json& table) {
  for (const Json& node : table) {
    if (!node.is_object() || has_settings(node)) return true;
  }
  return false;
}

// The scenario whose defaults the configuration is read over: the one it names, else
// the first (an unknown name is refused when the key itself is read).
const ScenarioConfig& defaults_for(const Json& table) {
  const Json* repro = member(table, "repro");
  const Json* scenario = repro ? member(*repro, "scenario") : nullptr;
  return scenario_config(scenario && scenario->is_string() ? scenario->get<std::string>() : "");
}

// "key = value" for every leaf of `defaults` that `given` lacks: what the user's config
// takes from the scenario. The micro-batch size is left out, since nothing reads it
// but the train_batch_size check, which names it itself.
void list_taken_from(const Json& defaults, const Json& given, const std::string& prefix,
                     std::vector<std::string>& taken) {
  for (const auto& [name, node] : defaults.items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    const Json* mine = member(given, name);
    if (node.is_object()) {
      list_taken_from(node, mine ? *mine : Json::object(), key, taken);
    } else if (!mine && key != "repro.scenario" && key != "ds_config.train_micro_batch_size_per_gpu") {
      taken.push_back(key + " = " + toml_value_text(node));
    }
  }
}

void throw_refusals(const std::vector<std::string>& refusals, const std::string& source_name) {
  if (refusals.empty()) return;
  if (refusals.size() == 1) throw InputError(refusals.front());
  // One line, as every usage error: the refusals side by side, numbered.
  std::string message =
      "config " + source_name + ": " + std::to_string(refusals.size()) + " settings refused:";
  for (size_t i = 0; i < refusals.size(); ++i) {
    message += (i == 0 ? " (" : "; (") + std::to_string(i + 1) + ") " + refusals[i];
  }
  throw InputError(message);
}

// One note a key: a key the user's config sets replaces the scenario's note on it.
void keep_last_note_per_key(std::vector<ConfigNote>& notes) {
  auto key_of = [](const ConfigNote& note) { return note.key.substr(0, note.key.find(" = ")); };
  std::vector<ConfigNote> kept;
  for (auto note = notes.rbegin(); note != notes.rend(); ++note) {
    const bool seen = std::any_of(kept.begin(), kept.end(),
                                  [&](const ConfigNote& k) { return key_of(k) == key_of(*note); });
    if (!seen) kept.insert(kept.begin(), *note);
  }
  notes = std::move(kept);
}

ReproConfig read_config(const std::string& text, const std::vector<std::string>& overrides,
                        const std::string& source_name, ConfigFormat format, bool users_file) {
  std::vector<ConfigNote> notes;
  Json table = read_document(text, source_name, format, notes);
  SEQPAR_INPUT_CHECK(!users_file || has_settings(table) || !notes.empty(), "config ",
                     source_name, " holds no settings: leave out --config to run the built-in "
                     "scenario, or start from what seqpar-repro --print-config prints");
  for (const std::string& assignment : overrides) apply_override(table, assignment);

  const ScenarioConfig& scenario = defaults_for(table);
  const Json defaults = detail::from_toml(toml::parse(std::string_view(scenario.toml), std::string_view(scenario.file)));
  ReproConfig config;
  Reading reading{config, {}};
  read_table(defaults, "", reading);
  SEQPAR_CHECK(reading.refusals.empty(), scenario.file, ": ", reading.refusals.front());
  if (users_file) list_taken_from(defaults, table, "", config.taken_from_scenario);

  config.ignored.insert(config.ignored.end(), notes.begin(), notes.end());
  read_table(table, "", reading);
  // Every refusal at once: a value the checks of validate() refuse (ZeRO-3 outside its
  // scenario, say) is named beside the keys refused while reading, not on the next run.
  try {
    validate(config);
  } catch (const InputError& error) {
    reading.refusals.emplace_back(error.what());
  }
  throw_refusals(reading.refusals, source_name);
  keep_last_note_per_key(config.ignored);
  return config;
}

}  // namespace

// ---------------------------------------------------------------- public

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& entry : schema()) keys.push_back(entry.first);
  return keys;
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
