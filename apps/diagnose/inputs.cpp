#include "apps/diagnose/inputs.h"

#include <glob.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace seqpar::diagnose {

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> expand(const std::string& option, const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files(matches.gl_pathv, matches.gl_pathv + (status == 0 ? matches.gl_pathc : 0));
  ::globfree(&matches);
  SEQPAR_INPUT_CHECK(!files.empty(), option, " '", pattern, "': matches no file");
  return files;
}

// The last number in the file's name: model_rank12.safetensors -> 12; -1 when none.
long rank_in_name(const std::string& path) {
  const std::string name = path.substr(path.find_last_of('/') + 1);
  size_t end = name.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  if (begin == end || end - begin > 6) return -1;
  return std::stol(name.substr(begin, end - begin));
}

// Where a tensor of a rank's file goes. `grads_file`: names without a known prefix are
// gradients; `optimizer_file`: only the moments are allowed.
void sort_into(RankState& state, StoredTensor tensor, const std::string& path, bool grads_file,
               bool optimizer_file) {
  const std::string name = tensor.name;
  std::vector<StoredTensor>* target = nullptr;
  if (starts_with(name, "exp_avg_sq.")) target = &state.exp_avg_sq.tensors;
  else if (starts_with(name, "exp_avg.")) target = &state.exp_avg.tensors;
  else if (starts_with(name, "local_grad.")) target = &state.local_gradients.tensors;
  else if (starts_with(name, "grad.")) target = &state.gradients.tensors;
  SEQPAR_INPUT_CHECK(target || !optimizer_file, path, ": tensor '", name,
                     "' is not named exp_avg.NAME or exp_avg_sq.NAME (an --optimizer file)");
  if (!target && name == "clip_norm") {
    SEQPAR_INPUT_CHECK(tensor.values.size() == 1, path, ": clip_norm has shape ",
                       shape_text(tensor.shape), "; it is the one norm clipping used");
    SEQPAR_INPUT_CHECK(!state.clip_norm, path, ": a second clip_norm for this rank");
    state.clip_norm = tensor.values[0];
    return;
  }
  if (!target && grads_file) tensor.name = "grad." + name;
  if (!target) target = grads_file ? &state.gradients.tensors : &state.parameters.tensors;
  for (const std::vector<StoredTensor>* set :
       {&state.parameters.tensors, &state.gradients.tensors, &state.local_gradients.tensors,
        &state.exp_avg.tensors, &state.exp_avg_sq.tensors}) {
    for (const StoredTensor& held : *set) {
      SEQPAR_INPUT_CHECK(held.name != tensor.name, path, ": tensor '", tensor.name,
                         "' is also in another of this rank's files");
    }
  }
  target->push_back(std::move(tensor));
}

void read_into(RankState& state, const std::string& path, bool grads_file, bool optimizer_file) {
  StoredFile file = read_safetensors(path);
  if (state.files.empty()) state.metadata = file.metadata;
  state.files.push_back(path);
  for (StoredTensor& tensor : file.tensors) sort_into(state, std::move(tensor), path, grads_file, optimizer_file);
}

// `set` of `who` holds exactly `prefix`P for every parameter P of rank 0, with its
// shape and dtype (`what` names the kind in errors).
void check_complete(const TensorSet& set, const TensorSet& parameters, const std::string& prefix,
                    const std::string& who, const std::string& what) {
  for (const StoredTensor& parameter : parameters.tensors) {
    const StoredTensor* found = set.find(prefix + parameter.name);
    if (prefix.empty()) {
      SEQPAR_INPUT_CHECK(found, who, ": no ", what, " '", parameter.name, "', which rank 0 has");
    }
    SEQPAR_INPUT_CHECK(found, who, ": no ", what, " '", prefix + parameter.name, "' for parameter '",
                       parameter.name, "'");
    SEQPAR_INPUT_CHECK(found->shape == parameter.shape, who, ": '", found->name, "' has shape ",
                       shape_text(found->shape), ", rank 0's parameter '", parameter.name, "' ",
                       shape_text(parameter.shape));
    SEQPAR_INPUT_CHECK(found->dtype == parameter.dtype, who, ": '", found->name, "' is ", found->dtype,
                       ", rank 0's parameter '", parameter.name, "' ", parameter.dtype);
  }
  SEQPAR_INPUT_CHECK(set.tensors.size() == parameters.tensors.size(), who, ": ", what, " '",
                     [&] {
                       for (const StoredTensor& t : set.tensors) {
                         if (!parameters.find(t.name.substr(prefix.size()))) return t.name;
                       }
                       return std::string("?");
                     }(),
                     "' names no parameter of rank 0");
}

// Every rank holds the same kinds of tensors as rank 0, under the same names and shapes.
void check_ranks_alike(const RunFiles& run) {
  const RankState& first = run.ranks[0];
  SEQPAR_INPUT_CHECK(!first.parameters.empty(), first.files[0], ": no parameters (only ",
                     first.gradients.empty() ? "optimizer state" : "gradients", ")");
  for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
    const RankState& state = run.ranks[rank];
    const std::string who = "rank " + std::to_string(rank) + " (" + state.files[0] + ")";
    if (rank > 0) check_complete(state.parameters, first.parameters, "", who, "parameter");
    const struct {
      const TensorSet& set;
      const TensorSet& first_set;
      const char *prefix, *what;
    } kinds[] = {{state.gradients, first.gradients, "grad.", "gradient"},
                 {state.local_gradients, first.local_gradients, "local_grad.", "local gradient"},
                 {state.exp_avg, first.exp_avg, "exp_avg.", "first moment"},
                 {state.exp_avg_sq, first.exp_avg_sq, "exp_avg_sq.", "second moment"}};
    for (const auto& kind : kinds) {
      SEQPAR_INPUT_CHECK(kind.set.empty() == kind.first_set.empty(), who, ": ",
                         kind.set.empty() ? "has no " : "has ", kind.what, "s, rank 0 ",
                         kind.set.empty() ? "has" : "has none");
      if (!kind.set.empty()) check_complete(kind.set, first.parameters, kind.prefix, who, kind.what);
    }
    SEQPAR_INPUT_CHECK(state.clip_norm.has_value() == first.clip_norm.has_value(), who, ": ",
                       state.clip_norm ? "has a clip_norm, rank 0 has none" : "has no clip_norm, rank 0 has one");
  }
}

}  // namespace

const StoredTensor* TensorSet::find(const std::string& name) const {
  for (const StoredTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::vector<float> TensorSet::flat(const std::vector<std::string>& names) const {
  std::vector<float> values;
  for (const std::string& name : names) {
    const StoredTensor* tensor = find(name);
    SEQPAR_CHECK(tensor, "no tensor '", name, "'");
    values.insert(values.end(), tensor->values.begin(), tensor->values.end());
  }
  return values;
}

std::vector<std::string> files_by_rank(const std::string& option, const std::vector<std::string>& patterns) {
  std::vector<std::string> expanded;
  for (const std::string& pattern : patterns) {
    for (std::string& file : expand(option, pattern)) expanded.push_back(std::move(file));
  }
  if (expanded.size() == 1) return expanded;  // one rank's file: rank 0, whatever its name
  std::map<long, std::string> by_rank;
  {
    for (const std::string& file : expanded) {
      const long rank = rank_in_name(file);
      SEQPAR_INPUT_CHECK(rank >= 0, option, " ", file,
                         ": no rank number in the file's name (name them like model_rank0.safetensors)");
      const auto [where, added] = by_rank.emplace(rank, file);
      SEQPAR_INPUT_CHECK(added || where->second == file, option, ": two files for rank ", rank, ": ",
                         where->second, " and ", file);
    }
  }
  std::vector<std::string> files;
  for (const auto& [rank, file] : by_rank) {
    if (rank != long(files.size())) {
      std::string found;
      for (const auto& entry : by_rank) found += (found.empty() ? "" : ", ") + std::to_string(entry.first);
      SEQPAR_INPUT_FAIL(option, ": rank ", files.size(), " is missing (files for ranks ", found, ")");
    }
    files.push_back(file);
  }
  return files;
}

RunFiles read_run_files(const FileLists& lists) {
  SEQPAR_INPUT_CHECK(!lists.ranks.empty(), "--ranks: name every rank's file (--ranks 'model_rank*.safetensors')");
  RunFiles run;
  const std::vector<std::string> rank_files = files_by_rank("--ranks", lists.ranks);
  run.ranks.resize(rank_files.size());
  for (size_t rank = 0; rank < rank_files.size(); ++rank) read_into(run.ranks[rank], rank_files[rank], false, false);
  const auto add_files = [&](const char* option, const std::vector<std::string>& patterns, bool grads) {
    if (patterns.empty()) return;
    const std::vector<std::string> files = files_by_rank(option, patterns);
    SEQPAR_INPUT_CHECK(files.size() == rank_files.size(), option, ": files for ", files.size(),
                       " ranks, but --ranks has ", rank_files.size());
    for (size_t rank = 0; rank < files.size(); ++rank) read_into(run.ranks[rank], files[rank], grads, !grads);
  };
  add_files("--grads", lists.grads, true);
  add_files("--optimizer", lists.optimizer, false);
  check_ranks_alike(run);
  for (const StoredTensor& tensor : run.ranks[0].parameters.tensors) run.parameter_names.push_back(tensor.name);

  const TensorSet& parameters = run.ranks[0].parameters;
  if (!lists.reference.empty()) {
    RankState reference;
    for (const std::string& file : lists.reference) read_into(reference, file, false, false);
    const std::string who = "--reference " + lists.reference[0];
    check_complete(reference.parameters, parameters, "", who, "parameter");
    if (!reference.gradients.empty()) check_complete(reference.gradients, parameters, "grad.", who, "gradient");
    run.reference = std::move(reference);
  }
  if (!lists.initial.empty()) {
    StoredFile file = read_safetensors(lists.initial);
    TensorSet initial;
    for (StoredTensor& tensor : file.tensors) {
      if (parameters.find(tensor.name)) initial.tensors.push_back(std::move(tensor));
      else run.set_aside.push_back(tensor.name + " (" + lists.initial + ")");
    }
    check_complete(initial, parameters, "", "--initial " + lists.initial, "parameter");
    run.initial = std::move(initial);
  }
  return run;
}

}  // namespace seqpar::diagnose
