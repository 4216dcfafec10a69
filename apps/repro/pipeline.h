// The one path every scenario of seqpar-repro takes: main checks the configuration
// with the scenario, runs it on every rank, and prints and writes what world rank 0
// gets back. A scenario is one implementation of Scenario: the issue's (issue6868.cpp),
// ulysses' (ulysses.cpp), context-parallel's (context_parallel.cpp), and the pitfall kit's (pitfall.cpp's kit_scenario), of which
// zero-stage is one with a report of its own. A new one is a class and a line in
// scenario_named.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/common/dump_directory.h"
#include "apps/repro/policy.h"
#include "apps/repro/progress.h"
#include "core/device.h"

namespace seqpar::repro {

// What the command line asks of a run beyond its configuration.
struct Request {
  std::string policy = "all";  // --policy: one of issue-6868's policies, or all
  bool dump = false;           // --dump: keep the tensors of the dump
  std::string plot_path;       // --plot: the drift picture ("" for none)
  bool plot_given = false;     // --plot on the command line, not the default
  std::string device;          // --device as given ("" when left to the default)
};

// Where the ranks compute, as the report names it.
struct Placement {
  Device device;
  std::string description;  // "4 ranks as threads of one process on the CPU (...)"
};

struct TextFile {
  std::string path, text;
};

// What a run gives world rank 0; main prints the text and writes the rest.
struct Results {
  std::string text;              // the report
  nlohmann::json json;           // --json's document
  std::vector<DumpFile> dump;    // --dump's files, each made as it is written
  std::string dump_checker;      // the script that checks the dump ("" for none)
  std::vector<TextFile> files;   // other outputs: the drift picture and its series
  std::string files_text;        // the report's lines naming them (or why there are none)
};

class Scenario {
 public:
  virtual ~Scenario() = default;
  // Refuses (InputError) what the scenario cannot run: a value of the configuration, or
  // an option it does not take (--policy, --plot, --dump), by name.
  virtual void check(const ReproConfig& config, const Request& request) const = 0;
  // Runs on every rank with the same arguments; the results on world rank 0, nothing
  // elsewhere. World rank 0 tells `progress`, when given, what it is doing.
  virtual std::optional<Results> run(const RankGroups& groups, const ReproConfig& config,
                                     const Request& request, const Placement& placement,
                                     Progress* progress) const = 0;
};

// The scenario --scenario / repro.scenario names (scenario_list.h lists the names).
const Scenario& scenario_named(const std::string& name);

// The scenarios by file: issue6868.cpp, zero_stage.cpp (a kit_scenario), ulysses.cpp,
// context_parallel.cpp.
const Scenario& issue6868_scenario();
const Scenario& zero_stage_scenario();
const Scenario& ulysses_scenario();
const Scenario& context_parallel_scenario();

// The metadata of every dump file: the configuration as TOML and the producer.
std::map<std::string, std::string> dump_metadata(const ReproConfig& config);

}  // namespace seqpar::repro
