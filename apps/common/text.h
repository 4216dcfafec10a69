// Text that quotes what a user gave (a path, a key, a value), made safe to echo in a
// one-line message: control characters escaped, and long text cut short.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace seqpar {

// `text` made safe to print: printable ASCII and well-formed UTF-8 as they are; every
// control character (newline and ESC included), DEL and every byte of invalid UTF-8 as
// \xhh. So a message quoting a path, a key or a tensor name stays on one line, sends
// no terminal sequence and is valid UTF-8. A backslash is left alone, so text escaped
// once is unchanged by a second pass.
std::string printable(const std::string& text);

// printable(text), cut to about its first `max` bytes with how much was left out
// ("aaaa... (99920 more bytes)"): a 100,000-character argument echoed whole would bury
// the message. A cut never splits a character.
std::string abbreviated(const std::string& text, size_t max = 120);

// A whole report: each line through printable(), the newlines between them kept.
std::string printable_lines(const std::string& text);

// `text` broken at spaces into lines of at most `width` columns, every line after the
// first indented by `indent` spaces (the first is where the caller has put it).
std::string wrap_text(const std::string& text, size_t indent, size_t width);

// printf's formatting into a string (a report line: at most 1023 bytes).
std::string printf_text(const char* pattern, ...) __attribute__((format(printf, 1, 2)));

// A figure for the reports: four significant digits ("0.2775", "4", "1.2e-05").
std::string number_text(double value);

// The number of single-letter insertions, deletions and substitutions that turn `a`
// into `b` (Levenshtein's distance).
size_t edit_distance(const std::string& a, const std::string& b);

// The name among `known` nearest to `name`: a typo of up to a third of its letters, or
// `name` (4 letters or more) a prefix of it; "" when none is that near. For "did you
// mean ...?".
std::string closest_name(const std::string& name, const std::vector<std::string>& known);

}  // namespace seqpar
