#include <catch2/catch.hpp>

#include "core/command_line.h"
#include "core/error.h"

using namespace seqpar;

namespace {

struct Parsed {
  std::string config;
  std::vector<std::string> sets;
  bool verbose = false;
};

Parsed parse(const std::vector<std::string>& arguments) {
  Parsed parsed;
  parse_command_line(arguments, {
      {{"--config", "-c"}, true, [&](const std::string& v) { parsed.config = v; }},
      {{"--set"}, true, [&](const std::string& v) { parsed.sets.push_back(v); }},
      {{"--verbose"}, false, [&](const std::string&) { parsed.verbose = true; }},
  });
  return parsed;
}

}  // namespace

TEST_CASE("options take --name value and --name=value", "[core][command_line]") {
  const Parsed parsed = parse({"--config", "a.toml", "--set=x=1", "--set", "y=2", "--verbose"});
  CHECK(parsed.config == "a.toml");
  CHECK(parsed.sets == std::vector<std::string>{"x=1", "y=2"});  // only the first '=' splits
  CHECK(parsed.verbose);
  CHECK(parse({"-c", "b"}).config == "b");
  CHECK(parse({"--config="}).config.empty());
}

TEST_CASE("argument errors are one line naming the argument", "[core][command_line]") {
  auto fails = [](const std::vector<std::string>& arguments, const std::string& text) {
    CHECK_THROWS_AS(parse(arguments), InputError);
    CHECK_THROWS_WITH(parse(arguments), Catch::Contains(text) && Catch::EndsWith("(try --help)") &&
                                            !Catch::Contains("\n") && !Catch::Contains(".cpp"));
  };
  fails({"--bogus"}, "unknown option '--bogus'");
  fails({"--bogus=1"}, "unknown option '--bogus'");
  fails({"--config"}, "option --config needs a value");
  fails({"--verbose=yes"}, "takes no value");
  fails({"stray"}, "unexpected argument 'stray'");
  fails({"-"}, "unexpected argument '-'");
  fails({"--verbos"}, "did you mean --verbose?");
}

TEST_CASE("numbers in option values are whole and in range", "[core][command_line]") {
  CHECK(parse_integer_option("--steps", "12", 1, 100) == 12);
  CHECK_THROWS_WITH(parse_integer_option("--steps", "12x", 1, 100), Catch::Contains("'12x'"));
  CHECK_THROWS_WITH(parse_integer_option("--steps", "", 1, 100), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(parse_integer_option("--steps", "0", 1, 100), Catch::Contains("[1, 100]"));
  CHECK_THROWS_AS(parse_integer_option("--steps", "99999999999999999999", 1, 100), InputError);
  CHECK(parse_number_option("--lr", "1e-4") == 1e-4);
  CHECK_THROWS_AS(parse_number_option("--lr", "nan"), InputError);
  CHECK_THROWS_AS(parse_number_option("--lr", "1e-4 "), InputError);
}

TEST_CASE("a lone -- ends the options; unknown options name the nearest known one", "[core][command_line]") {
  CHECK(parse({"--verbose", "--"}).verbose);
  CHECK_THROWS_WITH(parse({"--", "x"}), Catch::Contains("unexpected argument 'x' after --"));
  CHECK_THROWS_WITH(parse({"--confg", "a"}), Catch::Contains("did you mean --config?"));
  CHECK_THROWS_WITH(parse({"--verb"}), Catch::Contains("did you mean --verbose?"));  // a prefix
  CHECK_THROWS_WITH(parse({"--zzzzzz"}), !Catch::Contains("did you mean"));
}

TEST_CASE("the help lists every option with its value's name and text", "[core][command_line]") {
  const std::string help = command_line_help({
      {{"--steps"}, true, [](const std::string&) {}, "N", "Training steps. Default: 1."},
      {{"-q", "--quiet"}, false, [](const std::string&) {}, "", "No progress."},
  });
  CHECK(help == "  --steps N\n        Training steps. Default: 1.\n  -q, --quiet\n        No progress.\n");
  // Long texts wrap within the width.
  const std::string long_help = command_line_help(
      {{{"--x"}, false, [](const std::string&) {}, "", std::string(30, 'a') + " " + std::string(60, 'b')}}, 80);
  CHECK(long_help == "  --x\n        " + std::string(30, 'a') + "\n        " + std::string(60, 'b') + "\n");
}
