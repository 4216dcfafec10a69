#include "core/exact_sums.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/exact_sum.h"

namespace seqpar::exact {

namespace {

thread_local CrossRankSums* current_combiner = nullptr;

void require_same(const char* op, const ExactSums& a, const ExactSums& b) {
  SEQPAR_CHECK(a.count() == b.count() && a.device() == b.device(), op, ": ", a.count(),
               " sums on ", a.device(), " vs ", b.count(), " sums on ", b.device());
}

}  // namespace

ExactSums::ExactSums(int64_t count, Device device) : count_(count), device_(device) {
  SEQPAR_CHECK(count >= 0, "ExactSums: the count must be >= 0, got ", count);
  const int64_t bytes = words() * static_cast<int64_t>(sizeof(int64_t));
  if (bytes == 0) return;
  if (device.is_cuda()) {
    digits_ = static_cast<int64_t*>(cuda::allocate(static_cast<size_t>(bytes), device.index));
#ifdef SEQPAR_WITH_CUDA
    detail::zero_digits_cuda(digits_, words(), device.index);
#endif
    return;
  }
  digits_ = static_cast<int64_t*>(std::calloc(static_cast<size_t>(words()), sizeof(int64_t)));
  SEQPAR_CHECK(digits_ != nullptr, "ExactSums: out of host memory for ", count, " sums");
}

ExactSums::~ExactSums() {
  if (digits_ == nullptr) return;
  if (device_.is_cuda()) {
    try {  // a destructor must not throw; a failed free leaves the block to the pool
      cuda::release(digits_, device_.index);
    } catch (...) {
    }
  } else {
    std::free(digits_);
  }
}

ExactSums::ExactSums(ExactSums&& other) noexcept
    : count_(other.count_), device_(other.device_), digits_(std::exchange(other.digits_, nullptr)) {}

ExactSums& ExactSums::operator=(ExactSums&& other) noexcept {
  if (this != &other) {
    ExactSums old(std::move(*this));
    count_ = other.count_;
    device_ = other.device_;
    digits_ = std::exchange(other.digits_, nullptr);
  }
  return *this;
}

int64_t ExactSums::words() const { return kDigits * count_; }

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
  if (device_.is_cuda()) return detail::add_digits_cuda(digits_, other.digits_, words(), device_.index);
#endif
  for (int64_t i = 0; i < words(); ++i) {
    // The special digit's flags are or-ed within one rank but added across ranks
    // (core/exact_sum.h): add() is the across-ranks addition of the threads group.
    // Two's complement wrap-around is harmless: the true totals stay in range.
    digits_[i] = static_cast<int64_t>(static_cast<uint64_t>(digits_[i]) +
                                      static_cast<uint64_t>(other.digits_[i]));
  }
}

void ExactSums::copy_from(const ExactSums& other) {
  require_same("ExactSums::copy_from", *this, other);
  if (words() == 0) return;
  const size_t bytes = static_cast<size_t>(words()) * sizeof(int64_t);
  if (device_.is_cpu()) {
    std::memcpy(digits_, other.digits_, bytes);
  } else {
    cuda::copy(digits_, device_, other.digits_, other.device_, bytes);
  }
}

void ExactSums::round_into(const Tensor& out) const {
  SEQPAR_CHECK(out.defined() && out.is_contiguous() && out.numel() == count_ &&
                   out.device() == device_,
               "ExactSums::round_into: the output must be a contiguous tensor of ", count_,
               " elements on ", device_, ", got shape ", out.shape(), " on ", out.device());
  if (count_ == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device_.is_cuda()) return detail::round_digits_cuda(digits_, count_, out.data(), device_.index);
#endif
  float* data = out.data();
  for (int64_t i = 0; i < count_; ++i) data[i] = round_to_float(digits_ + i, count_);
}

std::vector<int64_t> ExactSums::to_host() const {
  if (device_.is_cpu()) return std::vector<int64_t>(digits_, digits_ + words());
  std::vector<int64_t> host(static_cast<size_t>(words()));
  if (!host.empty()) {
    cuda::copy(host.data(), Device::cpu(), digits_, device_, host.size() * sizeof(int64_t));
  }
  return host;
}

CrossRankScope::CrossRankScope(CrossRankSums& combiner) : previous_(current_combiner) {
  current_combiner = &combiner;
}

CrossRankScope::~CrossRankScope() { current_combiner = previous_; }

void combine_across_ranks(ExactSums& sums) {
  if (current_combiner != nullptr) current_combiner->combine(sums);
}

void check_term_count(const char* op, int64_t terms) {
  SEQPAR_CHECK(terms <= kMaxTerms, op, ": a sum of ", terms,
               " terms exceeds the exact sums' range of ", kMaxTerms,
               " terms (docs/numerics.md, \"The exactness domain\")");
}

}  // namespace seqpar::exact
