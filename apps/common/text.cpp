#include "apps/common/text.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <vector>

namespace seqpar {

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (2 to 4 bytes), or 0 when the
// bytes there are not one: overlong forms, surrogates and values above U+10FFFF included.
size_t utf8_sequence(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the allowed range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) length = 2;
  else if (lead >= 0xe0 && lead <= 0xef) length = 3, low = lead == 0xe0 ? 0xa0 : 0x80, high = lead == 0xed ? 0x9f : 0xbf;
  else if (lead >= 0xf0 && lead <= 0xf4) length = 4, low = lead == 0xf0 ? 0x90 : 0x80, high = lead == 0xf4 ? 0x8f : 0xbf;
  if (length == 0 || i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  }
  return length;
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
      ++i;
    } else if (const size_t length = c >= 0x80 ? utf8_sequence(text, i) : 0) {
      out.append(text, i, length);
      i += length;
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(c));
      out += hex;
      ++i;
    }
  }
  return out;
}

std::string abbreviated(const std::string& text, size_t max) {
  const std::string shown = printable(text);
  if (shown.size() <= max) return shown;
  size_t cut = max;  // back to the start of a UTF-8 sequence, never inside one
  while (cut > 0 && (static_cast<unsigned char>(shown[cut]) & 0xC0) == 0x80) --cut;
  return shown.substr(0, cut) + "... (" + std::to_string(shown.size() - cut) + " more bytes)";
}

std::string printable_lines(const std::string& text) {
  std::string out;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    out += printable(text.substr(start, end - start)) + '\n';
  }
  return out + printable(text.substr(start));
}

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

std::string wrap_text(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += (out.empty() ? "" : "\n" + std::string(indent, ' ')) + line;
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) out += (out.empty() ? "" : "\n" + std::string(indent, ' ')) + line;
  return out;
}

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

std::string printf_text(const char* pattern, ...) {
  char text[1024];
  va_list arguments;
  va_start(arguments, pattern);
  std::vsnprintf(text, sizeof text, pattern, arguments);
  va_end(arguments);
  return text;
}

}  // namespace seqpar
