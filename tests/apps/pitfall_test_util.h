// What the pitfall scenarios' tests share: a scenario run on CPU threads (or threads
// sharing one GPU), a small configuration, the figures by variant name.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "apps/repro/pitfall.h"
#include "dist/local_process_group.h"

namespace seqpar::test {

// The scenario on config.world_size() threads; world rank 0's figures.
inline repro::PitfallResults run_pitfall_on_threads(const repro::PitfallScenario& scenario,
                                                    const repro::ReproConfig& config,
                                                    Device device = Device::cpu(), bool dump = false) {
  repro::PitfallResults results;
  dist::run_local_world(static_cast<int>(config.world_size()),
                        [&](std::shared_ptr<dist::ProcessGroup> world) {
    repro::PitfallResults mine = repro::run_pitfall(scenario, repro::rank_groups(world, config), config,
                                                    device, "test", dump);
    if (world->rank() == 0) results = std::move(mine);
  });
  return results;
}

// Linear(24, 4) over `rows` rows a replica (not a multiple of sp: shards of different
// sizes), 3 steps, seed 777.
inline repro::ReproConfig small_pitfall_config(const std::string& scenario, int64_t sp, int64_t dp,
                                               int64_t rows) {
  repro::ReproConfig config;
  config.scenario = scenario;
  config.rows = rows;
  config.in_features = 24;
  config.out_features = 4;
  config.sequence_parallel_size = sp;
  config.data_parallel_size = dp;
  config.steps = 3;
  config.seed = 777;
  return config;
}

inline std::map<std::string, repro::VariantFigures> by_name(const repro::PitfallResults& results) {
  std::map<std::string, repro::VariantFigures> named;
  for (const repro::VariantFigures& f : results.variants) named[f.name] = f;
  return named;
}

}  // namespace seqpar::test
