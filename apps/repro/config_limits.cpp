#include "apps/repro/config_limits.h"

#include <algorithm>
#include <limits>
#include <regex>
#include <stdexcept>

#include "core/error.h"

namespace seqpar::repro::detail {

namespace {

// YAML 1.1's patterns as PyYAML's resolver has them, with OmegaConf's float (which takes
// an exponent without a dot: `1e-4`). std::regex recurses once per character, so they
// are only matched against texts of at most kMaxNumberCharacters; a longer text made of
// number characters only is refused as a number too long.
const std::regex kInteger("[-+]?(0|[1-9][0-9_]*)");
const std::regex kHex("[-+]?0x[0-9a-fA-F_]+");
const std::regex kFloat("[-+]?([0-9][0-9_]*)\\.[0-9_]*([eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|"
                        "[-+]?\\.[0-9_]+([eE][-+]?[0-9]+)?");
const std::regex kInfinity("[-+]?\\.(inf|Inf|INF)");
const std::regex kNan("\\.(nan|NaN|NAN)");
const std::regex kNull("~|null|Null|NULL|");
const std::regex kTrue("yes|Yes|YES|true|True|TRUE|on|On|ON");
const std::regex kFalse("no|No|NO|false|False|FALSE|off|Off|OFF");

bool is(const std::string& text, const std::regex& pattern) {
  return text.size() <= kMaxNumberCharacters && std::regex_match(text, pattern);
}

// Digits, with only what a number (decimal, float or hex) may hold around them.
bool looks_numeric(const std::string& text) {
  const size_t start = std::min(text.find_first_not_of("+-"), text.size());
  const bool hex = text.compare(start, 2, "0x") == 0;
  return text.find_first_of("0123456789") != std::string::npos &&
         text.find_first_not_of(hex ? "+-x0123456789_abcdefABCDEF" : "+-0123456789_.eE") ==
             std::string::npos;
}

}  // namespace

bool plain_scalar_is(const std::string& text, const char* kind) {
  const std::string k = kind;
  if (k == "int") return is(text, kInteger) || is(text, kHex);
  if (k == "float") return is(text, kFloat) || is(text, kInteger) || is(text, kInfinity) || is(text, kNan);
  if (k == "bool") return is(text, kTrue) || is(text, kFalse);
  if (k == "null") return is(text, kNull);
  return false;
}

nlohmann::json typed_plain_scalar(const std::string& text, const std::string& where) {
  SEQPAR_INPUT_CHECK(text.size() <= kMaxNumberCharacters || !looks_numeric(text), where,
                     ": a number of ", text.size(), " characters, more than the limit of ",
                     kMaxNumberCharacters);
  if (is(text, kNull)) return nullptr;
  if (is(text, kTrue) || is(text, kFalse)) return is(text, kTrue);
  const bool integer = is(text, kInteger), hex = is(text, kHex);
  if (integer || hex || is(text, kFloat)) {
    std::string digits = text;
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    try {
      if (integer) return int64_t(std::stoll(digits, nullptr, 10));
      if (hex) return int64_t(std::stoll(digits, nullptr, 16));
      return std::stod(digits);
    } catch (const std::logic_error&) {
      // Too large for int64 or double, or no digit at all ("._"): left as text, so the
      // key's reader names it.
    }
  }
  if (is(text, kInfinity)) {
    const double infinity = std::numeric_limits<double>::infinity();
    return text[0] == '-' ? -infinity : infinity;
  }
  if (is(text, kNan)) return std::numeric_limits<double>::quiet_NaN();
  return text;
}

}  // namespace seqpar::repro::detail
