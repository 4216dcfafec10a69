#include "apps/repro/pipeline.h"

#include <map>
#include <memory>

#include "apps/repro/pitfall.h"
#include "apps/repro/report.h"
#include "apps/repro/zero_stage.h"
#include "core/error.h"

namespace seqpar::repro {

const Scenario& scenario_named(const std::string& name) {
  if (name == "zero-stage") return zero_stage_scenario();
  if (name == "ulysses") return ulysses_scenario();
  if (name == "context-parallel") return context_parallel_scenario();
  static const auto kit = [] {  // the pitfall kit's scenarios (pitfall.h), by name
    std::map<std::string, std::unique_ptr<Scenario>> scenarios;
    for (const PitfallScenario* scenario : {&shifted_targets_scenario(), &clipping_norms_scenario(),
                                            &dropout_scenario(), &masked_tokens_scenario()}) {
      scenarios.emplace(scenario->name, kit_scenario(*scenario));
    }
    return scenarios;
  }();
  if (const auto found = kit.find(name); found != kit.end()) return *found->second;
  SEQPAR_CHECK(name == "issue-6868", "no scenario named ", name);  // validate() names them
  return issue6868_scenario();
}

std::map<std::string, std::string> dump_metadata(const ReproConfig& config) {
  return {{"config", to_toml(config)}, {"producer", "seqpar-repro"}};
}

// The flat [weight..., bias...] vector as the two named tensors.
NamedTensors unflatten(const std::vector<float>& flat, const ReproConfig& config,
                       const std::string& prefix) {
  const int64_t weight_count = config.out_features * config.in_features;
  return {{prefix + "weight",
           Tensor::from_data({config.out_features, config.in_features},
                             std::vector<float>(flat.begin(), flat.begin() + weight_count))},
          {prefix + "bias", Tensor::from_data({config.out_features},
                                              std::vector<float>(flat.begin() + weight_count, flat.end()))}};
}

NamedTensors parameters_and_gradients(const std::vector<float>& parameters, const std::vector<float>& gradients,
                                      const ReproConfig& config) {
  NamedTensors tensors = unflatten(parameters, config, "");
  for (auto& named : unflatten(gradients, config, "grad.")) tensors.push_back(std::move(named));
  return tensors;
}

}  // namespace seqpar::repro
