#include "apps/repro/config_formats.h"

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>

#include "core/error.h"

namespace seqpar::repro::detail {

namespace {

std::string join_key(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// ---------------------------------------------------------------- YAML

// A plain (unquoted) scalar typed as OmegaConf types it: YAML 1.1's booleans, integers
// and nulls, and a float pattern that also takes exponents without a dot (`1e-4`).
// Returns null for a YAML null.
std::unique_ptr<toml::node> typed_plain_scalar(const std::string& text) {
  static const std::regex null_pattern("~|null|Null|NULL|");
  static const std::regex true_pattern("yes|Yes|YES|true|True|TRUE|on|On|ON");
  static const std::regex false_pattern("no|No|NO|false|False|FALSE|off|Off|OFF");
  static const std::regex integer_pattern("[-+]?(0|[1-9][0-9_]*)");
  static const std::regex hex_pattern("[-+]?0x[0-9a-fA-F_]+");
  static const std::regex float_pattern(
      "[-+]?([0-9][0-9_]*)\\.[0-9_]*([eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|"
      "[-+]?\\.[0-9_]+([eE][-+]?[0-9]+)?");
  static const std::regex infinity_pattern("[-+]?\\.(inf|Inf|INF)");
  static const std::regex nan_pattern("\\.(nan|NaN|NAN)");
  std::string digits = text;
  digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
  if (std::regex_match(text, null_pattern)) return nullptr;
  if (std::regex_match(text, true_pattern)) return std::make_unique<toml::value<bool>>(true);
  if (std::regex_match(text, false_pattern)) return std::make_unique<toml::value<bool>>(false);
  try {
    if (std::regex_match(text, integer_pattern)) {
      return std::make_unique<toml::value<int64_t>>(std::stoll(digits, nullptr, 10));
    }
    if (std::regex_match(text, hex_pattern)) {
      return std::make_unique<toml::value<int64_t>>(std::stoll(digits, nullptr, 16));
    }
    if (std::regex_match(text, float_pattern)) {
      return std::make_unique<toml::value<double>>(std::stod(digits));
    }
  } catch (const std::out_of_range&) {
    // Too large for int64 or double: left as text, so the key's reader names it.
  }
  if (std::regex_match(text, infinity_pattern)) {
    const double infinity = std::numeric_limits<double>::infinity();
    return std::make_unique<toml::value<double>>(text[0] == '-' ? -infinity : infinity);
  }
  if (std::regex_match(text, nan_pattern)) {
    return std::make_unique<toml::value<double>>(std::numeric_limits<double>::quiet_NaN());
  }
  return std::make_unique<toml::value<std::string>>(text);
}

// Returns null for a YAML null; nulls inside mappings are dropped by the caller.
std::unique_ptr<toml::node> from_yaml(const YAML::Node& node, const std::string& key,
                                      std::vector<ConfigNote>& ignored);

toml::table yaml_mapping(const YAML::Node& node, const std::string& key,
                         std::vector<ConfigNote>& ignored) {
  toml::table table;
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>();
    const std::string path = join_key(key, name);
    std::unique_ptr<toml::node> value = from_yaml(entry.second, path, ignored);
    if (!value) {
      ignored.push_back({path, "null: DeepSpeed's default"});
      continue;
    }
    table.insert_or_assign(name, std::move(*value));
  }
  return table;
}

std::unique_ptr<toml::node> from_yaml(const YAML::Node& node, const std::string& key,
                                      std::vector<ConfigNote>& ignored) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return std::make_unique<toml::table>(yaml_mapping(node, key, ignored));
    case YAML::NodeType::Sequence: {
      toml::array array;
      for (size_t i = 0; i < node.size(); ++i) {
        std::unique_ptr<toml::node> item =
            from_yaml(node[i], key + "[" + std::to_string(i) + "]", ignored);
        SEQPAR_INPUT_CHECK(item != nullptr, "config key ", key, "[", i, "] is null");
        array.push_back(std::move(*item));
      }
      return std::make_unique<toml::array>(std::move(array));
    }
    case YAML::NodeType::Scalar:
      // "!" marks a quoted scalar: a string whatever it looks like.
      if (node.Tag() == "!") return std::make_unique<toml::value<std::string>>(node.Scalar());
      return typed_plain_scalar(node.Scalar());
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------- JSON

std::unique_ptr<toml::node> from_json(const nlohmann::json& value, const std::string& key,
                                      std::vector<ConfigNote>& ignored) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::object: {
      auto table = std::make_unique<toml::table>();
      for (const auto& [name, item] : value.items()) {
        const std::string path = join_key(key, name);
        std::unique_ptr<toml::node> converted = from_json(item, path, ignored);
        if (!converted) {
          ignored.push_back({path, "null: DeepSpeed's default"});
          continue;
        }
        table->insert_or_assign(name, std::move(*converted));
      }
      return table;
    }
    case Type::array: {
      auto array = std::make_unique<toml::array>();
      for (size_t i = 0; i < value.size(); ++i) {
        std::unique_ptr<toml::node> item =
            from_json(value[i], key + "[" + std::to_string(i) + "]", ignored);
        SEQPAR_INPUT_CHECK(item != nullptr, "config key ", key, "[", i, "] is null");
        array->push_back(std::move(*item));
      }
      return array;
    }
    case Type::string:
      return std::make_unique<toml::value<std::string>>(value.get<std::string>());
    case Type::boolean:
      return std::make_unique<toml::value<bool>>(value.get<bool>());
    case Type::number_integer:
      return std::make_unique<toml::value<int64_t>>(value.get<int64_t>());
    case Type::number_unsigned:
      SEQPAR_INPUT_CHECK(value.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()),
                         "config key ", key, " = ", value.get<uint64_t>(), " is too large");
      return std::make_unique<toml::value<int64_t>>(value.get<int64_t>());
    case Type::number_float:
      return std::make_unique<toml::value<double>>(value.get<double>());
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------- layout

// seqpar's layout from a document: the report's (`ds_config` at the top) or DeepSpeed's
// (the document is the ds_config). Top-level keys outside both are not read.
toml::table arrange(toml::table document, const std::string& source,
                    std::vector<ConfigNote>& ignored) {
  toml::table arranged;
  if (toml::node* repro = document.get("repro")) {
    SEQPAR_INPUT_CHECK(repro->is_table(), "config ", source, ": repro must be a mapping");
    arranged.insert("repro", std::move(*repro->as_table()));
    document.erase("repro");
  }
  toml::node* ds_config = document.get("ds_config");
  if (!ds_config) {
    arranged.insert("ds_config", std::move(document));
    return arranged;
  }
  SEQPAR_INPUT_CHECK(ds_config->is_table(), "config ", source,
                     ": ds_config must be a mapping of DeepSpeed keys");
  arranged.insert("ds_config", std::move(*ds_config->as_table()));
  for (const auto& [name, node] : document) {
    if (name.str() != "ds_config") {
      ignored.push_back({std::string(name.str()), "outside ds_config: not a DeepSpeed key"});
    }
  }
  return arranged;
}

}  // namespace

toml::table read_yaml_document(const std::string& text, const std::string& source,
                               std::vector<ConfigNote>& ignored) {
  YAML::Node document;
  try {
    document = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.mark.line + 1, " column ",
                      error.mark.column + 1, ": ", error.msg);
  }
  if (document.IsNull()) return arrange(toml::table{}, source, ignored);
  SEQPAR_INPUT_CHECK(document.IsMap(), "config ", source,
                     ": expected a mapping at the top (ds_config: ...)");
  const std::string root = static_cast<const YAML::Node&>(document)["ds_config"] ? "" : "ds_config";
  return arrange(yaml_mapping(document, root, ignored), source, ignored);
}

toml::table read_json_document(const std::string& text, const std::string& source,
                               std::vector<ConfigNote>& ignored) {
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    SEQPAR_INPUT_FAIL("config ", source, ": ", error.what());
  }
  SEQPAR_INPUT_CHECK(document.is_object(), "config ", source,
                     ": expected a JSON object of DeepSpeed keys at the top");
  const std::string root = document.contains("ds_config") ? "" : "ds_config";
  return arrange(std::move(*from_json(document, root, ignored)->as_table()), source, ignored);
}

}  // namespace seqpar::repro::detail
