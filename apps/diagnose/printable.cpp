#include "apps/diagnose/printable.h"

#include <cstdio>

namespace seqpar::diagnose {

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

std::string escaped(const std::string& text) {
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

// Back from `end` to the start of a UTF-8 sequence, so a cut never splits a character.
size_t character_boundary(const std::string& text, size_t end) {
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
  return end;
}

}  // namespace

std::string printable(const std::string& text, size_t limit) {
  const std::string out = escaped(text);
  if (out.size() <= limit || limit < 16) return out;
  const size_t head = character_boundary(out, limit / 2 - 2);
  const size_t tail = character_boundary(out, out.size() - (limit - head - 3));
  return out.substr(0, head) + "..." + out.substr(tail);
}

std::string printable_lines(const std::string& text) {
  std::string out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) return out + escaped(text.substr(start));
    out += escaped(text.substr(start, end - start)) + '\n';
    start = end + 1;
  }
  return out;
}

}  // namespace seqpar::diagnose
