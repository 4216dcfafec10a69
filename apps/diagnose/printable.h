// Text from a user's files or command line (tensor names, dtypes, paths), made safe to
// print: the one place seqpar-diagnose escapes what it did not write itself.
//
// A name can hold anything JSON can: ESC sequences that would drive the terminal, a
// newline that would split a one-line error, bytes that are not UTF-8, or a megabyte
// of text. printable() keeps printable ASCII and well-formed UTF-8 as they are, writes
// every control character (newline and ESC included), DEL and every byte of invalid
// UTF-8 as \xNN, and shortens text longer than `limit` bytes to its head and tail
// around "...". A backslash is left alone, so text escaped once is unchanged by a
// second pass.
#pragma once

#include <cstddef>
#include <string>

namespace seqpar::diagnose {

constexpr size_t kPrintableLimit = 160;

std::string printable(const std::string& text, size_t limit = kPrintableLimit);

// A whole report: each line through printable() (without shortening), the newlines
// between them kept.
std::string printable_lines(const std::string& text);

}  // namespace seqpar::diagnose
