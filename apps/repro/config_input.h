// The file a configuration comes from.
#pragma once

#include <cstddef>
#include <string>

#include "apps/common/input_file.h"
#include "apps/common/text.h"

namespace seqpar::repro {

constexpr size_t kMaxConfigBytes = 1 << 20;  // the scenario's file is under 1 KiB

inline std::string read_config_file(const std::string& path) {
  return read_input_file(path, "--config", kMaxConfigBytes);
}

}  // namespace seqpar::repro
