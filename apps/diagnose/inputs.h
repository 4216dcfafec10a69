// What seqpar-diagnose reads: every rank's saved tensors, sorted into what they are,
// checked against each other before any figure is computed.
//
// Each rank's files (--ranks, and optionally --grads and --optimizer) are merged into
// one set of named tensors and sorted by name:
//
//   grad.NAME          the gradient the optimizer stepped with (after any reduction)
//   local_grad.NAME    the rank's own gradient, before any reduction
//   exp_avg.NAME       Adam's first moment after the step
//   exp_avg_sq.NAME    Adam's second moment after the step
//   clip_norm          the norm gradient clipping compared with its threshold (a scalar)
//   attention, attention.query, attention.key
//                      the attention's output and its inputs after RoPE, the rank's
//                      tokens (attention_evidence.h); `output` (seqpar-repro's block
//                      output) is read beside them, not compared
//   anything else      a parameter, after the step
//
// A --grads file's names may leave out the "grad." prefix. The optimizer's step count
// (`step`, `NAME.step`, `step.NAME`) is not a per-parameter tensor: it is skipped, and
// listed. A file's rank is the number after "rank" in its name (model_rank3_step100 is
// rank 3) or, failing that, in its nearest parent folder's (rank3/model.safetensors),
// otherwise the last number in its name; the ranks must be 0..N-1, each once. A single
// file is the only rank (a rank number other than 0 in its name is noted). The
// baseline (--baseline, the one-rank training) has the same names, and the initial
// parameters (--initial) the parameters' names; their other tensors (the inputs of
// seqpar-repro's inputs.safetensors) are left aside and listed.
//
// Tensors are found by name through a hash map: a mixture-of-experts dump of 10^5
// tensors is read in time linear in its size.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "apps/diagnose/safetensors_reader.h"

namespace seqpar::diagnose {

// The number of tensor names compared by the lookups so far: the test that reads 10^5
// tensors bounds the work by it (a scan per lookup would make it grow as the square).
int64_t name_comparisons();

// Name equality for the lookups, counted by name_comparisons().
struct CountedNameEqual {
  bool operator()(const std::string& a, const std::string& b) const;
};

// One kind of tensor (parameters, gradients, ...) of one rank, by name, in file order.
struct TensorSet {
  std::vector<StoredTensor> tensors;  // add() keeps the index beside it
  std::unordered_map<std::string, size_t, std::hash<std::string>, CountedNameEqual> index;

  bool empty() const { return tensors.empty(); }
  void add(StoredTensor tensor);
  const StoredTensor* find(const std::string& name) const;
  // All values, tensor after tensor, in the order of `names`.
  std::vector<float> flat(const std::vector<std::string>& names) const;
};

struct RankState {
  std::vector<std::string> files;
  TensorSet parameters, gradients, local_gradients, exp_avg, exp_avg_sq;
  TensorSet activations;  // the names is_activation_name() gives (attention_evidence.h)
  std::optional<float> clip_norm;
  std::map<std::string, std::string> metadata;  // the first file's
  std::unordered_map<std::string, std::string> origin;  // tensor name -> the file that held it
};

struct RunFiles {
  std::vector<RankState> ranks;      // [rank]
  std::optional<RankState> baseline;  // the one-rank training on the whole batch
  std::optional<TensorSet> initial;    // the parameters before the first step
  std::vector<std::string> parameter_names;  // rank 0's, in its file order
  std::vector<std::string> set_aside;  // tensors read but not used, with their file
  std::vector<std::string> skipped;    // optimizer step counts, with their file
  std::vector<std::string> notes;      // about the files (a lone file named for another rank)
};

struct FileLists {
  std::vector<std::string> ranks, grads, optimizer;  // each: patterns or files
  std::vector<std::string> baseline;  // the baseline's files (parameters, gradients, moments), merged
  std::string initial;
};

// Expands the patterns (glob(3)), orders the files by rank and reads them. Every
// mismatch is an InputError naming the rank, the tensor and what differs.
RunFiles read_run_files(const FileLists& lists);

// The files a list of patterns names, in rank order, as [rank] -> path; the option's
// name goes into the errors (a pattern matching nothing, a missing rank, a file
// without a rank number, two files for one rank).
std::vector<std::string> files_by_rank(const std::string& option, const std::vector<std::string>& patterns,
                                       std::vector<std::string>* notes = nullptr);

// The rank a file's path names (the rules above); -1 when it names none.
long rank_in_path(const std::string& path);

// Every file the lists name (patterns expanded), with the option that names it: what an
// output must not overwrite.
std::vector<std::pair<std::string, std::string>> input_files(const FileLists& lists);

}  // namespace seqpar::diagnose
