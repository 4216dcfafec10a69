#include "apps/repro/options.h"

#include <stdexcept>

#include "apps/repro/config_input.h"
#include "core/error.h"

namespace seqpar::repro {

const char* const kUsage =
    "usage: seqpar-repro [--config FILE] [--set section.key=value]... [--policy NAME|all]\n"
    "                    [--steps N] [--device cpu|cuda] [--backend local|nccl] [--nproc N]\n"
    "                    [--dump DIR [--overwrite]] [--json FILE] [--plot FILE]\n"
    "                    [--timeout SECONDS] [--print-config]\n"
    "\n"
    "Reproduces DeepSpeed issue #6868 (sequence-parallel ranks end a training step with\n"
    "different parameters) and its fix. With no arguments: the report's scenario, 4 ranks,\n"
    "sp 4, on the best place available (GPUs over NCCL, one GPU, or CPU threads).\n"
    "Policies: deepspeed-0.16, with-mpu, exact. See apps/repro/README.md.\n";

namespace {

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

}  // namespace

Options parse_options(const std::vector<std::string>& arguments) {
  Options options;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& flag = arguments[i];
    auto value = [&]() -> const std::string& {
      SEQPAR_INPUT_CHECK(i + 1 < arguments.size(), "option ", flag, " needs a value (see --help)");
      return arguments[++i];
    };
    if (flag == "--help" || flag == "-h") {
      options.help = true;
    } else if (flag == "--config") {
      options.config_path = value();
    } else if (flag == "--set") {
      options.overrides.push_back(value());
    } else if (flag == "--policy") {
      options.policy = value();
    } else if (flag == "--steps") {
      const std::string& steps = value();
      SEQPAR_INPUT_CHECK(!steps.empty() && steps.size() <= 18 &&
                             steps.find_first_not_of("0123456789") == std::string::npos,
                         "--steps ", printable(steps), ": expected a whole number of steps");
      options.overrides.push_back("repro.steps=" + steps);
    } else if (flag == "--device") {
      options.device = value();
      SEQPAR_INPUT_CHECK(*options.device == "cpu" || *options.device == "cuda", "--device ",
                   *options.device, ": expected cpu or cuda");
    } else if (flag == "--backend") {
      options.backend = value();
      SEQPAR_INPUT_CHECK(*options.backend == "local" || *options.backend == "nccl", "--backend ",
                   *options.backend, ": expected local or nccl");
    } else if (flag == "--dump") {
      options.dump_directory = value();
    } else if (flag == "--json") {
      options.json_path = value();
    } else if (flag == "--plot") {
      options.plot_path = value();
    } else if (flag == "--overwrite") {
      options.overwrite = true;
    } else if (flag == "--timeout") {
      options.timeout_seconds = parse_timeout(value());
    } else if (flag == "--print-config") {
      options.print_config = true;
    } else {
      SEQPAR_INPUT_FAIL("unknown option '", printable(flag), "' (see --help)");
    }
  }
  return options;
}

}  // namespace seqpar::repro
