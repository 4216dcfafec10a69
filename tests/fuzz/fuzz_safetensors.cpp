// libFuzzer: a whole safetensors file, as seqpar-diagnose reads a rank's dump (scripts/
// fuzz.sh builds and runs it). Any input must end in a StoredFile or a
// seqpar::InputError; anything else (a crash, a stack overflow, memory past
// -rss_limit_mb, a sanitizer report, another exception) is a bug.
//
// Each input is read twice: decoding every tensor, and as seqpar-diagnose reads its
// files, leaving a step count ("step", "weight.step") undecoded.
#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/diagnose/safetensors_reader.h"
#include "core/error.h"

namespace {

bool is_step(const std::string& name) {
  return name == "step" || (name.size() > 5 && name.compare(name.size() - 5, 5, ".step") == 0);
}

void read(const std::string& bytes, bool (*skip)(const std::string&)) {
  try {
    seqpar::diagnose::parse_safetensors(bytes, "fuzz.safetensors", skip);
  } catch (const seqpar::InputError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  read(bytes, nullptr);
  read(bytes, is_step);
  return 0;
}
