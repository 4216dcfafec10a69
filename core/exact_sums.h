// ExactSums: the digits of `count` exact sums (core/exact_bins.h) on one device.
//
// An op that reduces over rows (Linear's dW and db) accumulates its terms into an
// ExactSums and rounds it once into its float output. Sums of several ranks meet by
// adding their digits (ProcessGroup::all_reduce_sums in dist/, an integer all-reduce)
// before that one rounding, so the result is the sum over the rows of all ranks, exactly
// as if one rank held them all (nn/exact_gradients.h). Integer addition is associative,
// so no order, algorithm or placement can change a bit of it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/device_buffer.h"
#include "core/tensor.h"
#include "seqpar/config.h"

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
  // Every sum of `other` added into this one's (same count and device), digit by digit:
  // each result is the exact sum of both sets of terms. Where the two sets came from
  // makes no difference: two micro-batches of one rank (nn/exact_gradients.h) and two
  // ranks (the threads group's all-reduce) are added the same way.
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
