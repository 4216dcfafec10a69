#include "apps/repro/config_limits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/error.h"

namespace seqpar::repro::detail {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex_digit(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

bool one_of(const std::string& text, std::initializer_list<const char*> words) {
  return std::any_of(words.begin(), words.end(), [&](const char* word) { return text == word; });
}

// Reads characters for which `accept` holds from `at`; returns how many.
template <typename Accept>
size_t run(const std::string& text, size_t& at, Accept accept) {
  const size_t start = at;
  while (at < text.size() && accept(text[at])) ++at;
  return at - start;
}

size_t skip_sign(const std::string& text) {
  return !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
}

const auto digit_or_underscore = [](char c) { return is_digit(c) || c == '_'; };

// [eE][-+]?[0-9]+ at `at`, to the end.
bool exponent_to_end(const std::string& text, size_t at) {
  if (at == text.size()) return true;
  if (text[at] != 'e' && text[at] != 'E') return false;
  ++at;
  if (at < text.size() && (text[at] == '-' || text[at] == '+')) ++at;
  return run(text, at, is_digit) > 0 && at == text.size();
}

// [-+]?(0|[1-9][0-9_]*)
bool is_integer(const std::string& text) {
  size_t at = skip_sign(text);
  if (at < text.size() && text[at] == '0') return at + 1 == text.size();
  if (at == text.size() || text[at] < '1' || text[at] > '9') return false;
  run(text, at, digit_or_underscore);
  return at == text.size();
}

// [-+]?0x[0-9a-fA-F_]+
bool is_hex(const std::string& text) {
  size_t at = skip_sign(text);
  if (text.compare(at, 2, "0x") != 0) return false;
  at += 2;
  return run(text, at, [](char c) { return is_hex_digit(c) || c == '_'; }) > 0 && at == text.size();
}

// [-+]?[0-9][0-9_]*\.[0-9_]*(exp)? | [-+]?[0-9][0-9_]*exp | [-+]?\.[0-9_]+(exp)?
bool is_float(const std::string& text) {
  size_t at = skip_sign(text);
  const bool whole = at < text.size() && is_digit(text[at]);
  if (whole) run(text, at, digit_or_underscore);
  if (at < text.size() && text[at] == '.') {
    ++at;
    const size_t fraction = run(text, at, digit_or_underscore);
    if (!whole && fraction == 0) return false;
    return exponent_to_end(text, at);
  }
  return whole && at < text.size() && exponent_to_end(text, at);
}

bool is_infinity(const std::string& text) {
  const std::string rest = text.substr(skip_sign(text));
  return one_of(rest, {".inf", ".Inf", ".INF"});
}

bool is_nan(const std::string& text) { return one_of(text, {".nan", ".NaN", ".NAN"}); }
bool is_null(const std::string& text) { return one_of(text, {"~", "null", "Null", "NULL", ""}); }
bool is_true(const std::string& text) {
  return one_of(text, {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"});
}
bool is_false(const std::string& text) {
  return one_of(text, {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"});
}

}  // namespace

bool plain_scalar_is(const std::string& text, const char* kind) {
  const std::string k = kind;
  if (k == "int") return is_integer(text) || is_hex(text);
  if (k == "float") return is_float(text) || is_integer(text) || is_infinity(text) || is_nan(text);
  if (k == "bool") return is_true(text) || is_false(text);
  if (k == "null") return is_null(text);
  return false;
}

std::unique_ptr<toml::node> typed_plain_scalar(const std::string& text, const std::string& where) {
  if (is_null(text)) return nullptr;
  if (is_true(text)) return std::make_unique<toml::value<bool>>(true);
  if (is_false(text)) return std::make_unique<toml::value<bool>>(false);
  const bool integer = is_integer(text), hex = is_hex(text), real = is_float(text);
  if (integer || hex || real) {
    SEQPAR_INPUT_CHECK(text.size() <= kMaxNumberCharacters, where, ": a number of ", text.size(),
                       " characters, more than the limit of ", kMaxNumberCharacters);
    std::string digits = text;
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    try {
      if (integer) return std::make_unique<toml::value<int64_t>>(std::stoll(digits, nullptr, 10));
      if (hex) return std::make_unique<toml::value<int64_t>>(std::stoll(digits, nullptr, 16));
      return std::make_unique<toml::value<double>>(std::stod(digits));
    } catch (const std::logic_error&) {
      // Too large for int64 or double, or no digit at all ("._"): left as text, so the
      // key's reader names it.
    }
  }
  if (is_infinity(text)) {
    const double infinity = std::numeric_limits<double>::infinity();
    return std::make_unique<toml::value<double>>(text[0] == '-' ? -infinity : infinity);
  }
  if (is_nan(text)) return std::make_unique<toml::value<double>>(std::numeric_limits<double>::quiet_NaN());
  return std::make_unique<toml::value<std::string>>(text);
}

void check_json_structure(const std::string& text, const std::string& source) {
  int depth = 0;
  size_t line = 1, line_start = 0;
  const auto where = [&](size_t at) {
    return seqpar::detail::concat("config ", source, " line ", line, " column ", at - line_start + 1);
  };
  for (size_t at = 0; at < text.size();) {
    const char c = text[at];
    if (c == '\n') {
      ++line;
      line_start = at + 1;
    } else if (c == '"') {  // a string: skipped, escapes included
      for (++at; at < text.size() && text[at] != '"' && text[at] != '\n'; ++at) {
        if (text[at] == '\\') ++at;
      }
    } else if (c == '[' || c == '{') {
      SEQPAR_INPUT_CHECK(++depth <= kMaxConfigDepth, where(at), ": nested deeper than the limit of ",
                         kMaxConfigDepth, " levels");
    } else if (c == ']' || c == '}') {
      depth = std::max(depth - 1, 0);
    } else if (c == '-' || is_digit(c)) {
      const size_t start = at;
      const size_t length = run(text, at, [](char d) {
        return is_digit(d) || d == '.' || d == 'e' || d == 'E' || d == '-' || d == '+';
      });
      SEQPAR_INPUT_CHECK(length <= kMaxNumberCharacters, where(start), ": a number of ", length,
                         " characters, more than the limit of ", kMaxNumberCharacters);
      continue;
    }
    ++at;
  }
}

}  // namespace seqpar::repro::detail
