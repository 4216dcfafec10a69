// The formats a config comes in, each read into the one tree that config.cpp checks key
// by key: an nlohmann::json object with `ds_config` and `repro`.
//
//   TOML  seqpar's own format (configs/issue6868.toml): [ds_config] and [repro].
//   YAML  the bug report's config.yaml, as its script loads it with OmegaConf: a
//         top-level `ds_config:` mapping (other top-level keys are not read).
//   JSON  DeepSpeed's own ds_config.json: the DeepSpeed keys at the top level.
//
// A YAML or JSON document with a top-level `ds_config` is read the report's way; one
// without is a DeepSpeed config itself. A top-level `repro` is seqpar's [repro] in both.
// Numbers are typed as DeepSpeed's users get them: JSON's own types, and for YAML
// OmegaConf's, under which `1e-4` is a float (YAML 1.1 reads a string) and a quoted
// scalar stays a string. A null (DeepSpeed's "use the default") stays in the tree.
//
// A YAML or JSON config is read into at most kMaxConfigValues values of at most
// kMaxConfigTextBytes of text (an alias counts each time it is used, so a "billion
// laughs" stops at the limit), nested at most kMaxConfigDepth deep (an alias inside
// itself is infinitely deep), its YAML numbers at most kMaxNumberCharacters long.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/repro/config.h"

namespace seqpar::repro::detail {

using Json = nlohmann::json;

constexpr int kMaxConfigDepth = 64;           // DeepSpeed configs nest 3 or 4 levels
constexpr size_t kMaxConfigValues = 100000;   // a DeepSpeed config holds about 100
constexpr size_t kMaxConfigTextBytes = 16 << 20;
constexpr size_t kMaxNumberCharacters = 100;  // a double needs 25 at most

// The document as a tree in seqpar's layout; `ignored` receives the top-level keys not read.
Json read_document(const std::string& text, const std::string& source, ConfigFormat format,
                   std::vector<ConfigNote>& ignored);

// A --set "section.key=value" as a tree ({"section": {"key": value}}): the key and the
// value in TOML, or a bare word (AdamW, issue-6868) as a string, which needs no quotes.
Json read_override(const std::string& assignment);

// A YAML plain (unquoted) scalar as OmegaConf types it: YAML 1.1's booleans, integers and
// nulls (a JSON null), and floats that take exponents without a dot (`1e-4`). A number
// longer than kMaxNumberCharacters is refused, naming `where` ("config F line L").
Json typed_plain_scalar(const std::string& text, const std::string& where);

// What a DeepSpeed key the scenario does not read ("ds_config.steps_per_print") means for
// it: Unknown (a typo, say: an error), Ignore (listed in the report), Refuse (it would
// change the result), or Descend (a table decided key by key: zero_optimization).
enum class KeyTreatment { Unknown, Ignore, Refuse, Descend };
struct KeyDecision {
  KeyTreatment treatment = KeyTreatment::Unknown;
  std::string reason;
};
KeyDecision deepspeed_key_decision(const std::string& key, const Json& node);  // config_deepspeed.cpp

}  // namespace seqpar::repro::detail
