// A consistency checker for replicated training state: do the ranks that should hold
// the same parameters (or gradients) hold them, bit for bit, and is the gradient's
// scale the one a single rank would see?
//
// The mistakes it is meant to catch leave every rank running happily: a gradient
// reduced over a group of one (each rank steps on its own shard), a reduction that is
// missing, or one that sums where it should average (the gradient comes out sp times,
// 1/sp times or √sp times too large). Checking parameter hashes alone finds the first
// kind only after the ranks have drifted; comparing the gradient norm with a
// reference finds the others on step 1.
//
// In a training loop (every rank of `replicas` calls check, in the same order, as with
// any collective):
//
//   dist::ConsistencyChecker checker(sp_group, "sp");
//   for (int64_t step = 1; step <= steps; ++step) {
//     ... forward, backward, gradient synchronization ...
//     const auto report = checker.check(step, grads_of(model), reference_norm);
//     if (!report.consistent || !report.scale_cause.empty()) {
//       std::cerr << report.summary() << '\n';  // e.g. "sp: step 1: ranks differ: 9579 of
//     }                                         // 10256 elements, first tensor 0 element 3
//     optimizer.step();                         // (max |difference| 0.0002); gradient
//   }                                           // norm 4x the reference: x sp (4)"
//
// check() is a collective: it all-gathers a 64-bit fingerprint per rank, and only when
// the fingerprints differ, the tensors themselves, to find where.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"

namespace seqpar::dist {

// Where the ranks' copies first differ: the lowest (tensor, element) at which any rank
// differs from the group's first rank, how many elements differ anywhere, and the
// largest difference.
struct Divergence {
  int64_t tensor = 0, element = 0;
  int64_t differing_elements = 0, total_elements = 0;
  double max_difference = 0;
};

struct ConsistencyReport {
  std::string group;  // the checker's name
  int64_t step = 0;
  int group_size = 0;
  bool consistent = true;               // every rank's tensors bitwise equal
  std::vector<uint64_t> fingerprints;   // [group rank]
  std::optional<Divergence> divergence;  // when not consistent
  // When a reference norm was given: ||tensors|| / reference (this rank's), and the
  // named cause when the ratio is one of the usual mistakes' factors ("" when it is 1
  // or nothing known).
  std::optional<double> norm_ratio;
  std::string scale_cause;
  // The group holds one rank where more replicas were expected: whatever it reduces
  // is a no-op. Set when the checker was told how many replicas to expect.
  bool group_of_one = false;

  // One line for a log: the group, the step, and what is wrong ("consistent" if
  // nothing is).
  std::string summary() const;
};

class ConsistencyChecker {
 public:
  // `expected_replicas`: how many ranks should hold these tensors (0: the group's size,
  // unchecked). A group of one where more were expected is reported as such.
  ConsistencyChecker(std::shared_ptr<ProcessGroup> group, std::string name,
                     int expected_replicas = 0);

  // Collective over the group. `tensors`: this rank's copies (any devices, float32).
  // With `reference_norm`, also the norm ratio and its named cause (the group size is
  // the sp of the causes' factors).
  ConsistencyReport check(int64_t step, const std::vector<Tensor>& tensors,
                          std::optional<double> reference_norm = std::nullopt);

  // The first step a check found the ranks apart (0: none so far).
  int64_t first_divergent_step() const { return first_divergent_step_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::string name_;
  int expected_replicas_;
  int64_t first_divergent_step_ = 0;
};

// FNV-1a 64 over the float32 bits of `tensors`, in order (host copies of device ones).
uint64_t fingerprint(const std::vector<Tensor>& tensors);

// Names a gradient-scale ratio against the factors that gradient-scale mistakes
// produce in a sequence-parallel group of `sp` ranks (and `dp` replicas): "x sp (4)",
// "x 1/sp (0.25)", "x sqrt(sp) (2)", "x 1/sqrt(sp)", "x dp", "x 1/dp", "x sp*dp",
// "x 1/(sp*dp)", "x sqrt(sp*dp)", each only where the factor is not 1; where two coincide, the plainer
// (sp, dp, their product) before the square roots. "" for a ratio within
// `tolerance` (relative) of 1 or of none of them.
std::string name_scale(double ratio, int sp, int dp = 1, double tolerance = 1e-3);

}  // namespace seqpar::dist
