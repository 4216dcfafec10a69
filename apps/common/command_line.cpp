#include "apps/common/command_line.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <algorithm>

#include "apps/common/text.h"
#include "core/error.h"

namespace seqpar {

namespace {

const CommandLineOption* find_option(const std::vector<CommandLineOption>& options,
                                     const std::string& name) {
  for (const CommandLineOption& option : options) {
    for (const std::string& alias : option.names) {
      if (alias == name) return &option;
    }
  }
  return nullptr;
}

// "-1", "-0.5", "-1e-3": a value, not an option (argparse's rule, seqpar's programs having
// no option that looks like a number).
bool is_negative_number(const std::string& text) {
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return text.size() > 1 && text[0] == '-' && (std::isdigit(static_cast<unsigned char>(text[1])) || text[1] == '.') &&
         end == text.c_str() + text.size();
}

// "; did you mean --steps?" for the known name nearest to `name`, else "".
std::string suggestion(const std::vector<CommandLineOption>& options, const std::string& name) {
  std::vector<std::string> names;
  for (const CommandLineOption& option : options) {
    names.insert(names.end(), option.names.begin(), option.names.end());
  }
  const std::string best = closest_name(name, names);
  return best.empty() ? "" : "; did you mean " + best + "?";
}

void parse_arguments(const std::vector<std::string>& arguments,
                     const std::vector<CommandLineOption>& options) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& argument = arguments[i];
    if (argument == "--") {
      SEQPAR_INPUT_CHECK(i + 1 == arguments.size(), "unexpected argument '", abbreviated(arguments[i + 1]),
                         "' after --: this program takes only options");
      return;
    }
    SEQPAR_INPUT_CHECK(argument.size() > 1 && argument[0] == '-',
                       "unexpected argument '", abbreviated(argument), "': this program takes only options");
    const size_t equals = argument.rfind("--", 0) == 0 ? argument.find('=') : std::string::npos;
    const std::string name = argument.substr(0, equals);
    const CommandLineOption* option = find_option(options, name);
    SEQPAR_INPUT_CHECK(option != nullptr, "unknown option '", abbreviated(name), "'",
                       suggestion(options, name));
    if (!option->takes_value) {
      SEQPAR_INPUT_CHECK(equals == std::string::npos, "option ", name, " takes no value, got '",
                         abbreviated(argument), "'");
      option->set("");
    } else if (equals != std::string::npos) {
      option->set(argument.substr(equals + 1));
    } else {
      SEQPAR_INPUT_CHECK(i + 1 < arguments.size(), "option ", name, " needs a value");
      // A value never comes from the next option (`--json -q` is not a file named -q),
      // as argparse has it; a value that starts with '-' is written --json=-q. A lone
      // "-" (standard output) and a negative number are values.
      const std::string& next = arguments[i + 1];
      SEQPAR_INPUT_CHECK(next.size() < 2 || next[0] != '-' || is_negative_number(next), "option ", name,
                         " needs a value, got the option '", abbreviated(next),
                         "' (a value that starts with '-' is written ", name, "=VALUE)");
      option->set(arguments[++i]);
    }
  }
}

// Words of `text` on lines of at most `width` columns, each line indented by `indent`.
std::string wrapped(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(" \n", start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    if (!word.empty()) line += (line.empty() ? "" : " ") + word;
    if (end < text.size() && text[end] == '\n' && !line.empty()) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    start = end + 1;
  }
  if (!line.empty()) out += std::string(indent, ' ') + line + "\n";
  return out;
}

}  // namespace

std::string command_line_help(const std::vector<CommandLineOption>& options, size_t width) {
  std::string out;
  for (const CommandLineOption& option : options) {
    std::string names;
    for (const std::string& alias : option.names) {
      names += (names.empty() ? "" : ", ") + alias;
    }
    if (option.takes_value) names += " " + option.value_name;
    out += "  " + names + "\n" + wrapped(option.help, 8, width);
  }
  return out;
}

void parse_command_line(const std::vector<std::string>& arguments,
                        const std::vector<CommandLineOption>& options) {
  try {
    parse_arguments(arguments, options);
  } catch (const InputError& error) {
    throw InputError(std::string(error.what()) + " (try --help)");
  }
}

int64_t parse_integer_option(const std::string& option, const std::string& text,
                             int64_t minimum, int64_t maximum) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end == text.c_str() + text.size() && errno == 0 &&
                     text.find_first_of(" \t") == std::string::npos;
  SEQPAR_INPUT_CHECK(whole, "option ", option, " '", abbreviated(text), "' is not an integer");
  SEQPAR_INPUT_CHECK(value >= minimum && value <= maximum, "option ", option, " ", value,
                     " is out of range [", minimum, ", ", maximum, "]");
  return value;
}

double parse_number_option(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool whole = !text.empty() && end == text.c_str() + text.size() && errno == 0 &&
                     std::isfinite(value) && text.find_first_of(" \t") == std::string::npos;
  SEQPAR_INPUT_CHECK(whole, "option ", option, " '", abbreviated(text), "' is not a finite number");
  return value;
}

}  // namespace seqpar
