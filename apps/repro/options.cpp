#include "apps/repro/options.h"

#include <stdexcept>

#include "apps/repro/config_input.h"
#include "apps/repro/policy.h"
#include "apps/repro/scenario_list.h"
#include "core/command_line.h"
#include "core/error.h"

namespace seqpar::repro {

const char* const kUsage =
    "usage: seqpar-repro [--scenario NAME] [--list-scenarios]\n"
    "                    [--config FILE] [--set section.key=value]... [--policy NAME|all]\n"
    "                    [--steps N] [--device cpu|cuda] [--backend local|nccl] [--nproc N]\n"
    "                    [--dump DIR [--overwrite]] [--json FILE|-] [--plot FILE]\n"
    "                    [--timeout SECONDS] [--print-config] [--local_rank N] [--help]\n"
    "                    [--version]\n"
    "\n"
    "Reproduces DeepSpeed issue #6868 (sequence-parallel ranks end a training step with\n"
    "different parameters) and its fix. With no arguments: the report's scenario, 4 ranks,\n"
    "sp 4, on the best place available (GPUs over NCCL, one GPU, or CPU threads).\n"
    "--config reads TOML, the report's YAML (ds_config: ...) or a DeepSpeed JSON config.\n"
    "Every option also takes the form --option=VALUE. --json - writes the JSON to stdout\n"
    "and the report to stderr. Policies: deepspeed-0.16, with-mpu, exact.\n"
    "See apps/repro/README.md.\n";

namespace {

std::string one_of(const std::string& option, const std::string& value,
                   const std::vector<std::string>& allowed) {
  for (const std::string& name : allowed) {
    if (value == name) return value;
  }
  std::string list;
  for (const std::string& name : allowed) list += (list.empty() ? "" : " or ") + name;
  SEQPAR_INPUT_FAIL("option ", option, " '", printable(value), "': expected ", list);
}

// Seconds, a number from 1 to a week: a collective that waits longer is a hang.
double parse_timeout(const std::string& text) {
  double seconds = 0;
  size_t used = 0;
  try {
    seconds = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SEQPAR_INPUT_CHECK(used > 0 && used == text.size() && seconds >= 1 && seconds <= kMaxTimeoutSeconds,
                     "--timeout ", printable(text), ": expected seconds from 1 to ",
                     kMaxTimeoutSeconds);
  return seconds;
}

std::string nonempty(const char* option, const std::string& value) {
  SEQPAR_INPUT_CHECK(!value.empty(), option, ": the path is empty");
  return value;
}

std::string scenario_named(const std::string& value) {
  std::vector<std::string> names;
  for (const ScenarioInfo& info : scenario_list()) names.emplace_back(info.name);
  return one_of("--scenario", value, names);
}

}  // namespace

Options parse_options(const std::vector<std::string>& arguments) {
  Options options;
  auto flag = [](std::vector<std::string> names, bool& target) {
    return CommandLineOption{std::move(names), false, [&target](const std::string&) { target = true; }};
  };
  auto text = [](std::vector<std::string> names, std::string& target) {
    return CommandLineOption{std::move(names), true, [&target](const std::string& v) { target = v; }};
  };
  parse_command_line(arguments, {
      flag({"--help", "-h"}, options.help),
      flag({"--version"}, options.version),
      flag({"--print-config"}, options.print_config),
      flag({"--overwrite"}, options.overwrite),
      flag({"--list-scenarios"}, options.list_scenarios),
      // --scenario NAME is --set repro.scenario="NAME", so a config's choice can be overridden.
      {{"--scenario"}, true, [&](const std::string& v) {
         options.overrides.push_back("repro.scenario=\"" +
                                     scenario_named(v) + "\"");
       }},
      text({"--config"}, options.config_path),
      {{"--policy"}, true, [&](const std::string& v) {
         if (v != "all") policy_named(v);  // rejects an unknown name, listing the known ones
         options.policy = v;
       }},
      // An empty --dump or --json would silently mean none (--plot '' is documented as none).
      {{"--dump"}, true, [&](const std::string& v) { options.dump_directory = nonempty("--dump", v); }},
      {{"--json"}, true, [&](const std::string& v) { options.json_path = nonempty("--json", v); }},
      text({"--plot"}, options.plot_path),
      {{"--set"}, true, [&](const std::string& v) { options.overrides.push_back(v); }},
      {{"--steps"}, true, [&](const std::string& v) {
         const int64_t steps = parse_integer_option("--steps", v, 1, int64_t{1} << 40);
         options.overrides.push_back("repro.steps=" + std::to_string(steps));
       }},
      {{"--device"}, true,
       [&](const std::string& v) { options.device = one_of("--device", v, {"cpu", "cuda"}); }},
      {{"--backend"}, true,
       [&](const std::string& v) { options.backend = one_of("--backend", v, {"local", "nccl"}); }},
      {{"--timeout"}, true, [&](const std::string& v) { options.timeout_seconds = parse_timeout(v); }},
      // DeepSpeed's launcher appends --local_rank=N to the program's arguments.
      {{"--local_rank", "--local-rank"}, true, [&](const std::string& v) {
         options.local_rank = static_cast<int>(parse_integer_option("--local_rank", v, 0, 1 << 20));
       }},
  });
  return options;
}

}  // namespace seqpar::repro
