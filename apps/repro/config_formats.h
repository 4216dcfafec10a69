// The formats a scenario can come in, each read into the one tree that config.cpp
// reads keys from: an nlohmann::json object with `ds_config` and `repro`. JSON is that
// tree as parsed; TOML and YAML are copied into it node by node, their scalars typed by
// their own parsers (YAML's plain scalars by OmegaConf's patterns, config_limits.h).
//
//   TOML  seqpar's own format (configs/issue6868.toml): [ds_config] and [repro].
//   YAML  the bug report's config.yaml, as its script loads it with OmegaConf: a
//         top-level `ds_config:` mapping (other top-level keys are not read).
//   JSON  DeepSpeed's own ds_config.json: the DeepSpeed keys at the top level.
//
// A YAML or JSON document with a top-level `ds_config` mapping is read the report's
// way; one without is read as a DeepSpeed config itself. Its top-level `repro`
// mapping, when present, is seqpar's [repro] table in either case.
//
// Numbers are typed the way DeepSpeed's users get them: JSON's own number types, and
// for YAML OmegaConf's resolver, under which `1e-4` is a float (plain YAML 1.1 would
// read it as a string) and a quoted scalar stays a string.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "third_party/toml.h"

namespace seqpar::repro::detail {

using Json = nlohmann::json;

// The document as a tree in seqpar's layout; `ignored` receives the top-level keys
// that are not read. A null (DeepSpeed's "use the default") stays in the tree.
Json read_toml_document(const std::string& text, const std::string& source);
Json read_yaml_document(const std::string& text, const std::string& source,
                        std::vector<ConfigNote>& ignored);
Json read_json_document(const std::string& text, const std::string& source,
                        std::vector<ConfigNote>& ignored);

// A toml++ node (a parsed document, a --set value) as the same tree.
Json from_toml(const toml::node& node);

// What a DeepSpeed key that the scenario does not read means for it.
enum class KeyTreatment {
  Unknown,  // not a DeepSpeed key seqpar knows: an error, so a typo is never dropped
  Ignore,   // accepted; it does not change what is reproduced (listed in the report)
  Refuse,   // it would change the result in a way the scenario does not model
  Descend,  // a table whose keys are decided one by one (zero_optimization)
};
struct KeyDecision {
  KeyTreatment treatment = KeyTreatment::Unknown;
  std::string reason;
};

// `key` is the full dotted name ("ds_config.zero_optimization.stage"); `node` its value.
KeyDecision deepspeed_key_decision(const std::string& key, const Json& node);

}  // namespace seqpar::repro::detail
