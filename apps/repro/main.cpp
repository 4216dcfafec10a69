// seqpar-repro: reproduces DeepSpeed issue #6868 and its fix. See README.md.
//
// Reading order: policy.h (the three ways to combine gradients), policy.cpp (where
// the combining happens), scenario.cpp (what every rank runs), analysis.cpp
// (how each step's figures and the verdicts are derived), pipeline.h (what every
// scenario is to this file), then this file (where the ranks run, and the one path of a
// run: check, run, print, write).
#include <malloc.h>

#include <chrono>
#include <iostream>
#include <optional>

#include "apps/repro/config_input.h"
#include "apps/repro/options.h"
#include "apps/repro/output_paths.h"
#include "apps/repro/pipeline.h"
#include "apps/repro/scenario.h"
#include "apps/repro/scenario_list.h"
#include "apps/repro/validate.h"
#include "core/error.h"
#include "apps/common/output_file.h"
#include "apps/common/signal_cleanup.h"
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
struct Where {
  Backend backend;
  Placement placement;
};

Where choose_placement(const Options& options, const ReproConfig& config,
                       const std::optional<dist::LaunchEnvironment>& launched) {
  const int64_t world = config.world_size();
  const int gpus = cuda_device_count();
  const std::string ranks = std::to_string(world) + (world == 1 ? " rank" : " ranks");
  if (launched) {
    const std::string started = "started by a launcher (" + launched->launcher + ": " +
                                launched->variables + " set)";
    SEQPAR_INPUT_CHECK(kNcclBuilt, started, ", but this seqpar was built without NCCL: unset "
                       "them, or run every rank in this process with --backend local");
    SEQPAR_INPUT_CHECK(launched->local_rank < gpus, started, " as local rank ",
                       launched->local_rank, ", one GPU each, but this machine has ", gpus,
                       " GPU(s): unset them, or run every rank in this process with --backend local");
    SEQPAR_INPUT_CHECK(options.backend.value_or("nccl") == "nccl" && options.device.value_or("cuda") == "cuda",
                 "this process was started by a launcher (", launched->launcher,
                 "), which means one process per GPU over NCCL; --backend local and --device cpu "
                 "run all ranks in one process: drop --nproc / the launcher");
    SEQPAR_INPUT_CHECK(launched->world_size == world, "launched with a world of ", launched->world_size,
                 " processes, but the scenario needs sp ", config.sequence_parallel_size, " x dp ",
                 config.data_parallel_size, " = ", world, " ranks");
    return {Backend::Nccl, {Device::cuda(launched->local_rank),
            ranks + ", one process per GPU over NCCL (started by " + launched->launcher + ")"}};
  }
  const bool want_nccl = options.backend == std::string("nccl") ||
                         (!options.backend && !options.device && gpus >= world && kNcclBuilt);
  if (want_nccl) {
    SEQPAR_INPUT_CHECK(kNcclBuilt, "--backend nccl: this seqpar was built without NCCL");
    SEQPAR_INPUT_CHECK(gpus >= world, "--backend nccl needs one GPU per rank: ", world,
                 " ranks, but this machine has ", gpus, " GPU(s); use --backend local");
    return {Backend::LaunchNccl, {Device::cuda(0), ranks + ", one process per GPU over NCCL"}};
  }
  if (options.device == std::string("reference")) {
    return {Backend::LocalThreads, {Device::reference(),
            ranks + " as threads on the CPU, each op the plain reference loops (local group)"}};
  }
  const bool on_gpu = options.device ? *options.device == "cuda" : gpus > 0;
  SEQPAR_INPUT_CHECK(!on_gpu || gpus > 0, "--device cuda: this machine has no CUDA device");
  return {Backend::LocalThreads, {on_gpu ? Device::cuda(0) : Device::cpu(),
          ranks + " as threads of one process" + (on_gpu ? " sharing cuda:0" : " on the CPU") +
              " (local process group)"}};
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
  return parse_users_config(text, options.overrides, abbreviated(options.config_path),
                            config_format_for(options.config_path, text));
}

std::chrono::milliseconds collective_timeout(const Options& options, const ReproConfig& config) {
  if (!options.timeout_seconds) return default_collective_timeout(config);
  return std::chrono::milliseconds(static_cast<int64_t>(*options.timeout_seconds * 1000));
}

// `text` into the file at `path` whole (apps/common/output_file.h), or to standard output for "-".
void write_text_or_stdout(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << std::flush;
    return;
  }
  write_output_file(path, text);
}

// The report, then the files: the dump first, since a failed dump removes itself and
// then nothing else is written. Each file appears whole or not at all. With --json -
// the JSON owns stdout, so the report goes to stderr.
void present(const Results& results, const Options& options, const ReproConfig& config) {
  std::ostream& out = options.json_path == "-" ? std::cerr : std::cout;
  out << results.text;
  const std::string dump = printable(options.dump_directory);
  if (!options.dump_directory.empty()) {
    write_dump_directory(options.dump_directory, options.overwrite, results.dump,
                         dump_metadata(config));
    out << "safetensors dump: " << dump
        << (results.dump_checker.empty() ? "" : " (check it with " + results.dump_checker + " " + dump + ")")
        << '\n';
  }
  out.flush();  // a file may go to /dev/stdout, after the report
  for (const TextFile& file : results.files) write_output_file(file.path, file.text);
  out << results.files_text;
  if (!options.json_path.empty()) {
    out.flush();
    // Text from a user's config is not always UTF-8: replaced, never a failed write.
    write_text_or_stdout(options.json_path,
                         results.json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (options.json_path != "-") out << "figures (JSON): " << printable(options.json_path) << '\n';
  }
}

// Runs `body(world, progress)` on every rank where the placement puts them (NCCL
// processes started by a launcher, or threads of this process) and returns world rank
// 0's result (nothing on the other ranks).
template <typename Body>
std::optional<Results> run_world(Backend backend,
                                 const std::optional<dist::LaunchEnvironment>& launched,
                                 const ReproConfig& config, std::chrono::milliseconds timeout,
                                 bool quiet, const Body& body) {
  if (backend == Backend::Nccl) {
#ifdef SEQPAR_WITH_NCCL
    dist::NcclOptions nccl_options;
    nccl_options.timeout = timeout;
    const auto world = dist::NcclProcessGroup::create_world(*launched, nccl_options);
    const auto progress = world->rank() == 0 ? Progress::on_stderr(quiet) : nullptr;
    return body(world, progress.get());
#else
    (void)launched;
    SEQPAR_FAIL("unreachable: choose_placement refuses a launch without NCCL");
#endif
  }
  std::optional<Results> results;
  const auto progress = Progress::on_stderr(quiet);
  dist::run_local_world(static_cast<int>(config.world_size()),
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
                          std::optional<Results> mine = body(world, progress.get());
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
    // The keys a config may set, those left out above included (DeepSpeed's other keys
    // are accepted as ignored, or refused, by name).
    std::cout << "# every key seqpar-repro reads:\n";
    for (const std::string& key : config_keys()) std::cout << "#   " << key << '\n';
    return 0;
  }
  if (options.list_scenarios) {
    std::cout << scenario_list_text();
    return 0;
  }
  const Scenario& scenario = scenario_named(config.scenario);
  const Request request{options.policy, !options.dump_directory.empty(), options.plot_path,
                        options.plot_given, options.device.value_or("")};
  scenario.check(config, request);
  // --backend local runs every rank in this process, whatever a launcher's variables
  // (an sbatch shell's, say) claim.
  const auto launched = options.backend == std::string("local")
                            ? std::nullopt
                            : dist::launch_environment_from_process();
  if (!launched && options.backend != std::string("local")) {
    const std::string ignored = dist::ignored_launch_variables_from_process();
    if (!ignored.empty()) {
      std::cerr << "seqpar-repro: note: " << abbreviated(ignored)
                << " set, but not a launcher's whole set (its rank, world size and local rank, "
                   "and MASTER_ADDR and MASTER_PORT or NCCL_COMM_ID): ignored, the ranks run here\n";
    }
  }
  check_local_rank(options, launched);
  const Where where = choose_placement(options, config, launched);
  if (where.backend == Backend::LaunchNccl) {
    dist::LaunchOptions launch;
    launch.nproc = static_cast<int>(config.world_size());
    launch.arguments.assign(argv, argv + argc);
    return dist::launch_ranks(launch);
  }
  // Everything the run needs from its surroundings, checked before its work starts: the
  // outputs can be written and the scenario fits in memory.
  check_output_paths(options);
  if (const auto available = available_memory_bytes()) check_memory(config, *available);
  const auto results = run_world(
      where.backend, launched, config, collective_timeout(options, config), options.quiet,
      [&](const std::shared_ptr<dist::ProcessGroup>& world, Progress* progress) {
        return scenario.run(rank_groups(world, config), config, request, where.placement, progress);
      });
  if (results) present(*results, options, config);
  return 0;
}

}  // namespace
}  // namespace seqpar::repro

int main(int argc, char** argv) {
#ifdef M_MMAP_MAX
  // Every block from the heap, none in a mapping of its own. A step allocates the same
  // large blocks every step (activations, gradients, the exact sums' digits); a block in
  // its own mapping goes back to the kernel when freed, and the next step faults every
  // page of it in again: on a 2-core VM that was half the ulysses scenario's time. The
  // heap keeps freed blocks for reuse; glibc's default instead raises its mmap
  // threshold as blocks are freed and lets the process grow by kilobytes a step.
  // scripts/repro-memory.sh checks that memory does not grow with the steps.
  mallopt(M_MMAP_MAX, 0);
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
    std::cerr << "seqpar-repro: " << seqpar::printable(error.what()) << '\n';
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "seqpar-repro: " << seqpar::printable(error.what()) << '\n';
    return 1;
  }
}
