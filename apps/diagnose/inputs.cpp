#include "apps/diagnose/inputs.h"

#include <glob.h>

#include <algorithm>
#include <cctype>

#include "apps/common/text.h"
#include "apps/diagnose/attention_evidence.h"
#include "core/error.h"

namespace seqpar::diagnose {

namespace {

int64_t comparisons = 0;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::vector<std::string> expand(const std::string& option, const std::string& pattern) {
  SEQPAR_INPUT_CHECK(!pattern.empty(), option, ": an empty file name");
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t matches{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files(matches.gl_pathv, matches.gl_pathv + (status == 0 ? matches.gl_pathc : 0));
  ::globfree(&matches);
  SEQPAR_INPUT_CHECK(!files.empty(), option, " '", pattern, "': matches no file");
  return files;
}

// The number right after "rank" (and any of _ - .) in `name`, its last such; -1 when none.
long number_after_rank(const std::string& name) {
  long found = -1;
  for (size_t at = 0; at + 4 <= name.size(); ++at) {
    std::string word = name.substr(at, 4);
    for (char& c : word) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (word != "rank") continue;
    size_t begin = at + 4;
    while (begin < name.size() && (name[begin] == '_' || name[begin] == '-' || name[begin] == '.')) ++begin;
    size_t end = begin;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > begin && end - begin <= 6) found = std::stol(name.substr(begin, end - begin));
  }
  return found;
}

// The last number in `name`: model_12.safetensors -> 12; -1 when none.
long last_number(const std::string& name) {
  size_t end = name.size();
  while (end > 0 && !std::isdigit(static_cast<unsigned char>(name[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  if (begin == end || end - begin > 6) return -1;
  return std::stol(name.substr(begin, end - begin));
}

// The optimizer's step count, in any of the ways a flattened state names it.
bool is_step_count(const std::string& name) {
  const std::string tail = ".step";
  return name == "step" || starts_with(name, "step.") ||
         (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0);
}

// Where a tensor of a rank's file goes. `grads_file`: names without a known prefix are
// gradients; `optimizer_file`: only the moments are allowed.
void sort_into(RankState& state, StoredTensor tensor, const std::string& path, bool grads_file,
               bool optimizer_file) {
  const std::string name = tensor.name;
  TensorSet* target = nullptr;
  if (starts_with(name, "exp_avg_sq.")) target = &state.exp_avg_sq;
  else if (starts_with(name, "exp_avg.")) target = &state.exp_avg;
  else if (starts_with(name, "local_grad.")) target = &state.local_gradients;
  else if (starts_with(name, "grad.")) target = &state.gradients;
  else if (is_activation_name(name)) target = &state.activations;
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
  if (!target) target = grads_file ? &state.gradients : &state.parameters;
  // The file and the name as stored, of each tensor so far: a second copy is named.
  const auto [held, added] = state.origin.emplace(tensor.name, path + '\0' + name);
  if (!added) {
    const size_t cut = held->second.find('\0');
    const std::string held_file = held->second.substr(0, cut), held_name = held->second.substr(cut + 1);
    SEQPAR_INPUT_CHECK(held_file != path, path, ": holds both '", held_name, "' and '", name,
                       "', one gradient twice (a --grads file may leave out 'grad.'): keep one");
    SEQPAR_INPUT_FAIL("tensor '", tensor.name, "' is in both ", held_file, " and ", path, " (one rank's files)");
  }
  target->add(std::move(tensor));
}

void read_into(RankState& state, const std::string& path, bool grads_file, bool optimizer_file,
               std::vector<std::string>& skipped) {
  StoredFile file = read_safetensors(path, is_step_count);
  for (const std::string& name : file.skipped) skipped.push_back(name + " (" + path + ")");
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
    // A mixed-precision run keeps float32 master parameters beside bf16 or fp16
    // gradients; every dtype is widened to float32 alike, so only the parameters must match.
    SEQPAR_INPUT_CHECK(!prefix.empty() || found->dtype == parameter.dtype, who, ": '", found->name, "' is ",
                       found->dtype, ", rank 0's parameter '", parameter.name, "' ", parameter.dtype);
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
  SEQPAR_INPUT_CHECK(!first.origin.empty() || first.clip_norm, first.files[0], ": holds no tensors",
                     run.skipped.empty() ? "" : " (only the optimizer's step count)");
  SEQPAR_INPUT_CHECK(!first.parameters.empty() || first.activations.find(kAttentionOutput), first.files[0],
                     ": no parameters (only ",
                     first.gradients.empty() ? "optimizer state" : "gradients",
                     "): give the parameters' file with --ranks, the others with --grads or --optimizer");
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

int64_t name_comparisons() { return comparisons; }

bool CountedNameEqual::operator()(const std::string& a, const std::string& b) const {
  ++comparisons;
  return a == b;
}

void TensorSet::add(StoredTensor tensor) {
  const auto [where, added] = index.emplace(tensor.name, tensors.size());
  SEQPAR_CHECK(added, "tensor '", abbreviated(tensor.name), "' added twice");
  tensors.push_back(std::move(tensor));
}

const StoredTensor* TensorSet::find(const std::string& name) const {
  const auto found = index.find(name);
  return found == index.end() ? nullptr : &tensors[found->second];
}

long rank_in_path(const std::string& path) {
  std::vector<std::string> parts;
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find('/', start), path.size());
    if (end > start) parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  if (parts.empty()) return -1;
  for (size_t i = parts.size(); i-- > 0;) {
    const long rank = number_after_rank(parts[i]);
    if (rank >= 0) return rank;
  }
  return last_number(parts.back());
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

std::vector<std::string> files_by_rank(const std::string& option, const std::vector<std::string>& patterns,
                                       std::vector<std::string>* notes) {
  std::vector<std::string> expanded;
  for (const std::string& pattern : patterns) {
    for (std::string& file : expand(option, pattern)) expanded.push_back(std::move(file));
  }
  if (expanded.size() == 1) {  // one rank's file: the only rank, whatever its name
    const long rank = rank_in_path(expanded[0]);
    if (rank > 0 && notes) {
      notes->push_back(option + " " + expanded[0] + " is the only file, and its name says rank " +
                       std::to_string(rank) + ": ranks 0 to " + std::to_string(rank - 1) +
                       " were not given (a glob that matched too little?), so the ranks cannot be compared");
    }
    return expanded;
  }
  std::map<long, std::string> by_rank;
  for (const std::string& file : expanded) {
    const long rank = rank_in_path(file);
    SEQPAR_INPUT_CHECK(rank >= 0, option, " ", file,
                       ": no rank number in the file's name or folder (name them like model_rank0.safetensors)");
    const auto [where, added] = by_rank.emplace(rank, file);
    SEQPAR_INPUT_CHECK(added || where->second == file, option, ": two files for rank ", rank, ": ",
                       where->second, " and ", file);
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

std::vector<std::pair<std::string, std::string>> input_files(const FileLists& lists) {
  std::vector<std::pair<std::string, std::string>> files;
  const auto add = [&](const char* option, const std::vector<std::string>& patterns) {
    for (const std::string& pattern : patterns) {
      if (pattern.empty()) continue;
      for (std::string& file : expand(option, pattern)) files.emplace_back(option, std::move(file));
    }
  };
  add("--ranks", lists.ranks);
  add("--grads", lists.grads);
  add("--optimizer", lists.optimizer);
  add("--baseline", lists.baseline);
  if (!lists.initial.empty()) files.emplace_back("--initial", lists.initial);
  return files;
}

namespace {

// The baseline's files merged, each kind it holds complete against rank 0's parameters.
RankState read_baseline(const std::vector<std::string>& files, const TensorSet& parameters,
                        std::vector<std::string>& skipped) {
  RankState baseline;
  for (const std::string& file : files) read_into(baseline, file, false, false, skipped);
  const std::string who = "--baseline " + files[0];
  check_complete(baseline.parameters, parameters, "", who, "parameter");
  if (!baseline.gradients.empty()) check_complete(baseline.gradients, parameters, "grad.", who, "gradient");
  if (!baseline.exp_avg.empty()) check_complete(baseline.exp_avg, parameters, "exp_avg.", who, "first moment");
  if (!baseline.exp_avg_sq.empty()) {
    check_complete(baseline.exp_avg_sq, parameters, "exp_avg_sq.", who, "second moment");
  }
  return baseline;
}

}  // namespace

RunFiles read_run_files(const FileLists& lists) {
  SEQPAR_INPUT_CHECK(!lists.ranks.empty(), "--ranks: name every rank's file (--ranks 'model_rank*.safetensors')");
  RunFiles run;
  const std::vector<std::string> rank_files = files_by_rank("--ranks", lists.ranks, &run.notes);
  run.ranks.resize(rank_files.size());
  for (size_t rank = 0; rank < rank_files.size(); ++rank) {
    read_into(run.ranks[rank], rank_files[rank], false, false, run.skipped);
  }
  const auto add_files = [&](const char* option, const std::vector<std::string>& patterns, bool grads) {
    if (patterns.empty()) return;
    const std::vector<std::string> files = files_by_rank(option, patterns);
    SEQPAR_INPUT_CHECK(files.size() == rank_files.size(), option, ": files for ", files.size(),
                       " ranks, but --ranks has ", rank_files.size());
    for (size_t rank = 0; rank < files.size(); ++rank) read_into(run.ranks[rank], files[rank], grads, !grads, run.skipped);
  };
  add_files("--grads", lists.grads, true);
  add_files("--optimizer", lists.optimizer, false);
  check_ranks_alike(run);
  for (const StoredTensor& tensor : run.ranks[0].parameters.tensors) run.parameter_names.push_back(tensor.name);

  const TensorSet& parameters = run.ranks[0].parameters;
  if (!lists.baseline.empty()) run.baseline = read_baseline(lists.baseline, parameters, run.skipped);
  if (!lists.initial.empty()) {
    StoredFile file = read_safetensors(lists.initial, is_step_count);
    TensorSet initial;
    for (StoredTensor& tensor : file.tensors) {
      if (parameters.find(tensor.name)) initial.add(std::move(tensor));
      else run.set_aside.push_back(tensor.name + " (" + lists.initial + ")");
    }
    check_complete(initial, parameters, "", "--initial " + lists.initial, "parameter");
    run.initial = std::move(initial);
  }
  return run;
}

}  // namespace seqpar::diagnose
