#include "apps/repro/config_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace seqpar::repro {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor however the reading ends.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// The length of the well-formed UTF-8 sequence at text[at] and its code point; 0 when
// it is malformed (truncated, overlong, a surrogate, or beyond U+10FFFF).
size_t utf8_sequence(const std::string& text, size_t at, uint32_t& code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  size_t length = 0;
  uint32_t smallest = 0;
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, smallest = 0x80, code_point = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, smallest = 0x800, code_point = lead & 0x0Fu;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, smallest = 0x10000, code_point = lead & 0x07u;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(at + i) & 0x3Fu);
  }
  const bool surrogate = code_point >= 0xD800 && code_point <= 0xDFFF;
  if (code_point < smallest || surrogate || code_point > 0x10FFFF) return 0;
  return length;
}

// The code points that toml++ 3.3's whitespace test (is_non_ascii_horizontal_whitespace)
// sends to __builtin_unreachable: those of its lookup's blocks 0, 11 and 63 that it does
// not name. It runs that test wherever whitespace may stand, which includes places
// inside strings (after a line-ending backslash), so these are refused everywhere.
bool breaks_toml_whitespace_test(uint32_t c) {
  return (c >= 0xA1 && c <= 0x499) || (c >= 0x2C5E && c <= 0x3057 && c != 0x3000) ||
         (c >= 0xFAE6 && c <= 0xFEFE);
}

// "config NAME line L column C" for the byte at `at`; columns count characters, not bytes.
std::string place(const std::string& source_name, const std::string& text, size_t at) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return seqpar::detail::concat("config ", source_name, " line ", line, " column ", column);
}

// "0xFF" (a byte) or "U+FE0F" (a code point).
std::string hex_name(const char* format, uint32_t value) {
  char name[16];
  std::snprintf(name, sizeof name, format, static_cast<unsigned>(value));
  return name;
}

// Where a TOML scanner stands: outside any string or comment, or inside one of them.
enum class Context { Outside, Comment, Basic, Literal, MultiBasic, MultiLiteral };

size_t run_of(const std::string& text, size_t at, char c) {
  size_t end = at;
  while (end < text.size() && text[end] == c) ++end;
  return end - at;
}

bool is_bare_key_character(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

size_t skip_blanks(const std::string& text, size_t at) {
  while (at < text.size() && (text[at] == ' ' || text[at] == '\t')) ++at;
  return at;
}

// A table header ("[a]", "[[a]]") at `at`: the offset of the first character of its key
// when that cannot begin a key, else npos. toml++ 3.3 assumes that it can (an assertion
// that is undefined behaviour in release builds) instead of reporting the error.
size_t bad_table_header(const std::string& text, size_t at) {
  size_t next = skip_blanks(text, at + 1);
  if (next < text.size() && text[next] == '[') next = skip_blanks(text, next + 1);
  if (next >= text.size()) return std::string::npos;
  const char c = text[next];
  return is_bare_key_character(c) || c == '"' || c == '\'' || c == ']' ? std::string::npos : next;
}

// What toml++ 3.3 must not see, and where.
struct Unsafe {
  size_t offset = std::string::npos;
  const char* reason = nullptr;
};

bool is_digit(const std::string& text, size_t at) {
  return at < text.size() && text[at] >= '0' && text[at] <= '9';
}

// Scans TOML just far enough to know, for each byte, whether it is in a string or a
// comment, and where the table headers are (a '[' that opens a line outside any array
// or inline table). Up to TOML's first error, which ends toml++'s parse, it places every
// byte as toml++ does. Finds the first text toml++ 3.3 must not see outside strings and
// comments: a non-ASCII byte, a table header without a key, or a date or time (':', or
// '-' between digits), whose parser assumes digits where the text may have none. No
// configuration value is a date or a time, so refusing them loses nothing.
Unsafe first_unsafe_text(const std::string& text, size_t start) {
  Context context = Context::Outside;
  int depth = 0;             // open arrays and inline tables of values
  bool line_start = true;    // only blanks since the last line break
  char previous = '\n';      // the last character outside strings that is not a blank
  for (size_t i = start; i < text.size();) {
    const char c = text[i];
    switch (context) {
      case Context::Outside: {
        if (static_cast<unsigned char>(c) >= 0x80) return {i, "a non-ASCII character"};
        if (c == ':' || (c == '-' && i > 0 && is_digit(text, i - 1) && is_digit(text, i + 1))) {
          return {i, "a date or time (not a configuration value)"};
        }
        if (c == '[' && depth == 0 && line_start) {
          const size_t bad = bad_table_header(text, i);
          if (bad != std::string::npos) return {bad, "a table header without a key"};
          line_start = false;
          i += text.compare(i, 2, "[[") == 0 ? 2 : 1;
          continue;
        }
        if (c == '[' || c == '{') ++depth;
        if ((c == ']' || c == '}') && depth > 0) --depth;
        if (c == '#') context = Context::Comment;
        // A quote opens a string only where a key or a value begins; elsewhere (after
        // "--x" in `a = --x"y"`) toml++ reads it as part of a malformed bare value.
        const bool value_or_key_start = previous != 0 && std::strchr("\n=[{,.", previous) != nullptr;
        if (c != ' ' && c != '\t' && c != '\r') previous = c;
        if ((c == '"' || c == '\'') && value_or_key_start) {
          const bool multi = run_of(text, i, c) >= 3;
          context = c == '"' ? (multi ? Context::MultiBasic : Context::Basic)
                             : (multi ? Context::MultiLiteral : Context::Literal);
          line_start = false;
          i += multi ? 3 : 1;
          continue;
        }
        if (c == '\n') line_start = true;
        else if (c != ' ' && c != '\t' && c != '\r') line_start = false;
        break;
      }
      case Context::Comment:
        if (c == '\n') context = Context::Outside, line_start = true, previous = '\n';
        break;
      case Context::Basic:
      case Context::Literal:
        if (c == '\\' && context == Context::Basic) {
          i += 2;  // an escaped character never ends the string
          continue;
        }
        if (c == '\n') line_start = true, previous = '\n';
        if (c == (context == Context::Basic ? '"' : '\'')) previous = c;  // a value ended
        if (c == '\n' || c == (context == Context::Basic ? '"' : '\'')) context = Context::Outside;
        break;
      case Context::MultiBasic:
      case Context::MultiLiteral: {
        if (c == '\\' && context == Context::MultiBasic) {
          i += 2;
          continue;
        }
        const char quote = context == Context::MultiBasic ? '"' : '\'';
        if (c == quote) {
          // Up to two quotes may precede the closing three; the whole run goes at once.
          const size_t run = run_of(text, i, quote);
          if (run >= 3) context = Context::Outside, previous = quote;
          i += run;
          continue;
        }
        break;
      }
    }
    ++i;
  }
  return {};
}

}  // namespace

std::string read_config_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  SEQPAR_INPUT_CHECK(file.fd >= 0, "--config ", abbreviated(path), ": cannot open: ", std::strerror(errno));
  struct stat status {};
  SEQPAR_INPUT_CHECK(::fstat(file.fd, &status) == 0, "--config ", abbreviated(path), ": cannot stat: ",
                     std::strerror(errno));
  SEQPAR_INPUT_CHECK(S_ISREG(status.st_mode), "--config ", abbreviated(path), ": ", file_kind(status.st_mode),
                     ", not a regular file");
  SEQPAR_INPUT_CHECK(status.st_size <= static_cast<off_t>(kMaxConfigBytes), "--config ", abbreviated(path),
                     ": ", status.st_size, " bytes, more than the limit of ", kMaxConfigBytes);
  std::string text;
  char buffer[16384];
  for (;;) {
    const ssize_t count = ::read(file.fd, buffer, sizeof buffer);
    if (count < 0 && errno == EINTR) continue;
    SEQPAR_INPUT_CHECK(count >= 0, "--config ", abbreviated(path), ": cannot read: ", std::strerror(errno));
    if (count == 0) break;
    text.append(buffer, static_cast<size_t>(count));
    // A file that grows while it is read is still held to the limit.
    SEQPAR_INPUT_CHECK(text.size() <= kMaxConfigBytes, "--config ", abbreviated(path),
                       ": more than the limit of ", kMaxConfigBytes, " bytes");
  }
  return text;
}

void check_text_encoding(const std::string& text, const std::string& source_name) {
  for (size_t i = 0; i < text.size();) {
    uint32_t code_point = 0;
    const size_t length = utf8_sequence(text, i, code_point);
    const bool control = length == 1 && (code_point < 0x20 || code_point == 0x7F) &&
                         code_point != '\t' && code_point != '\n' && code_point != '\r';
    SEQPAR_INPUT_CHECK(length != 0 && !control, place(source_name, text, i), ": ",
                       control ? "a control character (byte " : "not valid UTF-8 (byte ",
                       hex_name("0x%02X", static_cast<unsigned char>(text[i])), ")");
    i += length;
  }
}

void check_config_text(const std::string& text, const std::string& source_name) {
  check_text_encoding(text, source_name);
  for (size_t i = 0; i < text.size();) {
    uint32_t code_point = 0;
    const size_t length = utf8_sequence(text, i, code_point);  // well-formed: checked above
    SEQPAR_INPUT_CHECK(!breaks_toml_whitespace_test(code_point), place(source_name, text, i),
                       ": character ", hex_name("U+%04X", code_point), " is not accepted (the TOML "
                       "parser, toml++ 3.3, mishandles U+00A1-U+0499, U+2C5E-U+3057 and U+FAE6-U+FEFE)");
    i += length;
  }
  const size_t bom = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // a leading byte-order mark
  const Unsafe unsafe = first_unsafe_text(text, bom);
  if (unsafe.reason == nullptr) return;
  const size_t at = unsafe.offset;
  SEQPAR_INPUT_CHECK(static_cast<unsigned char>(text[at]) >= 0x80, place(source_name, text, at), ": ",
                     unsafe.reason, ", saw '", printable(std::string(1, text[at])),
                     "' (not accepted outside strings)");
  uint32_t code_point = 0;
  utf8_sequence(text, at, code_point);
  SEQPAR_INPUT_FAIL(place(source_name, text, at), ": non-ASCII character ", hex_name("U+%04X", code_point),
                    " outside a string or comment (TOML allows only ASCII there)");
}

std::vector<std::string> split_override_key(const std::string& key) {
  std::vector<std::string> parts;
  const auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  size_t i = 0;
  for (;;) {
    while (i < key.size() && is_space(key[i])) ++i;
    std::string part;
    if (i < key.size() && (key[i] == '"' || key[i] == '\'')) {
      const size_t close = key.find(key[i], i + 1);
      SEQPAR_INPUT_CHECK(close != std::string::npos, "--set ", key, ": unterminated quote");
      part = key.substr(i + 1, close - i - 1);
      SEQPAR_INPUT_CHECK(part.find('\\') == std::string::npos, "--set ", key,
                         ": escapes in quoted key parts are not supported");
      i = close + 1;
    } else {
      while (i < key.size() && is_bare_key_character(key[i])) part += key[i++];
    }
    SEQPAR_INPUT_CHECK(!part.empty(), "--set ", key, ": empty key part at position ", i + 1,
                       " (expected section.key=value)");
    parts.push_back(part);
    while (i < key.size() && is_space(key[i])) ++i;
    if (i == key.size()) break;
    SEQPAR_INPUT_CHECK(key[i] == '.', "--set ", key, ": unexpected '", printable(std::string(1, key[i])), "' at position ",
                       i + 1, " (a key is section.key, parts bare or quoted)");
    ++i;
  }
  return parts;
}

}  // namespace seqpar::repro
