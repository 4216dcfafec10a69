// ExactSums: the digits of `count` exact sums (core/exact_bins.h) on one device, and the
// one place where sums of several ranks meet.
//
// An op that reduces over rows (Linear's dW and db) accumulates its terms into an
// ExactSums, hands it to combine_across_ranks(), and rounds it once into its float
// output. Outside a CrossRankScope combine_across_ranks() does nothing: the sums are
// this rank's rows alone. Inside one, it adds the digits of every rank of the scope's
// group (an integer all-reduce, see dist/), so the rounded result is the sum over the
// rows of all ranks, exactly as if one rank held them all. Integer addition is
// associative, so no order, algorithm or placement can change a bit of it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/device_buffer.h"
#include "core/tensor.h"

namespace seqpar::exact {

class ExactSums {
 public:
  ExactSums() = default;
  // `count` sums, all zero. Move-only, as its buffer.
  ExactSums(int64_t count, Device device);

  int64_t count() const { return count_; }
  Device device() const { return digits_.device(); }
  // kDigits * count words, digit-major: digit d of sum i is digits()[d * count() + i].
  int64_t* digits() const { return digits_.data(); }
  int64_t words() const { return digits_.size(); }

  // Each element of `values` (float32, any device) as a sum of one term.
  static ExactSums of_values(const Tensor& values);
  // Every sum of `other` added into this one's (same count and device).
  void add(const ExactSums& other);
  // This one's digits become a copy of other's (same count and device).
  void copy_from(const ExactSums& other);
  // Rounds each sum once into `out` (contiguous float32, count elements, same device).
  void round_into(const Tensor& out) const;
  // Rounds sums first .. first + out.numel() - 1 into `out` (contiguous float32, same
  // device): a part of the sums, such as one tensor's of several kept side by side.
  void round_into(const Tensor& out, int64_t first) const;
  // A host copy of the digits (for tests and messages).
  std::vector<int64_t> to_host() const;

 private:
  int64_t count_ = 0;
  DeviceBuffer<int64_t> digits_;
};

// How a group of ranks adds its members' ExactSums: every rank calls combine with the
// same count, in the same order, and ends with the digit-wise sum over the group.
class CrossRankSums {
 public:
  virtual ~CrossRankSums() = default;
  virtual void combine(ExactSums& sums) = 0;
  // Whether combine only enqueues work on the device's current stream (never meets its
  // peers on the host, waits or reads back), so that a CUDA graph can capture it.
  virtual bool only_enqueues() const { return false; }
};

// While one is alive on a thread, combine_across_ranks() on that thread uses its
// combiner (one per thread: a rank of a threads group is a thread). Scopes nest; the
// innermost wins.
class CrossRankScope {
 public:
  explicit CrossRankScope(CrossRankSums& combiner);
  ~CrossRankScope();
  CrossRankScope(const CrossRankScope&) = delete;
  CrossRankScope& operator=(const CrossRankScope&) = delete;

 private:
  CrossRankSums* previous_;
};

// Gradient accumulation without rounding: the sums of successive passes (the
// micro-batches of one optimizer step) added exactly. The n-th combine of a pass adds
// `sums` (first combined across ranks by `across`, when given) into the n-th running
// total and hands the total back, so each pass's rounded outputs are the sums over every
// pass so far, rounded once. A caller that zeroes its gradients before each pass thus
// ends the step with gradients bitwise equal to one pass over all the micro-batches'
// rows. Every pass makes the same combines, with the same counts, in the same order
// (backward over the same graph does).
class AccumulatedSums final : public CrossRankSums {
 public:
  explicit AccumulatedSums(CrossRankSums* across = nullptr) : across_(across) {}
  // The next combine is the first of a new pass.
  void start_pass() {
    ++passes_;
    next_ = 0;
  }
  // A new optimizer step: the next pass's sums start the totals afresh (their buffers
  // are kept for it, so a step allocates nothing once the first has run).
  void reset() {
    passes_ = 0;
    next_ = 0;
  }
  void combine(ExactSums& sums) override;

 private:
  CrossRankSums* across_;
  std::vector<ExactSums> totals_;
  int64_t passes_ = 0;  // since the last reset
  size_t next_ = 0;
};

// Adds the sums of every rank of the current scope's group; nothing outside a scope.
void combine_across_ranks(ExactSums& sums);

// Fails with a clear error when a sum of `terms` terms would leave the digits' range
// (kMaxTerms); `op` names the caller.
void check_term_count(const char* op, int64_t terms);

namespace detail {
#ifdef SEQPAR_WITH_CUDA
// exact_sums.cu: stream-ordered on the device's current stream.
void digits_of_values_cuda(const float* values, int64_t count, int64_t* digits, int device);
void add_digits_cuda(int64_t* digits, const int64_t* other, int64_t words, int device);
// Sums [0, count) of digits with `stride` (digit d of sum i at digits[d * stride + i]).
void round_digits_cuda(const int64_t* digits, int64_t stride, int64_t count, float* out, int device);
#endif
}  // namespace detail

}  // namespace seqpar::exact
