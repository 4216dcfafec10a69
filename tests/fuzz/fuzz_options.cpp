// libFuzzer: the command line. The input is split at NUL bytes into arguments, parsed
// as seqpar-repro's options, and the configuration they name is built (without --config,
// which would read a file).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/repro/options.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> arguments(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) arguments.emplace_back();
    else arguments.back() += static_cast<char>(data[i]);
  }
  try {
    seqpar::repro::Options options = seqpar::repro::parse_options(arguments);
    if (options.config_path.empty()) seqpar::repro::parse_config("", options.overrides, "fuzz");
  } catch (const seqpar::InputError&) {
  }
  return 0;
}
