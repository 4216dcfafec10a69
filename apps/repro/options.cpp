#include "apps/repro/options.h"

#include <stdexcept>

#include "apps/repro/config_input.h"
#include "apps/repro/policy.h"
#include "apps/repro/scenario_list.h"
#include "apps/common/command_line.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

std::string one_of(const std::string& option, const std::string& value,
                   const std::vector<std::string>& allowed) {
  for (const std::string& name : allowed) {
    if (value == name) return value;
  }
  std::string list;
  for (const std::string& name : allowed) list += (list.empty() ? "" : " or ") + name;
  SEQPAR_INPUT_FAIL("option ", option, " '", abbreviated(value), "': expected ", list);
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
                     "--timeout ", abbreviated(text), ": expected seconds from 1 to ",
                     kMaxTimeoutSeconds);
  return seconds;
}

// --plot's picture is SVG: a name with another extension (out.png) would get SVG under
// a name that says otherwise, so it is refused. A name without one (/dev/stdout) is taken.
void check_plot_extension(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const bool has_extension = dot != std::string::npos && dot > 0 &&
                             (slash == std::string::npos || dot > slash + 1);
  SEQPAR_INPUT_CHECK(!has_extension || path.compare(dot, std::string::npos, ".svg") == 0, "--plot ",
                     abbreviated(path), ": the drift picture is written as SVG only; name a .svg file");
}

// An empty --dump or --json would silently mean none (--plot '' is documented as none).
std::string nonempty(const char* option, const std::string& value) {
  SEQPAR_INPUT_CHECK(!value.empty(), option, ": the path is empty");
  return value;
}

std::string scenario_named(const std::string& value) {
  std::vector<std::string> names;
  for (const ScenarioInfo& info : scenario_list()) names.emplace_back(info.name);
  return one_of("--scenario", value, names);
}


// The options, each with what --help says of it, writing into `options`.
std::vector<CommandLineOption> option_table(Options& options) {
  auto flag = [](std::vector<std::string> names, bool& target, std::string help) {
    return CommandLineOption{std::move(names), false,
                             [&target](const std::string&) { target = true; }, "", std::move(help)};
  };
  return {
      {{"--scenario"}, true,
       [&](const std::string& v) {
         options.overrides.push_back("repro.scenario=\"" + scenario_named(v) + "\"");
       },
       "NAME",
       "Run scenario NAME with its defaults: exactly what --config configs/NAME.toml runs "
       "(--list-scenarios names them). Default: issue-6868, the bug report's."},
      flag({"--list-scenarios"}, options.list_scenarios, "List the scenarios and exit."),
      {{"--config", "--config-file", "--deepspeed_config"}, true,
       [&](const std::string& v) {
         // One file: a second would silently win over the first.
         SEQPAR_INPUT_CHECK(options.config_path.empty(), "--config ", abbreviated(v),
                            ": a config was already given (", abbreviated(options.config_path),
                            "); give one");
         options.config_path = v;
       },
       "FILE",
       "Read the scenario from FILE: seqpar's TOML, the report's YAML (ds_config: ...) "
       "or a DeepSpeed JSON config. Keys it leaves out take the scenario's values, "
       "which the report lists. --config-file is the report's script's name for it, "
       "--deepspeed_config DeepSpeed's. Default: none (the built-in scenario)."},
      {{"--set"}, true, [&](const std::string& v) { options.overrides.push_back(v); },
       "KEY=VALUE",
       "Set one config key, after --config: --set repro.rows=4000, --set "
       "ds_config.optimizer.type=AdamW (a value that is not TOML is a string). Repeatable."},
      {{"--steps"}, true,
       [&](const std::string& v) {
         const int64_t steps = parse_integer_option("--steps", v, 1, int64_t{1} << 40);
         options.overrides.push_back("repro.steps=" + std::to_string(steps));
       },
       "N", "Training steps; the same as --set repro.steps=N. Default: the scenario's (1 for "
            "issue-6868)."},
      {{"--policy"}, true,
       [&](const std::string& v) {
         if (v != "all") policy_named(v);  // rejects an unknown name, listing the known ones
         options.policy = v;
       },
       "NAME|all",
       "Scenario issue-6868 only: run one policy (deepspeed-0.16, with-mpu, exact). Default: "
       "all."},
      {{"--device"}, true,
       [&](const std::string& v) {
         options.device = one_of("--device", v, {"cpu", "reference", "cuda"});
       },
       "cpu|reference|cuda",
       "Where the ranks compute. Default: cuda where there is a GPU, else cpu. reference: "
       "every op as the plain loops that define the bits (slower; the same results)."},
      {{"--backend"}, true,
       [&](const std::string& v) { options.backend = one_of("--backend", v, {"local", "nccl"}); },
       "local|nccl",
       "local: every rank a thread of this process (a launcher's variables are then not read); "
       "nccl: one process per GPU. Default: nccl with a GPU per rank, else local."},
      {{"--nproc"}, true, [](const std::string&) {}, "N",
       "Start N processes, one per GPU, over NCCL, as torchrun --nproc-per-node N does. "
       "Default: none (seqpar-repro starts them itself when it picks nccl)."},
      {{"--dump"}, true,
       [&](const std::string& v) { options.dump_directory = nonempty("--dump", v); }, "DIR",
       "Write safetensors into DIR (new or empty, or with --overwrite an earlier dump): "
       "inputs.safetensors (the inputs and the initial parameters), reference.safetensors (the "
       "one-rank baseline) and per policy or variant: issue-6868 each rank's parameters and "
       "gradients after the last step (POLICY/rankR.safetensors); shifted-targets, dropout, "
       "masked-tokens, clipping-norms the final parameters, step 1's gradients and clip_norm "
       "(variantN.safetensors); ulysses no parameters, but step 1's attention output "
       "('attention') and block output ('output') of all ranks' rows (VARIANT.safetensors, "
       "the baseline's in reference.safetensors); context-parallel step 1's block output "
       "('output', rows in position order) and gradients summed over the ranks ('grad.NAME') "
       "(VARIANT.safetensors). zero-stage refuses --dump. Default: none."},
      flag({"--overwrite"}, options.overwrite, "Let --dump replace an earlier dump in DIR."),
      {{"--json"}, true,
       [&](const std::string& v) { options.json_path = nonempty("--json", v); }, "FILE|-",
       "Write every figure as JSON to FILE; - writes it to stdout and the report to stderr. "
       "Default: none."},
      {{"--plot"}, true,
       [&](const std::string& v) {
         check_plot_extension(v);
         options.plot_path = v;
         options.plot_given = true;
       },
       "FILE",
       "Scenario issue-6868, 2 steps or more: the drift picture (SVG) into FILE and, for "
       "NAME.svg, its series as CSV into NAME.csv; an empty FILE writes none. Default: "
       "seqpar-repro-drift.svg."},
      {{"--timeout"}, true,
       [&](const std::string& v) { options.timeout_seconds = parse_timeout(v); }, "SECONDS",
       "The longest a collective waits for its last rank before the run fails. Default: a "
       "minute plus the time the scenario's step should take."},
      flag({"--print-config"}, options.print_config,
           "Print the configuration the run would use, as TOML, and exit."),
      flag({"-q", "--quiet"}, options.quiet, "No progress on stderr; the report still prints."),
      {{"--local_rank", "--local-rank"}, true,
       [&](const std::string& v) {
         options.local_rank = static_cast<int>(parse_integer_option("--local_rank", v, 0, 1 << 20));
       },
       "N", "Passed by DeepSpeed's launcher; must agree with LOCAL_RANK."},
      flag({"--deepspeed"}, options.deepspeed,
           "Passed by DeepSpeed's launcher (the report's script takes it); the runs are "
           "DeepSpeed's already, so it changes nothing."),
      flag({"--version"}, options.version, "Print the version and exit."),
      flag({"-h", "--help"}, options.help, "Print this help and exit."),
  };
}

}  // namespace

std::string help_text() {
  Options unused;
  return "usage: seqpar-repro [OPTION]...\n"
         "\n"
         "Reproduces DeepSpeed issue #6868 (sequence-parallel ranks end a training step with\n"
         "different parameters) and its fix, against one-rank training. With no options: the\n"
         "report's scenario, 4 ranks, sp 4, on the best place available (GPUs over NCCL, one\n"
         "GPU, or CPU threads). Every option also takes the form --option=VALUE; -- ends them.\n"
         "\n"
         "options:\n" +
         command_line_help(option_table(unused)) +
         "\n"
         "examples:\n"
         "  seqpar-repro                                  the bug report's run\n"
         "  seqpar-repro --steps 100 --plot drift.svg     100 steps, with the drift picture\n"
         "  seqpar-repro --config ds_config.json          your DeepSpeed config\n"
         "  seqpar-repro --scenario masked-tokens -q      another scenario, no progress\n"
         "  seqpar-repro --set ds_config.sequence_parallel_size=2 --device cpu\n"
         "  seqpar-repro --print-config > mine.toml       a config to edit\n"
         "\n"
         "exit status: 0 the run finished (whatever its verdicts); 1 it failed; 2 the\n"
         "command line, a config or the environment was refused.\n";
}

Options parse_options(const std::vector<std::string>& arguments) {
  Options options;
  parse_command_line(arguments, option_table(options));
  return options;
}

}  // namespace seqpar::repro
