#include "core/exact_sums.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/exact_bins.h"

namespace seqpar::exact {

namespace {

void require_same(const char* op, const ExactSums& a, const ExactSums& b) {
  SEQPAR_CHECK(a.count() == b.count() && a.device() == b.device(), op, ": ", a.count(),
               " sums on ", a.device(), " vs ", b.count(), " sums on ", b.device());
}

}  // namespace

ExactSums::ExactSums(int64_t count, Device device) : count_(count) {
  SEQPAR_CHECK(count >= 0, "ExactSums: the count must be >= 0, got ", count);
  digits_ = DeviceBuffer<int64_t>(kDigits * count, device);
  digits_.zero();
}

ExactSums ExactSums::of_values(const Tensor& values) {
  SEQPAR_CHECK(values.defined(), "ExactSums::of_values: undefined tensor");
  const Tensor packed = values.contiguous();
  ExactSums sums(packed.numel(), packed.device());
#ifdef SEQPAR_WITH_CUDA
  if (packed.device().is_cuda()) {
    if (sums.count() > 0) {
      detail::digits_of_values_cuda(packed.data(), sums.count(), sums.digits(), packed.device().index);
    }
    return sums;
  }
#endif
  const float* data = packed.data();
  for (int64_t i = 0; i < sums.count(); ++i) {
    BinnedSum sum;
    sum.clear();
    sum.add(data[i]);
    sum.flush(sums.digits() + i, sums.count());
  }
  return sums;
}

void ExactSums::add(const ExactSums& other) {
  require_same("ExactSums::add", *this, other);
  if (words() == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device().is_cuda()) return detail::add_digits_cuda(digits(), other.digits(), words(), device().index);
#endif
  for (int64_t i = 0; i < words(); ++i) {
    // The special digit's flags are or-ed within one set of digits but added between
    // sets (core/exact_bins.h), so each flag field counts the sets that saw its value:
    // the sets being ranks (the threads group's all-reduce) or micro-batches alike.
    // Two's complement wrap-around is harmless: the true totals stay in range.
    digits()[i] = static_cast<int64_t>(static_cast<uint64_t>(digits()[i]) +
                                       static_cast<uint64_t>(other.digits()[i]));
  }
}

void ExactSums::copy_from(const ExactSums& other) {
  require_same("ExactSums::copy_from", *this, other);
  if (words() == 0) return;
  const size_t bytes = static_cast<size_t>(words()) * sizeof(int64_t);
  if (device().is_host()) {
    std::memcpy(digits(), other.digits(), bytes);
  } else {
    cuda::copy(digits(), device(), other.digits(), other.device(), bytes);
  }
}

void ExactSums::round_into(const Tensor& out) const {
  SEQPAR_CHECK(out.defined() && out.is_contiguous() && out.numel() == count_ &&
                   out.device() == device(),
               "ExactSums::round_into: the output must be a contiguous tensor of ", count_,
               " elements on ", device(), ", got shape ", out.shape(), " on ", out.device());
  round_into(out, 0);
}

void ExactSums::round_into(const Tensor& out, int64_t first) const {
  SEQPAR_CHECK(out.defined() && out.is_contiguous() && out.device() == device() && first >= 0 &&
                   first <= count_ && out.numel() <= count_ - first,
               "ExactSums::round_into: sums ", first, " .. ", first, " + ", out.numel(), " of ",
               count_, " into a ", out.is_contiguous() ? "contiguous" : "strided", " tensor of shape ",
               out.shape(), " on ", out.device(), " (the sums are on ", device(), ")");
  const int64_t count = out.numel();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device().is_cuda()) {
    return detail::round_digits_cuda(digits() + first, count_, count, out.data(), device().index);
  }
#endif
  float* data = out.data();
  for (int64_t i = 0; i < count; ++i) data[i] = round_to_float(digits() + first + i, count_);
}

std::vector<int64_t> ExactSums::to_host() const {
  if (device().is_host()) return std::vector<int64_t>(digits(), digits() + words());
  std::vector<int64_t> host(static_cast<size_t>(words()));
  if (!host.empty()) {
    cuda::copy(host.data(), Device::cpu(), digits(), device(), host.size() * sizeof(int64_t));
  }
  return host;
}

void check_term_count(const char* op, int64_t terms) {
  SEQPAR_CHECK(terms <= kMaxTerms, op, ": a sum of ", terms,
               " terms exceeds the exact sums' range of ", kMaxTerms,
               " terms (docs/numerics.md, \"The exactness domain\")");
}

}  // namespace seqpar::exact
