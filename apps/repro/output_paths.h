// Every output a run will write (--json, --plot, --dump), checked before its first step:
// each can be written (apps/common/output_file.h's check_output_path, the dump directory's
// rules in apps/common/dump_directory.h), and no two of them land in the same place: the same file
// (`--json out --plot out`, `--json - --plot /dev/stdout`), a file where the dump goes
// (`--dump d --plot d`, `--plot d/inputs.safetensors`). /dev/null may take any number.
#pragma once

#include "apps/repro/options.h"

namespace seqpar::repro {

void check_output_paths(const Options& options);

}  // namespace seqpar::repro
