#include "core/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

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

void parse_arguments(const std::vector<std::string>& arguments,
                     const std::vector<CommandLineOption>& options) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& argument = arguments[i];
    SEQPAR_INPUT_CHECK(argument.size() > 1 && argument[0] == '-' && argument != "--",
                       "unexpected argument '", argument, "': this program takes only options");
    const size_t equals = argument.rfind("--", 0) == 0 ? argument.find('=') : std::string::npos;
    const std::string name = argument.substr(0, equals);
    const CommandLineOption* option = find_option(options, name);
    SEQPAR_INPUT_CHECK(option != nullptr, "unknown option '", name, "'");
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

}  // namespace

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
