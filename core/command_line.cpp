#include "core/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <algorithm>

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

// "; did you mean --steps?" for the known name nearest to `name` (a typo of up to a
// third of its letters, or `name` a prefix of it), else "".
std::string suggestion(const std::vector<CommandLineOption>& options, const std::string& name) {
  std::string best;
  size_t best_distance = std::max<size_t>(1, name.size() / 3) + 1;
  for (const CommandLineOption& option : options) {
    for (const std::string& alias : option.names) {
      const bool prefix = name.size() >= 4 && alias.rfind(name, 0) == 0;
      const size_t distance = prefix ? 1 : edit_distance(name, alias);
      if (distance < best_distance) best = alias, best_distance = distance;
    }
  }
  return best.empty() ? "" : "; did you mean " + best + "?";
}

void parse_arguments(const std::vector<std::string>& arguments,
                     const std::vector<CommandLineOption>& options) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& argument = arguments[i];
    if (argument == "--") {
      SEQPAR_INPUT_CHECK(i + 1 == arguments.size(), "unexpected argument '", arguments[i + 1],
                         "' after --: this program takes only options");
      return;
    }
    SEQPAR_INPUT_CHECK(argument.size() > 1 && argument[0] == '-',
                       "unexpected argument '", argument, "': this program takes only options");
    const size_t equals = argument.rfind("--", 0) == 0 ? argument.find('=') : std::string::npos;
    const std::string name = argument.substr(0, equals);
    const CommandLineOption* option = find_option(options, name);
    SEQPAR_INPUT_CHECK(option != nullptr, "unknown option '", name, "'", suggestion(options, name));
    if (!option->takes_value) {
      SEQPAR_INPUT_CHECK(equals == std::string::npos, "option ", name, " takes no value, got '",
                         argument, "'");
      option->set("");
    } else if (equals != std::string::npos) {
      option->set(argument.substr(equals + 1));
    } else {
      SEQPAR_INPUT_CHECK(i + 1 < arguments.size(), "option ", name, " needs a value");
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
  SEQPAR_INPUT_CHECK(whole, "option ", option, " '", text, "' is not an integer");
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
  SEQPAR_INPUT_CHECK(whole, "option ", option, " '", text, "' is not a finite number");
  return value;
}

}  // namespace seqpar
