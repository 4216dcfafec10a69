// The raw text a configuration comes from, checked before the TOML parser sees it:
// the file (a regular file of bounded size), the text's encoding, and the key of a
// --set override. Every error is a seqpar::InputError naming the file or key.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "apps/common/text.h"

namespace seqpar::repro {

// The largest config file read; the scenario's file is under 1 KiB.
constexpr size_t kMaxConfigBytes = 1 << 20;

// The whole file, which must be a regular file (not a directory, FIFO or device, which
// would block, read forever or read as empty) of at most kMaxConfigBytes.
std::string read_config_file(const std::string& path);

// Rejects text that is not well-formed UTF-8, or holds a control character other than
// tab, line feed and carriage return (a NUL ends JSON text for nlohmann's parser, which
// then ignores the rest; none belongs in a YAML, JSON or TOML config), with its line.
void check_text_encoding(const std::string& text, const std::string& source_name);

// check_text_encoding, then rejects any non-ASCII character outside a TOML
// string or comment, and a table header without a key ("[ =]"). Outside strings and
// comments TOML 1.0 allows only ASCII anyway, and the toml++ release Debian ships
// (3.3) reaches undefined behaviour on both (a whitespace test that ends in
// `unreachable`; an assumption that a header's key starts with a key character), so such
// text is refused here, with its line and column, before toml++ sees it.
void check_config_text(const std::string& text, const std::string& source_name);

// The parts of a --set key: `ds_config.optimizer.params.lr` or `repro."rows"`. Parts are
// bare (letters, digits, _ and -) or quoted ('...' or "..." without escapes), separated
// by dots with optional spaces around them; no part may be empty.
std::vector<std::string> split_override_key(const std::string& key);

}  // namespace seqpar::repro
