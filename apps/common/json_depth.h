// A bound on how deeply a JSON document a user gives may nest.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"

namespace seqpar {

// DeepSpeed configs nest 3 or 4 levels, a safetensors header 3.
constexpr int kMaxJsonDepth = 64;

// A parse callback for nlohmann::json::parse that refuses (InputError "<what>: nested
// deeper than ...") a container opened deeper than kMaxJsonDepth, as the parser reaches
// it. nlohmann parses without recursion, but dump(), which error messages quote values
// with, recurses once a level: 400,000 nested brackets overflowed the stack.
inline auto json_depth_limit(std::string what) {
  return [what = std::move(what)](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    using Event = nlohmann::json::parse_event_t;
    SEQPAR_INPUT_CHECK(!(event == Event::object_start || event == Event::array_start) || depth < kMaxJsonDepth,
                       what, ": nested deeper than the limit of ", kMaxJsonDepth, " levels");
    return true;
  };
}

}  // namespace seqpar
