#include "apps/common/text.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace seqpar {

std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", byte);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

std::string abbreviated(const std::string& text, size_t max) {
  if (text.size() <= max) return printable(text);
  // Cut before a UTF-8 continuation byte's sequence starts, never inside one.
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return printable(text.substr(0, cut)) + "... (" + std::to_string(text.size() - cut) +
         " more bytes)";
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& known) {
  // A name far longer than any known one is no typo of it (and would cost its length
  // times theirs to compare).
  if (name.size() > 200) return "";
  std::string best;
  size_t best_distance = name.size() >= 5 ? std::max<size_t>(2, name.size() / 3) + 1 : 2;
  for (const std::string& candidate : known) {
    const bool prefix = name.size() >= 4 && candidate.rfind(name, 0) == 0;
    const size_t distance = prefix ? 1 : edit_distance(name, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  return best;
}

}  // namespace seqpar
