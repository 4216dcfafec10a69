// libFuzzer: a whole YAML config file, as --config reads a .yaml file (scripts/fuzz.sh
// builds and runs it). Any input must end in a configuration or a seqpar::InputError;
// anything else (a crash, a stack overflow, memory past -rss_limit_mb, a sanitizer
// report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/repro/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    seqpar::repro::parse_config(text, {}, "fuzz.yaml", seqpar::repro::ConfigFormat::Yaml);
  } catch (const seqpar::InputError&) {
  }
  return 0;
}
