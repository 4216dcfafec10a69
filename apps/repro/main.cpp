// seqpar-repro: reproduces DeepSpeed issue #6868 and its fix. See README.md.
//
// Reading order: policy.h (the three ways to combine gradients), policy_step.cpp
// (where the combining happens), scenario.cpp (what every rank runs), analysis.cpp
// (how each step's figures and the verdicts are derived), then this file (where the ranks run).
#include <malloc.h>

#include <chrono>
#include <iostream>
#include <optional>

#include "apps/repro/analysis.h"
#include "apps/repro/config_input.h"
#include "apps/repro/options.h"
#include "apps/repro/output_paths.h"
#include "apps/repro/pitfall.h"
#include "apps/repro/report.h"
#include "apps/repro/scenario.h"
#include "apps/repro/scenario_list.h"
#include "apps/repro/zero_stage.h"
#include "apps/repro/validate.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/signal_cleanup.h"
#include "dist/environment.h"
#include "dist/launcher.h"
#include "dist/local_process_group.h"
#include "seqpar/version.h"
#ifdef SEQPAR_WITH_NCCL
#include "dist/nccl_process_group.h"
#endif

namespace seqpar::repro {
namespace {

#ifdef SEQPAR_WITH_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif

// Where the ranks run.
enum class Backend { LocalThreads, Nccl, LaunchNccl };
struct Placement {
  Backend backend;
  Device device;
  std::string description;
};

Placement choose_placement(const Options& options, const ReproConfig& config,
                           const std::optional<dist::LaunchEnvironment>& launched) {
  const int64_t world = config.world_size();
  const int gpus = cuda_device_count();
  const std::string ranks = std::to_string(world) + (world == 1 ? " rank" : " ranks");
  if (launched) {
    SEQPAR_INPUT_CHECK(options.backend.value_or("nccl") == "nccl" && options.device.value_or("cuda") == "cuda",
                 "this process was started by a launcher (", launched->launcher,
                 "), which means one process per GPU over NCCL; --backend local and --device cpu "
                 "run all ranks in one process: drop --nproc / the launcher");
    SEQPAR_INPUT_CHECK(launched->world_size == world, "launched with a world of ", launched->world_size,
                 " processes, but the scenario needs sp ", config.sequence_parallel_size, " x dp ",
                 config.data_parallel_size, " = ", world, " ranks");
    return {Backend::Nccl, Device::cuda(launched->local_rank),
            ranks + ", one process per GPU over NCCL (started by " + launched->launcher + ")"};
  }
  const bool nccl_built = kNcclBuilt;
  const bool want_nccl = options.backend == std::string("nccl") ||
                         (!options.backend && !options.device && gpus >= world && nccl_built);
  if (want_nccl) {
    SEQPAR_INPUT_CHECK(nccl_built, "--backend nccl: this seqpar was built without NCCL");
    SEQPAR_INPUT_CHECK(gpus >= world, "--backend nccl needs one GPU per rank: ", world,
                 " ranks, but this machine has ", gpus, " GPU(s); use --backend local");
    return {Backend::LaunchNccl, Device::cuda(0), ranks + ", one process per GPU over NCCL"};
  }
  if (options.device == std::string("reference")) {
    return {Backend::LocalThreads, Device::reference(),
            ranks + " as threads on the CPU, each op the plain reference loops (local group)"};
  }
  const bool on_gpu = options.device ? *options.device == "cuda" : gpus > 0;
  SEQPAR_INPUT_CHECK(!on_gpu || gpus > 0, "--device cuda: this machine has no CUDA device");
  return {Backend::LocalThreads, on_gpu ? Device::cuda(0) : Device::cpu(),
          ranks + " as threads of one process" + (on_gpu ? " sharing cuda:0" : " on the CPU") +
              " (local process group)"};
}

// DeepSpeed's launcher passes --local_rank=N beside LOCAL_RANK; the two must agree.
void check_local_rank(const Options& options,
                      const std::optional<dist::LaunchEnvironment>& launched) {
  if (!options.local_rank) return;
  SEQPAR_INPUT_CHECK(launched.has_value(), "--local_rank ", *options.local_rank,
                     " without a launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK): "
                     "start seqpar-repro with deepspeed, torchrun, mpirun or srun, or drop it");
  SEQPAR_INPUT_CHECK(launched->local_rank == *options.local_rank, "--local_rank ",
                     *options.local_rank, " disagrees with the launcher's local rank ",
                     launched->local_rank, " (", launched->launcher, ")");
}

ReproConfig read_config(const Options& options) {
  if (options.config_path.empty()) return parse_config("", options.overrides, "built-in defaults");
  const std::string text = read_config_file(options.config_path);
  return parse_users_config(text, options.overrides, options.config_path,
                            config_format_for(options.config_path, text));
}

// The drift picture shows how the ranks drift over steps: one step is a point, no picture.
bool writes_plot(const Options& options, const ReproConfig& config) {
  return !options.plot_path.empty() && config.steps > 1 && config.scenario == "issue-6868";
}

// The CSV beside the picture: drift.svg's is drift.csv. A path not ending in .svg (a
// device such as /dev/stdout) gets none.
std::optional<std::string> drift_csv_path(const std::string& plot_path) {
  const std::string svg = ".svg";
  if (plot_path.size() <= svg.size() ||
      plot_path.compare(plot_path.size() - svg.size(), svg.size(), svg) != 0) {
    return std::nullopt;
  }
  return plot_path.substr(0, plot_path.size() - svg.size()) + ".csv";
}

// --policy and --plot belong to issue-6868's report; other scenarios refuse them by name
// rather than ignore them.
void check_output_options(const Options& options, const ReproConfig& config) {
  if (config.scenario == "issue-6868") return;
  SEQPAR_INPUT_CHECK(options.policy == "all", "--policy: scenario ", config.scenario,
                     " runs its own variants, not the policies; leave --policy out");
  SEQPAR_INPUT_CHECK(!options.plot_given || options.plot_path.empty(), "--plot: scenario ",
                     config.scenario, " draws no drift picture; leave --plot out");
}

// Everything the run will need from its surroundings, checked before its work starts:
// the outputs can be written and the scenario fits in memory.
void check_before_running(const Options& options, const ReproConfig& config) {
  check_output_paths(options);
  if (writes_plot(options, config)) {  // the picture's series, beside it
    if (const auto csv = drift_csv_path(options.plot_path)) check_output_path("--plot", *csv);
  }
  if (const auto available = available_memory_bytes()) check_memory(config, *available);
}

std::chrono::milliseconds collective_timeout(const Options& options, const ReproConfig& config) {
  if (!options.timeout_seconds) return default_collective_timeout(config);
  return std::chrono::milliseconds(static_cast<int64_t>(*options.timeout_seconds * 1000));
}

RunResults run_rank(const std::shared_ptr<dist::ProcessGroup>& world, const ReproConfig& config,
                    const std::vector<const Policy*>& policies, const Placement& placement,
                    Device device, Progress* progress) {
  return run_scenario(rank_groups(world, config), config, policies, device,
                      placement.description, progress);
}

// The report, then the files: the dump first, since a failed dump removes itself and
// then nothing else is written. Each file appears whole or not at all. With --json -
// the JSON owns stdout, so the report goes to stderr.
void report(const RunResults& results, const Options& options) {
  std::ostream& out = options.json_path == "-" ? std::cerr : std::cout;
  print_report(out, results);
  out << '\n';
  if (!options.dump_directory.empty()) {
    write_dump(options.dump_directory, results, options.overwrite);
    out << "safetensors dump: " << printable(options.dump_directory)
        << " (check it with scripts/crosscheck.py " << printable(options.dump_directory) << ")\n";
  }
  if (writes_plot(options, results.config)) {
    out.flush();  // the picture may go to /dev/stdout, after the report
    write_drift_svg(options.plot_path, results);
    const auto csv = drift_csv_path(options.plot_path);
    if (csv) write_drift_csv(*csv, results);
    out << "drift picture: " << printable(options.plot_path)
        << (csv ? " (its series: " + printable(*csv) + ")" : "")
        << '\n';
  } else if (options.plot_given && !options.plot_path.empty()) {
    out << "drift picture: none for a single step (--steps 2 or more draws one)\n";
  }
  if (!options.json_path.empty()) {
    out.flush();
    write_json(options.json_path, results);
    if (options.json_path != "-") out << "figures (JSON): " << printable(options.json_path) << '\n';
  }
}

// Runs `body(world, progress)` on every rank where the placement puts them (NCCL
// processes started by a launcher, or threads of this process) and returns world rank
// 0's result (nothing on the other ranks).
template <typename Results, typename Body>
std::optional<Results> run_world(const Placement& placement,
                                 const std::optional<dist::LaunchEnvironment>& launched,
                                 const ReproConfig& config, std::chrono::milliseconds timeout,
                                 bool quiet, const Body& body) {
  if (placement.backend == Backend::Nccl) {
#ifdef SEQPAR_WITH_NCCL
    dist::NcclOptions nccl_options;
    nccl_options.timeout = timeout;
    const auto world = dist::NcclProcessGroup::create_world(*launched, nccl_options);
    Results results;
    {
      const auto progress = world->rank() == 0 ? Progress::on_stderr(quiet) : nullptr;
      results = body(world, progress.get());
    }
    if (world->rank() != 0) return std::nullopt;
    return results;
#else
    (void)launched;
    SEQPAR_FAIL("started by a launcher, but this seqpar was built without NCCL");
#endif
  }
  Results results;
  const auto progress = Progress::on_stderr(quiet);
  dist::run_local_world(static_cast<int>(config.world_size()),
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
                          Results mine = body(world, progress.get());
                          if (world->rank() == 0) results = std::move(mine);
                        },
                        dist::LocalOptions{timeout});
  return results;
}

int run(int argc, char** argv) {
  const std::vector<std::string> arguments(argv + 1, argv + argc);
  const Options options = parse_options(arguments);
  if (options.help) {
    std::cout << help_text();
    return 0;
  }
  if (options.version) {
    std::cout << "seqpar-repro " << kSeqparVersion << '\n';
    return 0;
  }
  const ReproConfig config = read_config(options);
  if (options.print_config) {
    std::cout << to_toml(config);
    // A name from the user's file is escaped: a line break in it would otherwise start
    // a live TOML line, and ESC a terminal sequence.
    for (const ConfigNote& note : config.ignored) {
      std::cout << "# ignored: " << printable(note.key) << " (" << printable(note.reason) << ")\n";
    }
    return 0;
  }
  if (options.list_scenarios) {
    std::cout << scenario_list_text();
    return 0;
  }
  check_output_options(options, config);
  std::vector<const Policy*> policies;
  for (const Policy& policy : all_policies()) {
    if (options.policy == "all" || policy_named(options.policy).name == policy.name) {
      policies.push_back(&policy);
    }
  }
  // --backend local runs every rank in this process, whatever a launcher's variables
  // (an sbatch shell's, say) claim.
  const auto launched = options.backend == std::string("local")
                            ? std::nullopt
                            : dist::launch_environment_from_process();
  check_local_rank(options, launched);
  const Placement placement = choose_placement(options, config, launched);
  if (placement.backend != Backend::LaunchNccl) check_before_running(options, config);
  const std::chrono::milliseconds timeout = collective_timeout(options, config);

  if (placement.backend == Backend::LaunchNccl) {
    dist::LaunchOptions launch;
    launch.nproc = static_cast<int>(config.world_size());
    launch.arguments.assign(argv, argv + argc);
    return dist::launch_ranks(launch);
  }
  if (config.scenario == "zero-stage") {
    SEQPAR_INPUT_CHECK(options.dump_directory.empty(), "--dump: the zero-stage scenario writes no dump");
    check_zero_stage_config(config);
    const auto results = run_world<ZeroStageResults>(
        placement, launched, config, timeout, options.quiet,
        [&](const std::shared_ptr<dist::ProcessGroup>& world, Progress*) {
          return run_zero_stage(rank_groups(world, config), config, placement.device,
                                placement.description);
        });
    if (!results) return 0;
    std::ostream& out = options.json_path == "-" ? std::cerr : std::cout;
    print_zero_stage(out, *results);
    if (!options.json_path.empty()) {
      out.flush();
      write_zero_stage_json(options.json_path, *results);
      if (options.json_path != "-") out << "figures (JSON): " << printable(options.json_path) << '\n';
    }
    return 0;
  }
  if (const PitfallScenario* scenario = pitfall_scenario_named(config.scenario)) {
    scenario->check(config);
    const bool dump = !options.dump_directory.empty();
    const auto results = run_world<PitfallResults>(
        placement, launched, config, timeout, options.quiet,
        [&](const std::shared_ptr<dist::ProcessGroup>& world, Progress* progress) {
          return run_pitfall(*scenario, rank_groups(world, config), config, placement.device,
                             placement.description, dump, progress);
        });
    if (!results) return 0;
    std::ostream& out = options.json_path == "-" ? std::cerr : std::cout;
    print_pitfall(out, *results);
    if (dump) {
      write_dump_files(options.dump_directory, results->dump, config, options.overwrite);
      out << "\nsafetensors dump: " << printable(options.dump_directory) << '\n';
    }
    if (!options.json_path.empty()) {
      out.flush();
      write_pitfall_json(options.json_path, *results);
      if (options.json_path != "-") out << "figures (JSON): " << printable(options.json_path) << '\n';
    }
    return 0;
  }
  const auto results = run_world<RunResults>(
      placement, launched, config, timeout, options.quiet,
      [&](const std::shared_ptr<dist::ProcessGroup>& world, Progress* progress) {
        return run_rank(world, config, policies, placement, placement.device, progress);
      });
  if (results) report(*results, options);
  return 0;
}

}  // namespace
}  // namespace seqpar::repro

int main(int argc, char** argv) {
#ifdef M_MMAP_THRESHOLD
  // glibc raises its mmap threshold to the size of the largest block freed so far (here
  // the data's buffers), after which every step's snapshots and tensors come from the
  // heap and the process keeps growing by kilobytes a step although nothing is kept
  // (scripts/repro-memory.sh). Pinning the threshold at glibc's default value keeps
  // large buffers in their own mappings, returned to the system when freed.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  if (const auto status = seqpar::dist::maybe_launch(argc, argv)) return *status;
  // SIGINT and SIGTERM remove unfinished outputs and exit 130 and 143.
  seqpar::install_signal_cleanup("seqpar-repro");
  try {
    const int status = seqpar::repro::run(argc, argv);
    // A report lost to a full disk or a closed pipe is a failed run.
    std::cout.flush();
    if (!std::cout) {
      std::cerr << "seqpar-repro: cannot write the report to standard output\n";
      return 1;
    }
    return status;
  } catch (const seqpar::InputError& error) {
    // Messages quote what the user gave (paths, keys): escaped, so one line, no ESC.
    std::cerr << "seqpar-repro: " << seqpar::repro::printable(error.what()) << '\n';
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "seqpar-repro: " << seqpar::repro::printable(error.what()) << '\n';
    return 1;
  }
}
