// libFuzzer: --set overrides. The input is split at NUL bytes into one or more
// "section.key=value" arguments, applied to the built-in scenario.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> overrides(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) overrides.emplace_back();
    else overrides.back() += static_cast<char>(data[i]);
  }
  try {
    seqpar::repro::parse_config("", overrides, "fuzz");
  } catch (const seqpar::InputError&) {
  }
  return 0;
}
