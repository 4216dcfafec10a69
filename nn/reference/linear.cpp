// Linear's plain reference (nn/reference/linear.h). Read this file to know what every
// Linear kernel in seqpar computes, bit for bit.
#include "nn/reference/linear.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/exact_bins.h"

namespace seqpar::nn::reference {

void linear_chains(const detail::ConstRows& x, const detail::ConstRows& weight, const float* bias,
                   float* y, int64_t y_row_stride) {
  SEQPAR_CHECK(x.cols == weight.cols, "linear (reference): x has ", x.cols,
               " features, weight ", weight.cols);
  for (int64_t i = 0; i < x.rows; ++i) {
    for (int64_t j = 0; j < weight.rows; ++j) {
      float sum = 0.0f;  // +0: an all-zero chain stays +0, as on every device
      for (int64_t k = 0; k < x.cols; ++k) sum = std::fma(x(i, k), weight(j, k), sum);
      y[i * y_row_stride + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

void linear_grad_input(const detail::ConstRows& grad_y, const detail::ConstRows& weight,
                       float* grad_x, int64_t grad_x_row_stride) {
  SEQPAR_CHECK(grad_y.cols == weight.rows, "linear_backward (reference): dy has ", grad_y.cols,
               " outputs, weight ", weight.rows);
  for (int64_t i = 0; i < grad_y.rows; ++i) {
    for (int64_t k = 0; k < weight.cols; ++k) {
      float sum = 0.0f;
      for (int64_t j = 0; j < grad_y.cols; ++j) sum = std::fma(grad_y(i, j), weight(j, k), sum);
      grad_x[i * grad_x_row_stride + k] = sum;
    }
  }
}

// Row j of dW at a time: one exact running sum per column k, over the rows in order.
// Each term dy * x is a product of two floats, exact in a double; the bins hold it
// without rounding (flushed into the digits before they could fill up), and the digits
// are rounded once, after the ranks' digits are added (ExactSums::round_into).
void linear_weight_sums(const detail::ConstRows& grad_y, const detail::ConstRows& x,
                        exact::ExactSums& sums, int64_t first) {
  SEQPAR_CHECK(grad_y.rows == x.rows && first >= 0 && first + grad_y.cols * x.cols <= sums.count(),
               "linear_backward (reference): dy ", grad_y.rows, " x ", grad_y.cols, ", x ", x.rows,
               " x ", x.cols, ", ", sums.count(), " sums from sum ", first);
  exact::check_term_count("linear_backward", x.rows);
  const int64_t in = x.cols;
  for (int64_t j = 0; j < grad_y.cols; ++j) {
    std::vector<exact::FlushingSum> row_of_dw;
    row_of_dw.reserve(static_cast<size_t>(in));
    for (int64_t k = 0; k < in; ++k) row_of_dw.emplace_back(sums.digits() + first + j * in + k, sums.count());
    for (int64_t i = 0; i < x.rows; ++i) {
      const double dy = grad_y(i, j);
      for (int64_t k = 0; k < in; ++k) row_of_dw[k].add(dy * static_cast<double>(x(i, k)));
    }
    for (exact::FlushingSum& sum : row_of_dw) sum.finish();
  }
}

void linear_bias_sums(const detail::ConstRows& grad_y, exact::ExactSums& sums, int64_t first) {
  SEQPAR_CHECK(first >= 0 && first + grad_y.cols <= sums.count(), "linear_backward (reference): ",
               grad_y.cols, " columns, ", sums.count(), " sums from sum ", first);
  exact::check_term_count("linear_backward", grad_y.rows);
  for (int64_t j = 0; j < grad_y.cols; ++j) {
    exact::FlushingSum sum(sums.digits() + first + j, sums.count());
    for (int64_t i = 0; i < grad_y.rows; ++i) sum.add(grad_y(i, j));  // a float is exact in a double
    sum.finish();
  }
}

}  // namespace seqpar::nn::reference
