// The file a configuration comes from (read in apps/repro/config_formats.cpp).
#pragma once

#include <cstddef>
#include <string>

#include "apps/common/text.h"

namespace seqpar::repro {

// The whole file: a regular file (not a FIFO, device or directory) of at most kMaxConfigBytes.
constexpr size_t kMaxConfigBytes = 1 << 20;  // the scenario's file is under 1 KiB
std::string read_config_file(const std::string& path);

}  // namespace seqpar::repro
