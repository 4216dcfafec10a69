#include "apps/diagnose/settings.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/common/input_file.h"
#include "apps/common/json_limits.h"
#include "apps/common/text.h"
#include "apps/repro/config_input.h"
#include "apps/repro/config.h"
#include "core/error.h"

namespace seqpar::diagnose {

namespace {

using nlohmann::json;

void take(const repro::ReproConfig& config, Settings& settings) {
  settings.lr = config.adamw.lr();
  settings.beta1 = config.adamw.beta1();
  settings.beta2 = config.adamw.beta2();
  settings.eps = config.adamw.eps();
  settings.weight_decay = config.adamw.weight_decay();
  settings.clipping = config.gradient_clipping;
  settings.sp = int(config.sequence_parallel_size);
  settings.dp = int(config.data_parallel_size);
  // seqpar-repro feeds each replica repro.rows rows: the batch's tokens.
  settings.tokens = config.rows * config.data_parallel_size;
}

// DeepSpeed's mixed precision: "bf16": {"enabled": true} (or "bfloat16", its older
// name) and "fp16": {"enabled": true}. "auto" (the Trainer fills it in) is not known.
std::optional<Precision> read_precision(const json& config, const std::string& path, Settings& s) {
  std::optional<Precision> found;
  const struct {
    const char* key;
    Precision precision;
  } sections[] = {{"bf16", Precision::BFloat16}, {"bfloat16", Precision::BFloat16}, {"fp16", Precision::Float16}};
  for (const auto& section : sections) {
    if (!config.contains(section.key)) continue;
    const json& value = config.at(section.key);
    SEQPAR_INPUT_CHECK(value.is_object(), "--ds-config ", path, ": ", section.key, " is ", value.dump(),
                       ", not an object ({\"enabled\": true})");
    if (!value.contains("enabled")) continue;  // DeepSpeed's default: off
    const json& enabled = value.at("enabled");
    if (enabled == "auto") {
      s.sources.push_back(std::string(section.key) + ".enabled is \"auto\" in " + path +
                          ": the precision is the saved tensors' unless --precision gives it");
      continue;
    }
    SEQPAR_INPUT_CHECK(enabled.is_boolean(), "--ds-config ", path, ": ", section.key, ".enabled is ", enabled.dump(),
                       ", not true or false");
    if (enabled.get<bool>()) found = found ? coarser(*found, section.precision) : section.precision;
  }
  return found;
}

// Reads one key of `object` into `target`: a number, "auto" (the flag is recorded), or
// absent (`fallback`, when given, with `defaulted` noting it).
struct KeyReader {
  const std::string& path;
  DeepSpeedSettings& out;
  std::vector<std::string> defaulted;

  void number(const json& object, const std::string& key, const std::string& shown, const char* flag,
              std::optional<double>& target, std::optional<double> fallback) {
    if (!object.contains(key)) {
      target = fallback;
      if (fallback) defaulted.push_back(shown + " " + format(*fallback));
      return;
    }
    const json& value = object.at(key);
    if (value.is_string() && value.get<std::string>() == "auto") {
      if (shown == "optimizer.params.lr") out.lr_is_auto = true;
      else out.settings.sources.push_back(shown + " is \"auto\" in " + path + ": unknown unless " + flag + " gives it");
      return;
    }
    SEQPAR_INPUT_CHECK(value.is_number(), "--ds-config ", path, ": ", shown, " is ", value.dump(), ", not a number");
    target = value.get<double>();
  }

  static std::string format(double value) {
    std::ostringstream text;
    text << value;
    return text.str();
  }
};

void read_optimizer(const json& config, const std::string& path, KeyReader& keys, Settings& s) {
  if (!config.contains("optimizer")) {
    s.sources.push_back(path + " has no optimizer section (the client's optimizer): lr, betas, eps and "
                        "weight decay are unknown unless given (--lr, --betas, --eps, --weight-decay)");
    return;
  }
  const json& optimizer = config.at("optimizer");
  SEQPAR_INPUT_CHECK(optimizer.is_object(), "--ds-config ", path, ": optimizer is not an object");
  std::string type = optimizer.value("type", std::string("Adam"));
  std::string lower = type;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool adam = lower == "adam" || lower == "adamw" || lower == "fusedadam";
  const json params = optimizer.value("params", json::object());
  SEQPAR_INPUT_CHECK(params.is_object(), "--ds-config ", path, ": optimizer.params is not an object");
  const auto maybe = [&](double value) { return adam ? std::optional<double>(value) : std::nullopt; };
  keys.number(params, "lr", "optimizer.params.lr", "--lr", s.lr, maybe(1e-3));
  keys.number(params, "eps", "optimizer.params.eps", "--eps", s.eps, maybe(1e-8));
  keys.number(params, "weight_decay", "optimizer.params.weight_decay", "--weight-decay", s.weight_decay, maybe(0));
  if (params.contains("betas") && params.at("betas") == "auto") {
    s.sources.push_back("optimizer.params.betas is \"auto\" in " + path + ": unknown unless --betas gives them");
  } else if (params.contains("betas")) {
    const json& betas = params.at("betas");
    SEQPAR_INPUT_CHECK(betas.is_array() && betas.size() == 2 && betas[0].is_number() && betas[1].is_number(),
                       "--ds-config ", path, ": optimizer.params.betas is ", betas.dump(), ", not [b1, b2]");
    s.beta1 = betas[0].get<double>();
    s.beta2 = betas[1].get<double>();
  } else if (adam) {
    s.beta1 = 0.9;
    s.beta2 = 0.999;
    keys.defaulted.push_back("betas 0.9, 0.999");
  }
  if (!adam) {
    s.sources.push_back("optimizer " + type + " in " + path + ": the first-step rule and the moments' checks "
                        "assume Adam, so they are not applied unless --betas is given");
  }
}

int mesh_size(const json& config, const std::string& key, const std::string& path) {
  if (!config.contains(key) || config.at(key) == "auto") return 0;
  const json& value = config.at(key);
  SEQPAR_INPUT_CHECK(value.is_number_integer() && value.get<int64_t>() >= 1 && value.get<int64_t>() <= (1 << 16),
                     "--ds-config ", path, ": ", key, " is ", value.dump(), ", not a size from 1 to 65536");
  return int(value.get<int64_t>());
}

// sp and dp not given: from the number of rank files. Fails when sp x dp cannot be
// the number of files (one rank's files alone are accepted).
void mesh_from_files(Settings& settings, int ranks) {
  if (settings.sp == 0 && settings.dp == 0) {
    settings.sp = ranks;
    settings.dp = 1;
    if (ranks > 1) settings.sources.push_back("assumed sp " + std::to_string(ranks) + " x dp 1 (one rank file each; --sp and --dp say otherwise)");
  } else if (settings.sp == 0) {
    SEQPAR_INPUT_CHECK(ranks % settings.dp == 0 || ranks == 1, "dp ", settings.dp, ": ", ranks,
                       " rank file(s) are not a multiple of it (missing ranks?)");
    settings.sp = ranks == 1 ? 1 : ranks / settings.dp;
  } else if (settings.dp == 0) {
    SEQPAR_INPUT_CHECK(ranks % settings.sp == 0 || ranks == 1, "sp ", settings.sp, ": ", ranks,
                       " rank file(s) are not a multiple of it (missing ranks?)");
    settings.dp = ranks == 1 ? 1 : ranks / settings.sp;
  }
  const int64_t mesh = int64_t(settings.sp) * int64_t(settings.dp);
  SEQPAR_INPUT_CHECK(ranks == 1 || mesh == ranks, "sp ", settings.sp, " x dp ", settings.dp, " = ", mesh,
                     " ranks, but --ranks names ", ranks, " file(s) (missing ranks, or give --sp and --dp)");
}

}  // namespace

DeepSpeedSettings read_ds_config(const std::string& text, const std::string& path) {
  json config;
  try {
    scan_json(text, "--ds-config " + path);  // the depth; DeepSpeed takes a key given twice as its last
    config = json::parse(text);
  } catch (const json::exception& error) {
    SEQPAR_INPUT_FAIL("--ds-config ", path, ": not JSON (", error.what(), ")");
  }
  SEQPAR_INPUT_CHECK(config.is_object(), "--ds-config ", path, ": not a JSON object");
  const std::vector<std::string> read_keys = {"optimizer", "gradient_clipping", "sequence_parallel_size",
                                              "data_parallel_size"};
  for (const auto& item : config.items()) {
    for (const std::string& known : read_keys) {
      const size_t apart = edit_distance(item.key(), known);
      SEQPAR_INPUT_CHECK(apart == 0 || apart > 2, "--ds-config ", path, ": key '", item.key(),
                         "': did you mean '", known, "'?");
    }
  }
  DeepSpeedSettings out;
  Settings& s = out.settings;
  KeyReader keys{path, out, {}};
  read_optimizer(config, path, keys, s);
  out.precision = read_precision(config, path, s);
  keys.number(config, "gradient_clipping", "gradient_clipping", "--gradient-clipping", s.clipping, 0.0);
  s.sp = mesh_size(config, "sequence_parallel_size", path);
  s.dp = mesh_size(config, "data_parallel_size", path);
  std::string line = "optimizer and mesh from " + path;
  if (!keys.defaulted.empty()) {
    line += "; left out, so DeepSpeed's defaults:";
    for (size_t i = 0; i < keys.defaulted.size(); ++i) line += (i ? ", " : " ") + keys.defaulted[i];
  }
  s.sources.insert(s.sources.begin(), line);
  if (config.contains("scheduler")) {
    s.sources.push_back("a scheduler in " + path + " sets each step's lr: optimizer.params.lr is used unless "
                        "--lr gives the lr of the step saved");
  }
  return out;
}

namespace {

// Every dtype the run's files hold (the ranks' and the baseline's).
std::vector<std::string> saved_dtypes(const RunFiles& run) {
  std::vector<std::string> dtypes;
  const auto add = [&](const RankState& state) {
    for (const TensorSet* set : {&state.parameters, &state.gradients, &state.local_gradients, &state.exp_avg,
                                 &state.exp_avg_sq, &state.activations}) {
      for (const StoredTensor& tensor : set->tensors) dtypes.push_back(tensor.dtype);
    }
  };
  for (const RankState& rank : run.ranks) add(rank);
  if (run.baseline) add(*run.baseline);
  return dtypes;
}

}  // namespace

Settings resolve_settings(const SettingFlags& flags, const RunFiles& run) {
  Settings settings;
  bool lr_is_auto = false;
  std::optional<Precision> config_precision;
  const auto metadata = run.ranks[0].metadata.find("config");
  if (!flags.ds_config.empty()) {
    const std::string text = read_input_file(flags.ds_config, "--ds-config", repro::kMaxConfigBytes);
    const repro::ConfigFormat format = repro::config_format_for(flags.ds_config, text);
    if (format == repro::ConfigFormat::Json) {
      DeepSpeedSettings read = read_ds_config(text, flags.ds_config);
      settings = std::move(read.settings);
      lr_is_auto = read.lr_is_auto;
      config_precision = read.precision;
    } else {
      take(repro::parse_users_config(text, {}, abbreviated(flags.ds_config), format), settings);
      settings.sources.push_back("optimizer and mesh from " + flags.ds_config +
                                 " (a seqpar config: keys left out take the bug report's values)");
    }
  } else if (metadata != run.ranks[0].metadata.end() && run.ranks[0].metadata.count("producer") &&
             run.ranks[0].metadata.at("producer") == "seqpar-repro") {
    take(repro::parse_config(metadata->second, {}, run.ranks[0].files[0] + " (metadata)"), settings);
    settings.sources.push_back("optimizer and mesh from seqpar-repro's configuration in " + run.ranks[0].files[0]);
  }
  std::string given;
  const auto set = [&](const char* flag, std::optional<double>& target, const std::optional<double>& value) {
    if (!value) return;
    target = value;
    given += (given.empty() ? "" : ", ") + std::string(flag);
  };
  set("lr", settings.lr, flags.lr);
  set("beta1", settings.beta1, flags.beta1);
  set("beta2", settings.beta2, flags.beta2);
  set("eps", settings.eps, flags.eps);
  set("weight decay", settings.weight_decay, flags.weight_decay);
  set("gradient clipping", settings.clipping, flags.clipping);
  if (flags.sp) settings.sp = *flags.sp;
  if (flags.dp) settings.dp = *flags.dp;
  if (flags.sp) given += (given.empty() ? "" : ", ") + std::string("sp");
  if (flags.dp) given += (given.empty() ? "" : ", ") + std::string("dp");
  if (!given.empty()) settings.sources.push_back("from the command line: " + given);
  SEQPAR_INPUT_CHECK(!lr_is_auto || flags.lr, "--ds-config ", flags.ds_config, ": optimizer.params.lr is \"auto\" "
                     "(the Hugging Face Trainer fills it in): give the value with --lr");
  mesh_from_files(settings, int(run.ranks.size()));
  settings.attention_layout = flags.attention_layout;
  if (flags.tokens) {
    settings.tokens = flags.tokens;
    settings.sources.push_back("from the command line: tokens " + std::to_string(*flags.tokens));
  }
  // The precision every tolerance derives from: a run rounds at its coarsest precision,
  // so the saved dtypes and the config's mixed precision are combined, and --precision
  // (a bf16 run saved as float32, TF32 matmuls) overrides both.
  settings.precision = precision_of_dtypes(saved_dtypes(run));
  if (flags.precision) {
    settings.precision = {*flags.precision, "--precision"};
  } else if (config_precision && coarser(*config_precision, settings.precision.precision) == *config_precision &&
             *config_precision != settings.precision.precision) {
    settings.precision = {*config_precision, flags.ds_config + " (" + precision_name(*config_precision) +
                                                 ".enabled); the saved tensors are finer"};
  }
  // Values are held as float32 (F64 tensors are read rounded): nothing finer is judged.
  if (coarser(settings.precision.precision, Precision::Float32) != settings.precision.precision) {
    settings.precision = {Precision::Float32, settings.precision.source + "; the tensors are held as float32 (F64 "
                                              "read rounded), so float32's resolution, and 'bitwise' means equal "
                                              "as float32"};
  }
  settings.sources.push_back("precision " + precision_name(settings.precision.precision) + " (unit roundoff " +
                             number_text(unit_roundoff(settings.precision.precision)) + "), from " +
                             settings.precision.source);
  return settings;
}

}  // namespace seqpar::diagnose
