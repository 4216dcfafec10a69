// The limits of a JSON document a user gives (a config, seqpar-diagnose's --ds-config, a
// safetensors header), checked in one pass of nlohmann's SAX parser before its tree is
// built. Not a parse callback: nlohmann's callback parser scans the enclosing object each
// time an object in it ends, quadratic in its members (a 1 MiB config of 80,000 empty
// objects took a minute, a header of 100,000 tensors several).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace seqpar {

// DeepSpeed configs nest 3 or 4 levels, a safetensors header 3. Deeper documents are
// refused: nlohmann parses without recursion, but dump(), which an error quoting a value
// calls, recurses once a level (400,000 nested brackets overflowed the stack).
constexpr int kMaxJsonDepth = 64;

struct JsonScan {
  bool well_formed = true;    // false: a syntax error, which parsing the text reports with its place
  std::string duplicate_key;  // the first key given twice in one object ("" if none): the tree keeps the last
};

// Refuses, as InputError "<what>: ...", nesting deeper than kMaxJsonDepth and more than
// `max_values` values (containers and scalars); the scan stops at a syntax error.
JsonScan scan_json(const std::string& text, const std::string& what, size_t max_values = SIZE_MAX);

}  // namespace seqpar
