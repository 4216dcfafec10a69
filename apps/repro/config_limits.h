// What a YAML or JSON config may take: a config is read into at most kMaxConfigValues
// values of at most kMaxConfigTextBytes of text (aliases count once per use, so a
// "billion laughs" file stops at the limit instead of expanding), nested at most
// kMaxConfigDepth deep (an alias that contains itself is infinitely deep; JSON's depth
// is refused by nlohmann's parse callback as it opens each level), with YAML numbers of
// at most kMaxNumberCharacters characters. Every refusal names the file and the limit.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace seqpar::repro::detail {

constexpr int kMaxConfigDepth = 64;             // DeepSpeed configs nest 3 or 4 levels
constexpr size_t kMaxConfigValues = 100000;     // a DeepSpeed config holds about 100
constexpr size_t kMaxConfigTextBytes = 16 << 20;
constexpr size_t kMaxNumberCharacters = 100;    // a double needs 25 at most

// A YAML plain (unquoted) scalar typed as OmegaConf types it: YAML 1.1's booleans,
// integers and nulls, and a float that also takes exponents without a dot (`1e-4`).
// Returns a JSON null for a YAML null. A number longer than kMaxNumberCharacters is refused
// (InputError naming `where`, "config F line L"), before any pattern sees it.
nlohmann::json typed_plain_scalar(const std::string& text, const std::string& where);

// The same classification, for a scalar tagged !!int, !!float, !!bool or !!null:
// whether its text is of that kind.
bool plain_scalar_is(const std::string& text, const char* kind);

}  // namespace seqpar::repro::detail
