// Gradient checks against central finite differences in float64.
//
// A test re-implements an op's forward pass in double (Eigen) as a function of its
// inputs to one number, perturbs each element of one input by ±h, and compares
// (f(x + h) - f(x - h)) / 2h with the float32 gradient the autograd engine computed.
// Ops with a matrix output are reduced to one number by a fixed random weighting,
// loss = Σ weights ⊙ output, whose gradient with respect to the output is `weights`:
// that is the seed the test hands to backward().
#pragma once

#include <Eigen/Dense>
#include <functional>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace seqpar::test {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Any tensor (any strides) as a double matrix: [n, m] as it is, [m] as one row,
// a scalar as 1x1.
inline MatrixD to_double(const Tensor& tensor) {
  const std::vector<float> values = tensor.to_vector();
  const int64_t rows = tensor.dim() == 2 ? tensor.size(0) : 1;
  const int64_t columns = tensor.dim() == 0 ? 1 : tensor.size(-1);
  MatrixD matrix(rows, columns);
  for (int64_t i = 0; i < rows * columns; ++i) matrix.data()[i] = values[i];
  return matrix;
}

// The test's float64 re-implementation of a forward pass, to one number.
using ScalarFunction = std::function<double(const std::vector<MatrixD>&)>;

// d f / d inputs[which], element by element, by central differences with step h.
inline MatrixD numeric_gradient(const ScalarFunction& function, std::vector<MatrixD> inputs,
                                size_t which, double h = 1e-6) {
  MatrixD gradient(inputs[which].rows(), inputs[which].cols());
  for (Eigen::Index i = 0; i < gradient.size(); ++i) {
    double& element = inputs[which].data()[i];
    const double original = element;
    element = original + h;
    const double above = function(inputs);
    element = original - h;
    const double below = function(inputs);
    element = original;
    gradient.data()[i] = (above - below) / (2.0 * h);
  }
  return gradient;
}

// Largest element error relative to the largest gradient element (the gradients of
// a sum of float32 terms are accurate relative to the terms, not to each result).
inline double relative_error(const MatrixD& analytic, const MatrixD& numeric) {
  const double scale = numeric.cwiseAbs().maxCoeff();
  return (analytic - numeric).cwiseAbs().maxCoeff() / (scale > 0.0 ? scale : 1.0);
}

// Σ weights ⊙ output: reduces a matrix output to the number finite differences need.
inline double weighted_sum(const MatrixD& weights, const MatrixD& output) {
  return weights.cwiseProduct(output).sum();
}

}  // namespace seqpar::test
