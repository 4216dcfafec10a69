// --dump DIR: everything needed to recompute the run elsewhere (scripts/crosscheck.py
// does it with PyTorch), as safetensors files.
#include <sys/stat.h>

#include <cerrno>

#include "apps/repro/report.h"
#include "core/error.h"
#include "core/safetensors.h"

namespace seqpar::repro {

namespace {

void make_directory(const std::string& path) {
  const int status = ::mkdir(path.c_str(), 0755);
  SEQPAR_CHECK(status == 0 || errno == EEXIST, "cannot create directory ", path);
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

NamedTensors parameters_and_gradients(const std::vector<float>& parameters,
                                      const std::vector<float>& gradients,
                                      const ReproConfig& config) {
  NamedTensors tensors = unflatten(parameters, config, "");
  for (auto& named : unflatten(gradients, config, "grad.")) tensors.push_back(std::move(named));
  return tensors;
}

}  // namespace

void write_dump(const std::string& directory, const RunResults& results) {
  const ReproConfig& config = results.config;
  const std::map<std::string, std::string> metadata = {{"config", to_toml(config)},
                                                       {"producer", "seqpar-repro"}};
  make_directory(directory);
  NamedTensors inputs = unflatten(results.initial_parameters[0], config, "");
  inputs.insert(inputs.begin(), {"x", results.inputs});
  save_safetensors(directory + "/inputs.safetensors", inputs, metadata);
  save_safetensors(directory + "/reference.safetensors",
                   parameters_and_gradients(results.reference.parameters,
                                            results.reference.gradients, config),
                   metadata);
  for (const PolicyRun& run : results.policies) {
    if (!run.figures.skipped.empty()) continue;
    const std::string& name = run.figures.policy->name;
    make_directory(directory + "/" + name);
    const StepRecord& last = run.last;
    for (size_t rank = 0; rank < last.parameters.size(); ++rank) {
      save_safetensors(directory + "/" + name + "/rank" + std::to_string(rank) +
                           ".safetensors",
                       parameters_and_gradients(last.parameters[rank], last.gradients[rank], config),
                       metadata);
    }
  }
}

}  // namespace seqpar::repro
