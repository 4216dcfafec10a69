// The configuration as text: the format a config file is in, and the TOML that
// --print-config writes (floats in their shortest round-trip form).
#include "apps/repro/config.h"

#include "third_party/toml.h"

#include <charconv>
#include <cmath>
#include <map>
#include <sstream>

namespace seqpar::repro {

std::string shortest_float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  std::string text(buffer, end);
  const size_t e = text.find('e');
  if (e == std::string::npos) {
    if (text.find('.') == std::string::npos) text += ".0";
    return text;
  }
  // 1e-04 -> 1e-4: the exponent without its leading zeros.
  size_t digits = e + 1 + (text[e + 1] == '-' || text[e + 1] == '+');
  while (digits + 1 < text.size() && text[digits] == '0') text.erase(digits, 1);
  if (text[e + 1] == '+') text.erase(e + 1, 1);
  return text;
}

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

namespace {

// toml++ writes a double with 17 significant digits (0.90000000000000002); each
// `name = value` line named in `floats` gets the value's shortest text instead.
std::string with_shortest_floats(const std::string& text,
                                 const std::map<std::string, std::string>& floats) {
  std::istringstream lines(text);
  std::string line, out;
  while (std::getline(lines, line)) {
    const size_t start = line.find_first_not_of(' ');
    const size_t equals = line.find(" = ");
    if (start != std::string::npos && equals != std::string::npos) {
      const auto replacement = floats.find(line.substr(start, equals - start));
      if (replacement != floats.end()) line = line.substr(0, equals + 3) + replacement->second;
    }
    out += line + '\n';
  }
  return out;
}

}  // namespace

std::string to_toml(const ReproConfig& c) {
  toml::table params{{"lr", c.adamw.lr()},
                     {"betas", toml::array{c.adamw.beta1(), c.adamw.beta2()}},
                     {"eps", c.adamw.eps()},
                     {"weight_decay", c.adamw.weight_decay()}};
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
  if (c.train_batch_size) ds_config.insert("train_batch_size", *c.train_batch_size);
  toml::table repro{{"seed", static_cast<int64_t>(c.seed)}, {"rows", c.rows},
                    {"in_features", c.in_features}, {"out_features", c.out_features},
                    {"steps", c.steps}, {"dropout", c.dropout}, {"scenario", c.scenario}};
  if (c.scenario == "ulysses") {  // only the ulysses scenario reads them
    repro.insert("heads", c.heads);
    repro.insert("head_dim", c.head_dim);
  }
  std::ostringstream out;
  out << toml::table{{"ds_config", ds_config}, {"repro", repro}} << '\n';
  const std::string betas = "[" + shortest_float_text(c.adamw.beta1()) + ", " +
                            shortest_float_text(c.adamw.beta2()) + "]";
  return with_shortest_floats(out.str(), {{"lr", shortest_float_text(c.adamw.lr())},
                                          {"betas", betas},
                                          {"eps", shortest_float_text(c.adamw.eps())},
                                          {"weight_decay", shortest_float_text(c.adamw.weight_decay())},
                                          {"gradient_clipping", shortest_float_text(c.gradient_clipping)},
                                          {"dropout", shortest_float_text(c.dropout)}});
}

}  // namespace seqpar::repro
