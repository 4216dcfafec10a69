// seqpar-repro's command line (docs/repro.md lists every option).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace seqpar::repro {

struct Options {
  std::string config_path;             // empty: the built-in scenario
  std::vector<std::string> overrides;  // --set section.key=value, in order
  std::string policy = "all";
  bool list_scenarios = false;
  std::optional<std::string> device;   // "cpu" | "cuda"
  std::optional<std::string> backend;  // "local" | "nccl"
  std::string dump_directory;
  std::string json_path;               // "-": stdout (the report then goes to stderr)
  std::string plot_path = "seqpar-repro-drift.svg";
  bool plot_given = false;              // --plot on the command line (else the default)
  bool quiet = false;                   // -q: no progress on stderr
  bool overwrite = false;               // --overwrite: --dump may replace an earlier dump
  std::optional<double> timeout_seconds;  // --timeout: a collective's longest wait
  bool print_config = false;
  bool help = false;
  bool version = false;
  std::optional<int> local_rank;       // --local_rank, as DeepSpeed's launcher passes it
  bool deepspeed = false;              // --deepspeed, as DeepSpeed's launcher passes it
};

// Errors (seqpar::InputError) name the offending argument. (--nproc is taken by the
// launcher before this.)
Options parse_options(const std::vector<std::string>& arguments);

// What --help prints: the usage, every option with its default, and examples.
std::string help_text();

constexpr double kMaxTimeoutSeconds = 7 * 24 * 3600;

}  // namespace seqpar::repro
