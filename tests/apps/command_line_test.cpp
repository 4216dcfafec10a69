#include <catch2/catch.hpp>

#include "apps/common/command_line.h"
#include "apps/common/text.h"
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

TEST_CASE("options take --name value and --name=value", "[apps][command_line]") {
  const Parsed parsed = parse({"--config", "a.toml", "--set=x=1", "--set", "y=2", "--verbose"});
  CHECK(parsed.config == "a.toml");
  CHECK(parsed.sets == std::vector<std::string>{"x=1", "y=2"});  // only the first '=' splits
  CHECK(parsed.verbose);
  CHECK(parse({"-c", "b"}).config == "b");
  CHECK(parse({"--config="}).config.empty());
}

TEST_CASE("argument errors are one line naming the argument", "[apps][command_line]") {
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

TEST_CASE("numbers in option values are whole and in range", "[apps][command_line]") {
  CHECK(parse_integer_option("--steps", "12", 1, 100) == 12);
  CHECK_THROWS_WITH(parse_integer_option("--steps", "12x", 1, 100), Catch::Contains("'12x'"));
  CHECK_THROWS_WITH(parse_integer_option("--steps", "", 1, 100), Catch::Contains("not an integer"));
  CHECK_THROWS_WITH(parse_integer_option("--steps", "0", 1, 100), Catch::Contains("[1, 100]"));
  CHECK_THROWS_AS(parse_integer_option("--steps", "99999999999999999999", 1, 100), InputError);
  CHECK(parse_number_option("--lr", "1e-4") == 1e-4);
  CHECK_THROWS_AS(parse_number_option("--lr", "nan"), InputError);
  CHECK_THROWS_AS(parse_number_option("--lr", "1e-4 "), InputError);
}

TEST_CASE("a lone -- ends the options; unknown options name the nearest known one", "[apps][command_line]") {
  CHECK(parse({"--verbose", "--"}).verbose);
  CHECK_THROWS_WITH(parse({"--", "x"}), Catch::Contains("unexpected argument 'x' after --"));
  CHECK_THROWS_WITH(parse({"--confg", "a"}), Catch::Contains("did you mean --config?"));
  CHECK_THROWS_WITH(parse({"--verb"}), Catch::Contains("did you mean --verbose?"));  // a prefix
  CHECK_THROWS_WITH(parse({"--zzzzzz"}), !Catch::Contains("did you mean"));
}

TEST_CASE("the help lists every option with its value's name and text", "[apps][command_line]") {
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

TEST_CASE("a value never comes from the next option, but may be - or a negative number",
          "[apps][command_line]") {
  CHECK_THROWS_WITH(parse({"--config", "--verbose"}),
                    Catch::Contains("option --config needs a value, got the option '--verbose'"));
  CHECK_THROWS_WITH(parse({"--config", "-q"}), Catch::Contains("got the option '-q'"));
  CHECK(parse({"--config=-q"}).config == "-q");  // written with '=', it is the value
  CHECK(parse({"--config", "-"}).config == "-");  // standard output
  CHECK(parse({"--config", "-1"}).config == "-1");
  CHECK(parse({"--config", "-0.5e-3"}).config == "-0.5e-3");
  CHECK_THROWS(parse({"--config", "-1x"}));
}

TEST_CASE("echoed arguments are abbreviated", "[apps][command_line]") {
  const std::string long_name = "--" + std::string(100000, 'x');
  try {
    parse({long_name});
    FAIL("no error");
  } catch (const InputError& error) {
    CHECK(std::string(error.what()).size() < 300);
    CHECK_THAT(error.what(), Catch::Contains("more bytes"));
  }
  CHECK(abbreviated(std::string(10, 'a'), 4) == "aaaa... (6 more bytes)");
  CHECK(abbreviated("a\nb") == "a\\nb");
  // A cut never splits a UTF-8 character: "é" is two bytes.
  CHECK(abbreviated("a\xC3\xA9" "b", 2) == "a... (3 more bytes)");
}

TEST_CASE("closest_name finds typos and prefixes, not strangers", "[apps][command_line]") {
  const std::vector<std::string> known = {"steps", "rows", "seed", "scenario"};
  CHECK(closest_name("setps", known) == "steps");
  CHECK(closest_name("scen", known) == "scenario");
  CHECK(closest_name("colums", known).empty());
  CHECK(closest_name(std::string(1000, 's'), known).empty());
}
