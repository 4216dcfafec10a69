// --dump DIR: everything needed to recompute the run elsewhere (scripts/crosscheck.py
// does it with PyTorch), as safetensors files, written as apps/repro/dump_directory.h
// says (a manifest, a staging folder, no link followed).
#include "apps/repro/dump_directory.h"
#include "apps/repro/report.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/safetensors.h"

namespace seqpar::repro {

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

namespace {

std::map<std::string, std::string> dump_metadata(const ReproConfig& config) {
  return {{"config", to_toml(config)}, {"producer", "seqpar-repro"}};
}

}  // namespace

// Each file's tensors are made as it is written, so the dump is never held whole.
void write_dump(const std::string& directory, const RunResults& results, bool overwrite) {
  const ReproConfig& config = results.config;
  std::vector<DumpFile> files;
  files.push_back({"inputs.safetensors", [&] {
                     NamedTensors inputs = unflatten(results.initial_parameters[0], config, "");
                     inputs.insert(inputs.begin(), {"x", results.inputs});
                     return inputs;
                   }});
  files.push_back({"reference.safetensors", [&] {
                     return parameters_and_gradients(results.reference.parameters,
                                                     results.reference.gradients, config);
                   }});
  for (const PolicyRun& run : results.policies) {
    if (!run.figures.skipped.empty()) continue;
    const StepRecord& last = run.last;
    for (size_t rank = 0; rank < last.parameters.size(); ++rank) {
      files.push_back({run.figures.policy->name + "/rank" + std::to_string(rank) + ".safetensors",
                       [&last, &config, rank] {
                         return parameters_and_gradients(last.parameters[rank],
                                                         last.gradients[rank], config);
                       }});
    }
  }
  write_dump_directory(directory, overwrite, files, dump_metadata(config));
}

void write_dump_files(const std::string& directory,
                      const std::vector<std::pair<std::string, NamedTensors>>& named_files,
                      const ReproConfig& config, bool overwrite) {
  std::vector<DumpFile> files;
  for (const auto& [name, tensors] : named_files) {
    files.push_back({name, [&tensors = tensors] { return tensors; }});
  }
  write_dump_directory(directory, overwrite, files, dump_metadata(config));
}

}  // namespace seqpar::repro
