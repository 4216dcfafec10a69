// The one way seqpar's programs read their command line (seqpar-repro and the bench
// programs), following the GNU conventions users expect:
//
//   --name VALUE and --name=VALUE      an option that takes a value
//   --name                             a flag (--name=VALUE is then an error)
//   --help / -h, --version             handled by the program (declare them as flags)
//   --                                 ends the options
//
// Everything wrong with the arguments throws seqpar::InputError with one line that
// names the argument and ends with "(try --help)"; programs print it and exit 2. An
// unknown option names the closest known one ("did you mean --steps?").
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace seqpar {

struct CommandLineOption {
  std::vector<std::string> names;  // "--steps"; aliases beside it ("--local_rank", "--local-rank")
  bool takes_value = true;
  // Called with the value ("" for a flag), in the order the arguments come. It may
  // throw InputError to reject the value.
  std::function<void(const std::string& value)> set;
  // For --help: the value's name ("N", "FILE") and what the option does, with its default.
  std::string value_name = "VALUE";
  std::string help = {};
};

// The options' descriptions for --help: each option's names and value, then its help
// text wrapped to `width` columns below them.
std::string command_line_help(const std::vector<CommandLineOption>& options, size_t width = 80);

// Reads `arguments` (without argv[0]) against `options`. A lone "--" ends the options;
// any argument after it, and any other argument not starting with '-', is an error:
// seqpar's programs take no positional arguments.
void parse_command_line(const std::vector<std::string>& arguments,
                        const std::vector<CommandLineOption>& options);

// Strict numbers for option values: the whole text must be the number, within
// [minimum, maximum]; errors name the option and the value.
int64_t parse_integer_option(const std::string& option, const std::string& text,
                             int64_t minimum, int64_t maximum);
double parse_number_option(const std::string& option, const std::string& text);

}  // namespace seqpar
