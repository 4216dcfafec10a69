// Text that quotes what a user gave (a path, a key, a value), made safe to echo in a
// one-line message: control characters escaped, and long text cut short.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace seqpar {

// `text` with control characters written as \n, \t or \xHH, so that a message quoting
// what the user typed stays on one line and sends no terminal sequence.
std::string printable(const std::string& text);

// printable(text), cut to its first `max` characters with how much was left out
// ("aaaa... (99920 more bytes)"): a 100,000-character argument echoed whole
// would bury the message.
std::string abbreviated(const std::string& text, size_t max = 80);

// The name among `known` nearest to `name`: a typo of up to a third of its letters, or
// `name` (4 letters or more) a prefix of it; "" when none is that near. For "did you
// mean ...?".
std::string closest_name(const std::string& name, const std::vector<std::string>& known);

}  // namespace seqpar
