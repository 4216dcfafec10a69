// --dump DIR: everything needed to recompute the run elsewhere (scripts/crosscheck.py
// does it with PyTorch), as safetensors files.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "apps/repro/report.h"
#include "core/error.h"
#include "core/output_file.h"
#include "core/safetensors.h"

namespace seqpar::repro {

namespace {

// Creates `path` if it is not there; remembers it when it did, so a failed dump can
// take it away again.
void make_directory(const std::string& path, std::vector<std::string>& created) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    created.push_back(path);
    return;
  }
  const int error = errno;
  struct stat status {};
  if (error == EEXIST && ::stat(path.c_str(), &status) == 0 && S_ISDIR(status.st_mode)) return;
  throw Error(detail::concat("--dump: cannot create directory ", path, ": ",
                             std::strerror(error == EEXIST ? ENOTDIR : error)));
}

std::vector<std::string> entries_of(const std::string& directory) {
  std::vector<std::string> names;
  if (DIR* listing = ::opendir(directory.c_str())) {
    while (const dirent* entry = ::readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(listing);
  }
  return names;
}

// The files a dump of this run writes, in the order they are written.
std::vector<std::string> dump_files(const std::string& directory, const RunResults& results) {
  std::vector<std::string> files = {directory + "/inputs.safetensors",
                                    directory + "/reference.safetensors"};
  for (const PolicyRun& run : results.policies) {
    if (!run.figures.skipped.empty()) continue;
    for (size_t rank = 0; rank < run.last.parameters.size(); ++rank) {
      files.push_back(directory + "/" + run.figures.policy->name + "/rank" +
                      std::to_string(rank) + ".safetensors");
    }
  }
  return files;
}

// An older dump's files of any policy, which would otherwise sit beside this run's.
void remove_earlier_dump(const std::string& directory) {
  for (const char* file : {"inputs.safetensors", "reference.safetensors"}) {
    ::unlink((directory + "/" + file).c_str());
  }
  for (const Policy& policy : all_policies()) {
    const std::string folder = directory + "/" + policy.name;
    for (const std::string& name : entries_of(folder)) {
      if (name.rfind("rank", 0) == 0) ::unlink((folder + "/" + name).c_str());
    }
  }
}

}  // namespace

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

}  // namespace

void check_dump_directory(const std::string& directory, bool overwrite) {
  SEQPAR_INPUT_CHECK(!directory.empty(), "--dump: the directory name is empty");
  struct stat status {};
  if (::stat(directory.c_str(), &status) != 0) {
    check_output_path("--dump", directory);  // its parent must exist and be writable
    return;
  }
  SEQPAR_INPUT_CHECK(S_ISDIR(status.st_mode), "--dump ", directory,
                     ": exists and is not a directory");
  SEQPAR_INPUT_CHECK(overwrite || entries_of(directory).empty(), "--dump ", directory,
                     ": the directory is not empty (an earlier dump?); give --overwrite to "
                     "replace its dump, or name a new directory");
}

void write_dump(const std::string& directory, const RunResults& results, bool overwrite) {
  check_dump_directory(directory, overwrite);
  const ReproConfig& config = results.config;
  const std::map<std::string, std::string> metadata = {{"config", to_toml(config)},
                                                       {"producer", "seqpar-repro"}};
  std::vector<std::string> created;
  const std::vector<std::string> files = dump_files(directory, results);
  try {
    make_directory(directory, created);
    if (overwrite) remove_earlier_dump(directory);
    NamedTensors inputs = unflatten(results.initial_parameters[0], config, "");
    inputs.insert(inputs.begin(), {"x", results.inputs});
    // Each file is read back before it is renamed into place (core/output_file.h).
    save_safetensors(files[0], inputs, metadata, true);
    save_safetensors(files[1],
                     parameters_and_gradients(results.reference.parameters,
                                              results.reference.gradients, config),
                     metadata, true);
    size_t next = 2;
    for (const PolicyRun& run : results.policies) {
      if (!run.figures.skipped.empty()) continue;
      make_directory(directory + "/" + run.figures.policy->name, created);
      const StepRecord& last = run.last;
      for (size_t rank = 0; rank < last.parameters.size(); ++rank) {
        save_safetensors(files[next++],
                         parameters_and_gradients(last.parameters[rank], last.gradients[rank], config),
                         metadata, true);
      }
    }
  } catch (...) {
    // Half a dump would be read as a whole one: take away what this run wrote.
    for (const std::string& file : files) ::unlink(file.c_str());
    for (auto folder = created.rbegin(); folder != created.rend(); ++folder) ::rmdir(folder->c_str());
    throw;
  }
}

void write_dump_files(const std::string& directory,
                      const std::vector<std::pair<std::string, NamedTensors>>& files,
                      const ReproConfig& config, bool overwrite) {
  check_dump_directory(directory, overwrite);
  const std::map<std::string, std::string> metadata = {{"config", to_toml(config)},
                                                       {"producer", "seqpar-repro"}};
  std::vector<std::string> created, written;
  try {
    make_directory(directory, created);
    if (overwrite) {
      for (const std::string& name : entries_of(directory)) {
        const std::string suffix = ".safetensors";
        if (name.size() > suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
          ::unlink((directory + "/" + name).c_str());
        }
      }
    }
    for (const auto& [name, tensors] : files) {
      written.push_back(directory + "/" + name);
      save_safetensors(written.back(), tensors, metadata, true);
    }
  } catch (...) {
    for (const std::string& file : written) ::unlink(file.c_str());
    for (auto folder = created.rbegin(); folder != created.rend(); ++folder) ::rmdir(folder->c_str());
    throw;
  }
}

}  // namespace seqpar::repro
