// The formats a config comes in, each read into one tree for config.cpp to check key by
// key: an nlohmann::json object with `ds_config` and `repro`.
//
//   TOML  seqpar's own (configs/issue6868.toml): [ds_config] and [repro].
//   YAML  the bug report's config.yaml as its script loads it with OmegaConf: a top-level
//         `ds_config:` mapping; other top-level keys are not read.
//   JSON  DeepSpeed's ds_config.json: the DeepSpeed keys at the top level.
//
// A YAML or JSON document with a top-level `ds_config` is read the report's way, one
// without is a DeepSpeed config itself; a top-level `repro` is seqpar's [repro]. YAML
// scalars are typed as OmegaConf types them (`1e-4` is a float, a quoted scalar a
// string). A null (DeepSpeed's "use the default") stays in the tree.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/common/json_limits.h"
#include "apps/repro/config.h"

namespace seqpar::repro::detail {

using Json = nlohmann::json;

// A YAML or JSON config's limits. An alias counts each time it is used, so a "billion
// laughs" stops at kMaxConfigValues, and an alias inside itself at kMaxConfigDepth.
constexpr int kMaxConfigDepth = kMaxJsonDepth;  // the same for YAML as for JSON
constexpr size_t kMaxConfigValues = 100000;   // a DeepSpeed config holds about 100
constexpr size_t kMaxConfigTextBytes = 16 << 20;
constexpr size_t kMaxNumberCharacters = 100;  // a double needs 25 at most
// A --set key's length; its depth is kMaxConfigDepth's, as a file's. The longest key
// seqpar reads has about 50 characters.
constexpr size_t kMaxOverrideKeyCharacters = 256;

// The document as a tree in seqpar's layout; `ignored` receives the top-level keys not read.
Json read_document(const std::string& text, const std::string& source, ConfigFormat format,
                   std::vector<ConfigNote>& ignored);

// A --set "section.key=value" as {"section": {"key": value}}: key and value in TOML, or
// a bare word (AdamW, issue-6868) as a string.
Json read_override(const std::string& assignment);

// A YAML plain scalar as OmegaConf types it: YAML 1.1's booleans, integers and nulls,
// and floats with an exponent but no dot. A number longer than kMaxNumberCharacters is
// refused, naming `where`.
Json typed_plain_scalar(const std::string& text, const std::string& where);

// What a DeepSpeed key outside the key table means for the scenario: Unknown (an
// error: a typo?), Ignore (listed in the report), Refuse (it would change the result),
// or Descend (a table decided key by key). In config_deepspeed.cpp.
enum class KeyTreatment { Unknown, Ignore, Refuse, Descend };
struct KeyDecision {
  KeyTreatment treatment = KeyTreatment::Unknown;
  std::string reason;
};
KeyDecision deepspeed_key_decision(const std::string& key, const Json& node);

}  // namespace seqpar::repro::detail
