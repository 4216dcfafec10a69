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
//   anything else      a parameter, after the step
//
// A --grads file's names may leave out the "grad." prefix. A rank file's name carries
// its rank: the last number in it (model_rank3.safetensors is rank 3); the ranks must
// be 0..N-1, each once. A single file is rank 0 whatever its name. A one-rank
// reference (--reference) has the same names, and the initial parameters (--initial) the parameters' names; their other tensors (the
// inputs of seqpar-repro's inputs.safetensors) are left aside and listed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apps/diagnose/safetensors_reader.h"

namespace seqpar::diagnose {

// One kind of tensor (parameters, gradients, ...) of one rank, by name, in file order.
struct TensorSet {
  std::vector<StoredTensor> tensors;

  bool empty() const { return tensors.empty(); }
  const StoredTensor* find(const std::string& name) const;
  // All values, tensor after tensor, in the order of `names`.
  std::vector<float> flat(const std::vector<std::string>& names) const;
};

struct RankState {
  std::vector<std::string> files;
  TensorSet parameters, gradients, local_gradients, exp_avg, exp_avg_sq;
  std::optional<float> clip_norm;
  std::map<std::string, std::string> metadata;  // the first file's
};

struct RunFiles {
  std::vector<RankState> ranks;      // [rank]
  std::optional<RankState> reference;  // one rank on the whole batch
  std::optional<TensorSet> initial;    // the parameters before the first step
  std::vector<std::string> parameter_names;  // rank 0's, in its file order
  std::vector<std::string> set_aside;  // tensors read but not used, with their file
};

struct FileLists {
  std::vector<std::string> ranks, grads, optimizer;  // each: patterns or files
  std::vector<std::string> reference;  // the reference's files (parameters, gradients), merged
  std::string initial;
};

// Expands the patterns (glob(3)), orders the files by rank and reads them. Every
// mismatch is an InputError naming the rank, the tensor and what differs.
RunFiles read_run_files(const FileLists& lists);

// The files a list of patterns names, in rank order, as [rank] -> path; the option's
// name goes into the errors (a pattern matching nothing, a missing rank, a file
// without a rank number, two files for one rank).
std::vector<std::string> files_by_rank(const std::string& option, const std::vector<std::string>& patterns);

}  // namespace seqpar::diagnose
