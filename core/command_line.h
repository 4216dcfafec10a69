// The one way seqpar's programs read their command line (seqpar-repro and the bench
// programs), following the GNU conventions users expect:
//
//   --name VALUE and --name=VALUE      an option that takes a value
//   --name                             a flag (--name=VALUE is then an error)
//   --help / -h, --version             handled by the program (declare them as flags)
//
// Everything wrong with the arguments throws seqpar::InputError with one line that
// names the argument and ends with "(try --help)"; programs print it and exit 2.
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
};

// Reads `arguments` (without argv[0]) against `options`. A lone "--" ends the options;
// what follows it, and any argument not starting with '-', is an error: seqpar's
// programs take no positional arguments.
void parse_command_line(const std::vector<std::string>& arguments,
                        const std::vector<CommandLineOption>& options);

// Strict numbers for option values: the whole text must be the number, within
// [minimum, maximum]; errors name the option and the value.
int64_t parse_integer_option(const std::string& option, const std::string& text,
                             int64_t minimum, int64_t maximum);
double parse_number_option(const std::string& option, const std::string& text);

}  // namespace seqpar
