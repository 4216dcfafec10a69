#include "apps/repro/config_formats.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "apps/repro/config_input.h"
#include "apps/repro/config_limits.h"
#include "core/error.h"

namespace seqpar::repro::detail {

namespace {

std::string join_key(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The limits of apps/repro/config_limits.h, counted while a YAML document is converted
// (aliases make its tree larger than its text).
struct Conversion {
  const std::string& source;
  size_t values = 0, text_bytes = 0;

  std::string where(int line) const {
    return line > 0 ? seqpar::detail::concat("config ", source, " line ", line) : "config " + source;
  }
  // One more value of `bytes` of text, `depth` levels down.
  void count(int line, int depth, size_t bytes) {
    SEQPAR_INPUT_CHECK(depth <= kMaxConfigDepth, where(line), ": nested deeper than the limit of ",
                       kMaxConfigDepth, " levels (an alias that contains itself?)");
    SEQPAR_INPUT_CHECK(++values <= kMaxConfigValues, where(line), ": more than the limit of ",
                       kMaxConfigValues, " values (an alias counts each time it is used)");
    text_bytes += bytes;
    SEQPAR_INPUT_CHECK(text_bytes <= kMaxConfigTextBytes, where(line),
                       ": more than the limit of ", kMaxConfigTextBytes,
                       " bytes of text (an alias counts each time it is used)");
  }
};

// A top-level key's dotted name: `repro` is seqpar's own table in either layout.
std::string top_key(const std::string& root, const std::string& name) {
  return name == "repro" ? name : join_key(root, name);
}

// A name that nesting would take for a path ("optimizer.params.lr" is three keys, not one).
void check_key_name(const std::string& name, const std::string& path, const std::string& where) {
  SEQPAR_INPUT_CHECK(name.find('.') == std::string::npos, where, ": key \"", printable(path),
                     "\" has a '.' in its name; nest the keys instead (optimizer: {params: ...})");
}

// ---------------------------------------------------------------- YAML

const std::string kYamlTag = "tag:yaml.org,2002:";

int line_of(const YAML::Node& node) { return node.Mark().is_null() ? 0 : node.Mark().line + 1; }

// A scalar as OmegaConf reads it: quoted or !!str is a string; !!int, !!float, !!bool
// and !!null must look like one; other tags (!!python/..., !custom) are refused.
Json yaml_scalar(const YAML::Node& node, const std::string& key, const Conversion& conversion) {
  const std::string& tag = node.Tag();
  const std::string where = conversion.where(line_of(node)) + ": " + printable(key);
  if (tag == "!" || tag == kYamlTag + "str") return node.Scalar();
  if (tag != "?") {
    const std::string kind = tag.rfind(kYamlTag, 0) == 0 ? tag.substr(kYamlTag.size()) : "";
    SEQPAR_INPUT_CHECK(kind == "int" || kind == "float" || kind == "bool" || kind == "null", where,
                       ": the tag ", printable(tag), " is not supported");
    SEQPAR_INPUT_CHECK(plain_scalar_is(node.Scalar(), kind.c_str()), where, ": '",
                       printable(node.Scalar()), "' is not a YAML ", kind);
    const Json value = typed_plain_scalar(node.Scalar(), where);
    return kind == "float" && value.is_number_integer() ? Json(value.get<double>()) : value;
  }
  return typed_plain_scalar(node.Scalar(), where);
}

Json from_yaml(const YAML::Node& node, const std::string& key, int depth, Conversion& conversion);

Json yaml_mapping(const YAML::Node& node, const std::string& key, int depth,
                  Conversion& conversion, bool top = false) {
  Json table = Json::object();
  std::map<std::string, int> seen;  // name, line
  for (const auto& entry : node) {
    const int line = line_of(entry.first);
    SEQPAR_INPUT_CHECK(entry.first.IsScalar(), conversion.where(line), ": a key under ",
                       key.empty() ? "the top" : printable(key), " is not a name (a mapping or a list)");
    const std::string name = entry.first.Scalar();
    const std::string path = top ? top_key(key, name) : join_key(key, name);
    check_key_name(name, path, conversion.where(line));
    const auto [first, fresh] = seen.emplace(name, line);
    SEQPAR_INPUT_CHECK(fresh, conversion.where(line), ": duplicate key ", printable(path),
                       " (first at line ", first->second, ")");
    table[name] = from_yaml(entry.second, path, depth + 1, conversion);
  }
  return table;
}

Json from_yaml(const YAML::Node& node, const std::string& key, int depth, Conversion& conversion) {
  conversion.count(line_of(node), depth, node.IsScalar() ? node.Scalar().size() : 0);
  const std::string& tag = node.Tag();
  SEQPAR_INPUT_CHECK(node.IsScalar() || tag == "?" || tag == kYamlTag + "map" || tag == kYamlTag + "seq" || tag.empty(),
                     conversion.where(line_of(node)), ": ", printable(key), ": the tag ",
                     printable(tag), " is not supported");
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return yaml_mapping(node, key, depth, conversion);
    case YAML::NodeType::Sequence: {
      Json array = Json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        array.push_back(from_yaml(node[i], key + "[" + std::to_string(i) + "]", depth + 1, conversion));
        SEQPAR_INPUT_CHECK(!array.back().is_null(), "config key ", printable(key), "[", i, "] is null");
      }
      return array;
    }
    case YAML::NodeType::Scalar:
      return yaml_scalar(node, key, conversion);
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------- JSON

// nlohmann's parse callback, which sees every container open (with its depth), every
// key and every value: it refuses nesting beyond kMaxConfigDepth before the parser goes
// deeper, more than kMaxConfigValues values (the text limit needs no count: the file is
// at most kMaxConfigBytes), a dotted key, and a key given twice in one object (DeepSpeed
// does; the parser keeps the last).
class JsonChecks {
 public:
  explicit JsonChecks(const std::string& source) : source_(source) {}
  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    using Event = Json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      SEQPAR_INPUT_CHECK(depth < kMaxConfigDepth, "config ", source_,
                         ": nested deeper than the limit of ", kMaxConfigDepth, " levels");
    }
    if (event == Event::object_start || event == Event::array_start || event == Event::value) {
      SEQPAR_INPUT_CHECK(++values_ <= kMaxConfigValues, "config ", source_,
                         ": more than the limit of ", kMaxConfigValues, " values");
    }
    if (event == Event::object_start) objects_.emplace_back();
    if (event == Event::object_end && !objects_.empty()) objects_.pop_back();
    if (event == Event::key && !objects_.empty()) {
      const std::string name = parsed.get<std::string>();
      check_key_name(name, name, "config " + source_);
      SEQPAR_INPUT_CHECK(objects_.back().insert(name).second, "config ", source_,
                         ": duplicate key \"", printable(name), "\" in one object");
    }
    return true;
  }

 private:
  const std::string& source_;
  size_t values_ = 0;
  std::vector<std::set<std::string>> objects_;
};

// ---------------------------------------------------------------- layout

// seqpar's layout from a document: the report's (`ds_config` at the top) or DeepSpeed's
// (the document is the ds_config). Top-level keys outside both are not read; a null
// section is DeepSpeed's "not set".
Json arrange(Json document, const std::string& source, std::vector<ConfigNote>& ignored) {
  for (const char* section : {"repro", "ds_config"}) {
    if (document.contains(section) && document[section].is_null()) {
      ignored.push_back({section, "null: DeepSpeed's default"});
      document.erase(section);
    }
  }
  Json arranged = Json::object();
  if (document.contains("repro")) {
    SEQPAR_INPUT_CHECK(document["repro"].is_object(), "config ", source, ": repro must be a mapping");
    arranged["repro"] = std::move(document["repro"]);
    document.erase("repro");
  }
  if (!document.contains("ds_config")) {
    arranged["ds_config"] = std::move(document);
    return arranged;
  }
  SEQPAR_INPUT_CHECK(document["ds_config"].is_object(), "config ", source,
                     ": ds_config must be a mapping of DeepSpeed keys");
  arranged["ds_config"] = std::move(document["ds_config"]);
  for (const auto& entry : document.items()) {
    if (entry.key() != "ds_config") {
      ignored.push_back({entry.key(), "outside ds_config: not a DeepSpeed key"});
    }
  }
  return arranged;
}

// The line where a second document starts, or 0. Not YAML::LoadAll: on some malformed
// text yaml-cpp 0.7's parser reports empty documents without end, which LoadAll collects
// until memory runs out; here the parser is asked for two documents at most.
int second_document(const std::string& text) {
  class DocumentStarts : public YAML::EventHandler {
   public:
    int line = 0;
    void OnDocumentStart(const YAML::Mark& mark) override { line = mark.line + 1; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } starts;
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  if (!parser.HandleNextDocument(starts)) return 0;
  return parser.HandleNextDocument(starts) ? std::max(starts.line, 1) : 0;
}

}  // namespace

Json from_toml(const toml::node& node) {
  if (const toml::table* table = node.as_table()) {
    Json object = Json::object();
    for (const auto& [name, item] : *table) object[std::string(name.str())] = from_toml(item);
    return object;
  }
  if (const toml::array* array = node.as_array()) {
    Json items = Json::array();
    for (const toml::node& item : *array) items.push_back(from_toml(item));
    return items;
  }
  if (node.is_integer()) return node.value<int64_t>().value();
  if (node.is_floating_point()) return node.value<double>().value();
  if (node.is_boolean()) return node.value<bool>().value();
  if (node.is_string()) return node.value<std::string>().value();
  std::ostringstream text;  // a date or time, which check_config_text keeps out
  text << toml::node_view<const toml::node>(node);
  return text.str();
}

Json read_toml_document(const std::string& text, const std::string& source) {
  check_config_text(text, source);  // before toml++ sees it (config_input.h)
  try {
    return from_toml(toml::parse(text, source));
  } catch (const toml::parse_error& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.source().begin.line, " column ",
                      error.source().begin.column, ": ", error.description());
  }
}

Json read_yaml_document(const std::string& text, const std::string& source,
                        std::vector<ConfigNote>& ignored) {
  check_text_encoding(text, source);
  YAML::Node document;
  int second_document_line = 0;
  try {
    document = YAML::Load(text);
    second_document_line = second_document(text);
  } catch (const YAML::DeepRecursion& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.mark.line + 1, ": nested deeper than the "
                      "YAML parser's limit of ", error.depth(), " levels (seqpar reads ",
                      kMaxConfigDepth, ")");
  } catch (const YAML::Exception& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.mark.line + 1, " column ",
                      error.mark.column + 1, ": ", error.msg);
  }
  // OmegaConf (PyYAML) reads one document; a second one would be dropped unseen.
  SEQPAR_INPUT_CHECK(second_document_line == 0, "config ", source, " line ", second_document_line,
                     ": a second YAML document ('---'); a config is one document");
  if (document.IsNull()) return arrange(Json::object(), source, ignored);
  SEQPAR_INPUT_CHECK(document.IsMap(), "config ", source,
                     ": expected a mapping at the top (ds_config: ...)");
  const std::string root = static_cast<const YAML::Node&>(document)["ds_config"] ? "" : "ds_config";
  Conversion conversion{source};
  return arrange(yaml_mapping(document, root, 0, conversion, true), source, ignored);
}

Json read_json_document(const std::string& text, const std::string& source,
                        std::vector<ConfigNote>& ignored) {
  check_text_encoding(text, source);  // a NUL byte, which the parser takes for the end
  Json document;
  try {
    document = Json::parse(text, JsonChecks(source));
  } catch (const Json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    const std::string what = error.what();
    const size_t bracket = what.find("] ");
    SEQPAR_INPUT_FAIL("config ", source, ": ",
                      bracket == std::string::npos ? what : what.substr(bracket + 2));
  }
  SEQPAR_INPUT_CHECK(document.is_object(), "config ", source,
                     ": expected a JSON object of DeepSpeed keys at the top");
  return arrange(std::move(document), source, ignored);
}

}  // namespace seqpar::repro::detail
