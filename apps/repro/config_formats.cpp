// Reading a config: the file, its text, and each format into one tree (config_formats.h).
#include "apps/repro/config_formats.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "apps/repro/config_input.h"
#include "core/error.h"
#include "third_party/toml.h"

namespace seqpar::repro::detail {

namespace {

std::string hex(const char* format, uint32_t value) {
  char name[16];
  std::snprintf(name, sizeof name, format, static_cast<unsigned>(value));
  return name;
}

// Refuses, naming line and column, text that is not UTF-8 or holds a control character
// but tab, LF and CR: nlohmann takes a NUL for the end and ignores the rest. For TOML it
// also refuses what Debian's toml++ 3.3 mishandles: its whitespace test reaches
// __builtin_unreachable on U+00A1-U+0499, U+2C5E-U+3057 and U+FAE6-U+FEFE, and takes
// U+00A0, U+2000-U+200B and other Unicode spaces, which TOML does not allow, for blanks.
void check_text(const std::string& text, const std::string& source, bool toml) {
  size_t line = 1, column = 1;
  const auto where = [&] { return seqpar::detail::concat(source, " line ", line, " column ", column, ": "); };
  for (size_t i = 0; i < text.size(); ++column) {
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xC2 ? 0 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF5 ? 4 : 0;
    uint32_t c = length > 1 ? lead & (0x7Fu >> length) : lead;
    bool valid = length != 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
      c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3Fu);
    }
    // Not overlong, not a surrogate, not beyond U+10FFFF.
    valid = valid && c >= (length == 3 ? 0x800u : length == 4 ? 0x10000u : 0u) && (c < 0xD800 || c > 0xDFFF) &&
            c <= 0x10FFFF;
    const bool control = (c < 0x20 || c == 0x7F) && c != '\t' && c != '\n' && c != '\r';
    SEQPAR_INPUT_CHECK(valid && !control, where(), valid ? "a control character" : "not valid UTF-8",
                       " (byte ", hex("0x%02X", lead), ")");
    const bool mishandled = (c >= 0xA0 && c <= 0x499) || c == 0x1680 || c == 0x180E || (c >= 0x2000 && c <= 0x200B) ||
                            c == 0x202F || c == 0x205F || c == 0x2060 || (c >= 0x2C5E && c <= 0x3057) ||
                            (c >= 0xFAE6 && c <= 0xFEFF && !(c == 0xFEFF && i == 0));  // a byte-order mark
    SEQPAR_INPUT_CHECK(!toml || !mishandled, where(), "character ", hex("U+%04X", c), " is not accepted (the "
                       "TOML parser, toml++ 3.3, mishandles U+00A0-U+0499, U+2C5E-U+3057, U+FAE6-U+FEFF and spaces)");
    if (c == '\n') line += 1, column = 0;
    i += length;
  }
}

// `where` names the document in the depth limit's message; depth is node's (the top
// table's is 0). This conversion recurses once per level, and a dotted key or table
// header of many parts ("a.a.a...") is as many levels, so the depth is limited here, as
// the YAML and JSON readers limit theirs.
Json from_toml(const toml::node& node, const std::string& where, int depth = 0) {
  SEQPAR_INPUT_CHECK(depth <= kMaxConfigDepth, where, ": nested deeper than the limit of ", kMaxConfigDepth,
                     " levels");
  if (node.is_integer()) return *node.value<int64_t>();
  if (node.is_floating_point()) return *node.value<double>();
  if (node.is_boolean()) return *node.value<bool>();
  if (node.is_string()) return *node.value<std::string>();
  Json value = node.is_table() ? Json::object() : Json::array();
  if (const toml::table* table = node.as_table()) {
    for (const auto& [name, item] : *table) value[std::string(name.str())] = from_toml(item, where, depth + 1);
  } else if (const toml::array* array = node.as_array()) {
    for (const toml::node& item : *array) value.push_back(from_toml(item, where, depth + 1));
  } else {  // a date or a time, which no key takes: its text, for the key's error
    std::ostringstream text;
    text << toml::node_view<const toml::node>(node);
    value = text.str();
  }
  return value;
}

// The most parts of any dotted key or table header in TOML text ("a.b.c" has 3): toml++
// builds, and its parser revisits, a table per part, recursively, so a header of tens of
// thousands of parts overflows the stack before from_toml could count its levels. A part
// is a bare run of key characters or a quoted string (whose dots are its own); spaces may
// stand around a dot; anything else ends the key. Dotted numbers and dates count as keys
// here (1.5 is 2 parts): harmless, as the limit is far above them.
int longest_dotted_key(const std::string& text) {
  const auto bare = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
  int longest = 0, parts = 0;
  bool after_dot = false;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == ' ' || c == '\t') {
      ++i;
    } else if (c == '.') {
      after_dot = true;
      ++i;
    } else if (bare(c) || c == '"' || c == '\'') {
      if (bare(c)) {
        while (i < text.size() && bare(text[i])) ++i;
      } else {  // a string: to its closing quote (three for a multi-line one), escapes in "..."
        const std::string quote = text.compare(i, 3, std::string(3, c)) == 0 ? std::string(3, c) : std::string(1, c);
        i += quote.size();
        while (i < text.size() && text.compare(i, quote.size(), quote) != 0) i += (c == '"' && text[i] == '\\') ? 2 : 1;
        i += quote.size();
      }
      parts = after_dot ? parts + 1 : 1;
      after_dot = false;
      longest = std::max(longest, parts);
    } else {
      if (c == '#') {
        while (i < text.size() && text[i] != '\n') ++i;
      } else {
        ++i;
      }
      parts = 0;
      after_dot = false;
    }
  }
  return longest;
}

Json parse_toml(const std::string& text, const std::string& source) {
  check_text(text, "config " + source, true);
  SEQPAR_INPUT_CHECK(longest_dotted_key(text) <= kMaxConfigDepth, "config ", source,
                     ": nested deeper than the limit of ", kMaxConfigDepth, " levels (a dotted key or table "
                     "header of more parts)");
  try {
    return from_toml(toml::parse(text, source), "config " + source);
  } catch (const toml::parse_error& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.source().begin.line, " column ",
                      error.source().begin.column, ": ", error.description());
  }
}

// YAML 1.1's patterns as PyYAML's resolver has them, with OmegaConf's float (an exponent
// without a dot: `1e-4`). std::regex recurses once per character, so they only see text
// of at most kMaxNumberCharacters.
const std::regex kInteger("[-+]?(0|[1-9][0-9_]*)"), kHex("[-+]?0x[0-9a-fA-F_]+");
const std::regex kFloat("[-+]?([0-9][0-9_]*)\\.[0-9_]*([eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|"
                        "[-+]?\\.[0-9_]+([eE][-+]?[0-9]+)?");
const std::regex kInfinity("[-+]?\\.(inf|Inf|INF)"), kNan("\\.(nan|NaN|NAN)"), kNull("~|null|Null|NULL|");
const std::regex kTrue("yes|Yes|YES|true|True|TRUE|on|On|ON"), kFalse("no|No|NO|false|False|FALSE|off|Off|OFF");

bool is(const std::string& text, const std::regex& pattern) {
  return text.size() <= kMaxNumberCharacters && std::regex_match(text, pattern);
}

const std::string kYamlTag = "tag:yaml.org,2002:";

// Converts a YAML document node by node, counting what it holds against the limits.
struct YamlReader {
  const std::string& source;
  size_t values = 0, text_bytes = 0;

  std::string where(const YAML::Node& node) const {
    const std::string config = "config " + source;
    return node.Mark().is_null() ? config : seqpar::detail::concat(config, " line ", node.Mark().line + 1);
  }

  Json convert(const YAML::Node& node, const std::string& key, int depth) {
    SEQPAR_INPUT_CHECK(depth <= kMaxConfigDepth, where(node), ": nested deeper than the limit of ",
                       kMaxConfigDepth, " levels (an alias that contains itself?)");
    SEQPAR_INPUT_CHECK(++values <= kMaxConfigValues, where(node), ": more than the limit of ",
                       kMaxConfigValues, " values (an alias counts each time it is used)");
    text_bytes += node.IsScalar() ? node.Scalar().size() : 0;
    SEQPAR_INPUT_CHECK(text_bytes <= kMaxConfigTextBytes, where(node), ": more than the limit of ",
                       kMaxConfigTextBytes, " bytes of text (an alias counts each time it is used)");
    if (node.IsScalar()) return scalar(node, key);
    const std::string& tag = node.Tag();
    SEQPAR_INPUT_CHECK(tag == "?" || tag.empty() || tag == kYamlTag + "map" || tag == kYamlTag + "seq",
                       where(node), ": ", printable(key), ": the tag ", printable(tag), " is not supported");
    if (node.IsMap()) return mapping(node, key, depth, false);
    if (!node.IsSequence()) return nullptr;
    Json array = Json::array();
    for (size_t i = 0; i < node.size(); ++i) {
      array.push_back(convert(node[i], key + "[" + std::to_string(i) + "]", depth + 1));
      SEQPAR_INPUT_CHECK(!array.back().is_null(), "config key ", printable(key), "[", i, "] is null");
    }
    return array;
  }

  // At the top, `key` is the layout's root ("ds_config", or "" when the document has
  // one), and `repro` is seqpar's own table.
  Json mapping(const YAML::Node& node, const std::string& key, int depth, bool top) {
    Json table = Json::object();
    std::map<std::string, int> lines;  // of the keys seen
    for (const auto& entry : node) {
      SEQPAR_INPUT_CHECK(entry.first.IsScalar(), where(entry.first), ": a key under ",
                         key.empty() ? "the top" : printable(key), " is not a name (a mapping or a list)");
      const std::string& name = entry.first.Scalar();
      const std::string path = key.empty() || (top && name == "repro") ? name : key + "." + name;
      const auto [first, fresh] = lines.emplace(name, entry.first.Mark().line + 1);
      SEQPAR_INPUT_CHECK(fresh, where(entry.first), ": duplicate key ", printable(path), " (first at line ",
                         first->second, ")");
      table[name] = convert(entry.second, path, depth + 1);
    }
    return table;
  }

  // As OmegaConf reads it: quoted or !!str is a string; !!int, !!float, !!bool and !!null
  // must read as one; other tags (!!python/..., !custom) are refused.
  Json scalar(const YAML::Node& node, const std::string& key) const {
    const std::string& tag = node.Tag();
    const std::string at = where(node) + ": " + printable(key);
    if (tag == "!" || tag == kYamlTag + "str") return node.Scalar();
    const Json value = typed_plain_scalar(node.Scalar(), at);
    if (tag == "?") return value;
    const std::string kind = tag.rfind(kYamlTag, 0) == 0 ? tag.substr(kYamlTag.size()) : "";
    SEQPAR_INPUT_CHECK(kind == "int" || kind == "float" || kind == "bool" || kind == "null", at, ": the tag ",
                       printable(tag), " is not supported");
    SEQPAR_INPUT_CHECK(kind == "int" ? value.is_number_integer() : kind == "float" ? value.is_number()
                       : kind == "bool" ? value.is_boolean() : value.is_null(),
                       at, ": '", printable(node.Scalar()), "' is not a YAML ", kind);
    return kind == "float" ? Json(value.get<double>()) : value;
  }
};

// The line where a second document starts, or 0. Not YAML::LoadAll: on some malformed
// text yaml-cpp 0.7's parser reports empty documents without end, which LoadAll collects
// until memory runs out; here the parser is asked for two documents at most.
int second_document(const std::string& text) {
  struct DocumentStarts : YAML::EventHandler {
    int line = 0;
    void OnDocumentStart(const YAML::Mark& mark) override { line = mark.line + 1; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } starts;
  std::istringstream stream(text);
  YAML::Parser parser(stream);
  return parser.HandleNextDocument(starts) && parser.HandleNextDocument(starts) ? std::max(starts.line, 1) : 0;
}

Json parse_yaml(const std::string& text, const std::string& source) {
  YAML::Node document;
  int second_line = 0;
  try {
    document = YAML::Load(text);
    second_line = second_document(text);
  } catch (const YAML::DeepRecursion& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.mark.line + 1, ": nested deeper than the YAML parser's "
                      "limit of ", error.depth(), " levels (seqpar reads ", kMaxConfigDepth, ")");
  } catch (const YAML::Exception& error) {
    SEQPAR_INPUT_FAIL("config ", source, " line ", error.mark.line + 1, " column ", error.mark.column + 1, ": ",
                      error.msg);
  }
  // OmegaConf (PyYAML) reads one document; a second one would be dropped unseen.
  SEQPAR_INPUT_CHECK(second_line == 0, "config ", source, " line ", second_line,
                     ": a second YAML document ('---'); a config is one document");
  if (document.IsNull()) return Json::object();
  SEQPAR_INPUT_CHECK(document.IsMap(), "config ", source, ": expected a mapping at the top (ds_config: ...)");
  const bool has_ds_config = static_cast<const YAML::Node&>(document)["ds_config"].IsDefined();
  return YamlReader{source}.mapping(document, has_ds_config ? "" : "ds_config", 0, true);
}

// The limits (apps/common/json_limits.h) and a key given twice in one object, which
// DeepSpeed would take the last of, before the tree is built.
Json parse_json(const std::string& text, const std::string& source) {
  const JsonScan scan = scan_json(text, "config " + source, kMaxConfigValues);
  SEQPAR_INPUT_CHECK(scan.duplicate_key.empty(), "config ", source, ": duplicate key \"",
                     printable(scan.duplicate_key), "\" in one object");
  try {
    Json document = Json::parse(text);
    SEQPAR_INPUT_CHECK(document.is_object(), "config ", source,
                       ": expected a JSON object of DeepSpeed keys at the top");
    return document;
  } catch (const Json::exception& error) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    const std::string what = error.what();
    SEQPAR_INPUT_FAIL("config ", source, ": ", what.substr(std::min(what.find("] ") + 2, what.size())));
  }
}

// seqpar's layout from a YAML or JSON document: the report's (`ds_config` at the top) or
// DeepSpeed's (the document is the ds_config). A null section is DeepSpeed's "not set".
Json arrange(Json document, const std::string& source, std::vector<ConfigNote>& ignored) {
  Json arranged = Json::object();
  for (const char* section : {"repro", "ds_config"}) {
    const auto found = document.find(section);
    if (found == document.end()) continue;
    if (found->is_null()) ignored.push_back({section, "null: DeepSpeed's default"});
    SEQPAR_INPUT_CHECK(found->is_null() || found->is_object(), "config ", source, ": ", section, " must be a mapping");
    if (found->is_object()) arranged[section] = std::move(*found);
    document.erase(found);
  }
  if (!arranged.contains("ds_config")) {
    arranged["ds_config"] = std::move(document);
  } else {
    for (const auto& entry : document.items()) {
      ignored.push_back({entry.key(), "outside ds_config: not a DeepSpeed key"});
    }
  }
  return arranged;
}

}  // namespace

Json typed_plain_scalar(const std::string& text, const std::string& where) {
  // Digits with only what a number may hold around them; longer than the patterns may see.
  const bool numeric = text.find_first_of("0123456789") != std::string::npos &&
                       text.find_first_not_of("+-0123456789_.eExabcdefABCDEF") == std::string::npos;
  SEQPAR_INPUT_CHECK(text.size() <= kMaxNumberCharacters || !numeric, where, ": a number of ", text.size(),
                     " characters, more than the limit of ", kMaxNumberCharacters);
  if (is(text, kNull)) return nullptr;
  if (is(text, kTrue) || is(text, kFalse)) return is(text, kTrue);
  const bool integer = is(text, kInteger), hexadecimal = is(text, kHex);
  if (integer || hexadecimal || is(text, kFloat)) {
    std::string digits = text;
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    try {
      if (integer || hexadecimal) return int64_t(std::stoll(digits, nullptr, integer ? 10 : 16));
      return std::stod(digits);
    } catch (const std::logic_error&) {
      // Beyond int64 or double, or no digit at all ("._"): text, which the key's reader names.
    }
  }
  if (is(text, kInfinity)) return (text[0] == '-' ? -1 : 1) * std::numeric_limits<double>::infinity();
  if (is(text, kNan)) return std::numeric_limits<double>::quiet_NaN();
  return text;
}

Json read_document(const std::string& text, const std::string& source, ConfigFormat format,
                   std::vector<ConfigNote>& ignored) {
  if (format == ConfigFormat::Toml) return parse_toml(text, source);
  check_text(text, "config " + source, false);
  return arrange(format == ConfigFormat::Yaml ? parse_yaml(text, source) : parse_json(text, source), source, ignored);
}

Json read_override(const std::string& assignment) {
  const std::string shown = "--set " + abbreviated(assignment);
  // One value on one line: after a line break, the rest would be more TOML (new tables, keys).
  SEQPAR_INPUT_CHECK(std::none_of(assignment.begin(), assignment.end(),
                                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }),
                     shown, ": control characters (line breaks, ...) are not allowed; the value must be one TOML "
                     "value on one line");
  const size_t equals = assignment.find('=');
  SEQPAR_INPUT_CHECK(equals != std::string::npos && equals > 0, shown, ": expected section.key=value");
  const std::string key = assignment.substr(0, equals), value = assignment.substr(equals + 1);
  // A key far longer than any seqpar reads is refused before toml++ builds a table for
  // each of its dotted parts; a shorter one still meets the depth limit of from_toml.
  SEQPAR_INPUT_CHECK(key.size() <= kMaxOverrideKeyCharacters, "--set ", abbreviated(key), ": a key of ", key.size(),
                     " characters, more than the limit of ", kMaxOverrideKeyCharacters);
  check_text(assignment, "--set " + abbreviated(key), true);
  const auto parse = [&](const std::string& text, const char* part) {
    try {
      return from_toml(toml::parse(key + " = " + text), "--set " + abbreviated(key));
    } catch (const toml::parse_error& error) {
      SEQPAR_INPUT_FAIL(shown, ": the ", part, " is not TOML (", error.description(), ")");
    }
  };
  parse("0", "key");  // dotted parts, bare or quoted, as TOML writes a key
  // A bare word is a string, so `--set ds_config.optimizer.type=AdamW` needs no quotes.
  const bool bare_word = !value.empty() && value.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ"
      "abcdefghijklmnopqrstuvwxyz0123456789-_.+:/") == std::string::npos;
  try {
    return from_toml(toml::parse(key + " = " + value), "--set " + abbreviated(key));
  } catch (const toml::parse_error& error) {
    SEQPAR_INPUT_CHECK(bare_word, shown, ": the value is not TOML (", error.description(), ")");
  }
  return parse("'" + value + "'", "value");
}

}  // namespace seqpar::repro::detail
