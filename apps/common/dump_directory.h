// A dump directory (--dump DIR): the files of one dump, and DIR/seqpar-dump.manifest
// naming them. The manifest is what makes a directory a dump seqpar-repro may replace:
//
//   - DIR must be new, empty, or (with --overwrite) hold a manifest; a directory that
//     holds files but no manifest is refused, since nothing says which files are ours.
//   - --overwrite removes only the files the earlier manifest names; a user's files
//     beside them (model.safetensors, ranking.txt, a folder of notes) stay.
//   - Nothing inside DIR is reached through a symbolic link: every file and folder is
//     opened relative to DIR's descriptor with O_NOFOLLOW, and a folder that is a link
//     is refused, so no deletion or write lands outside DIR.
//   - The new dump is written whole into a staging folder inside DIR
//     (.seqpar-dump.tmp.XXXXXX), each file read back; only then are the earlier dump's
//     files replaced by renames (with SIGINT and SIGTERM held), the new manifest last.
//     A dump that fails on the way, or a signal, leaves the earlier dump as it was.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "apps/common/safetensors.h"

namespace seqpar {

inline constexpr const char* kDumpManifest = "seqpar-dump.manifest";

struct DumpFile {
  std::string name;  // "inputs.safetensors" or "exact/rank0.safetensors": one folder at most
  std::function<NamedTensors()> tensors;  // made when the file is written
};

// Fails (seqpar::InputError) when a dump could not be written to `directory`: a path
// that is a file or a link, a non-empty directory without `overwrite`, one without a
// manifest, a manifest that names what a dump cannot hold, a parent where nothing can
// be created. Run before the work, and again when the dump is written.
void check_dump_directory(const std::string& directory, bool overwrite);

void write_dump_directory(const std::string& directory, bool overwrite,
                          const std::vector<DumpFile>& files,
                          const std::map<std::string, std::string>& metadata);

// Whether `name` is one a dump may hold: one or two parts of letters, digits, '.', '_'
// and '-', none empty or starting with '.', and not the manifest itself.
bool is_dump_file_name(const std::string& name);

}  // namespace seqpar
