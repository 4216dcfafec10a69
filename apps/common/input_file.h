// A file a user names on the command line (a config), read whole.
#pragma once

#include <cstddef>
#include <string>

namespace seqpar {

// The whole of the file at `path`, which must be a regular file of at most `limit`
// bytes: a FIFO would block, a device read forever, a directory read as empty. Errors
// are InputError naming `option` and the path ("--config F: a FIFO, not a regular file").
std::string read_input_file(const std::string& path, const std::string& option, size_t limit);

}  // namespace seqpar
