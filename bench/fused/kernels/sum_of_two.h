// The norm of the exact fused step's two tensors' norms (exact_step.cu) in one IEEE
// addition instead of a lane's binned sum, flush and rounding: the same bits.
#pragma once

#include <cmath>

#include "core/exact_bins.h"
#include "core/host_device.h"

namespace seqpar::fused::kernels {

// The exact sum of two terms rounded once to double: what round_to_double gives for a
// BinnedSum of just a and b, without the bins. Each term is first taken as the bins take
// it (past exact::term_limit() an infinity of its sign; otherwise rounded to the grid's unit
// 2^-149, ties to even, which leaves a term already on the grid unchanged since t * 2^149
// is then an integer); two such terms are below 2^130, so their IEEE sum is their
// exact sum rounded once; an exact zero is +0, and the non-finite cases follow IEEE as
// the bins' do. For a sum of two known terms, such as the norm of two tensors' norms.
SEQPAR_HOST_DEVICE double sum_of_two(double a, double b) {
  const auto on_grid = [](double t) {
    if (std::fabs(t) >= exact::term_limit()) return t * INFINITY;  // +-inf (NaN stays NaN below)
    return std::rint(t * 0x1p149) * 0x1p-149;
  };
  const double sum = on_grid(a) + on_grid(b);
  return sum == 0.0 ? 0.0 : sum;
}

}  // namespace seqpar::fused::kernels
