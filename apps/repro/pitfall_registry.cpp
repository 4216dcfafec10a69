// The scenarios the pitfall kit runs (apps/repro/scenario_list.cpp lists every
// scenario's name and summary).
#include "apps/repro/clipping_norms.h"
#include "apps/repro/dropout_scenario.h"
#include "apps/repro/masked_tokens.h"
#include "apps/repro/pitfall.h"
#include "apps/repro/shifted_targets.h"

namespace seqpar::repro {

const PitfallScenario* pitfall_scenario_named(const std::string& name) {
  for (const PitfallScenario* scenario : {&shifted_targets_scenario(), &clipping_norms_scenario(),
                                          &dropout_scenario(), &masked_tokens_scenario()}) {
    if (scenario->name == name) return scenario;
  }
  return nullptr;
}

}  // namespace seqpar::repro
