#include "nn/dropout.h"

#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/checks.h"
#include "core/error.h"
#include "core/philox.h"
#include "nn/eigen_rows.h"
#include "nn/cuda/dropout.h"

namespace seqpar::nn {

using autograd::Variable;

namespace {

void check_p(float p) {
  // Written so that NaN fails too.
  SEQPAR_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got p = ", p);
}

// The position of element (0, 0) of rows [first_row, first_row + rows), after checking
// that every position up to the last row's end fits in 64 bits.
uint64_t start_position(const char* op, int64_t rows, int64_t columns, const DropoutMask& mask) {
  SEQPAR_CHECK(mask.first_row >= 0, op, ": first_row must be at least 0, got ", mask.first_row);
  SEQPAR_CHECK(rows >= 0 && columns >= 0, op, ": rows and columns must be at least 0, got ",
               rows, " x ", columns);
  SEQPAR_CHECK(rows <= std::numeric_limits<int64_t>::max() - mask.first_row, op, ": first_row ",
               mask.first_row, " + ", rows, " rows overflows");
  const auto end_row = static_cast<uint64_t>(mask.first_row + rows);
  const auto width = static_cast<uint64_t>(columns);
  const uint64_t room = std::numeric_limits<uint64_t>::max() - mask.offset;
  SEQPAR_CHECK(width == 0 || end_row <= room / width, op, ": offset ", mask.offset,
               " + (first_row ", mask.first_row, " + ", rows, " rows) x ", columns,
               " columns does not fit in the 64-bit Philox position");
  return mask.offset + static_cast<uint64_t>(mask.first_row) * width;
}

detail::DropoutLaunch launch_for(const char* op, int64_t rows, int64_t columns,
                                 const DropoutMask& mask) {
  return {mask.seed, start_position(op, rows, columns, mask), dropout_keep_threshold(mask.p),
          dropout_scale(mask.p)};
}

// ---------------------------------------------------------------- dispatch
//
// One dispatch table for the op, by device (the switches in apply and dropout_keep_mask):
//
//   reference, cpu  dropout_cpu below: the plain loop that defines the bits (element-wise:
//                   one Philox word an element, nothing a faster loop would reorder)
//   cuda            nn/cuda/dropout.cu: the same words and the same float multiply,
//                   tested bitwise against this loop (tests/nn/dropout_cuda_test.cpp)

// Element (i, c) is word (start + i * m + c) of the stream; one Philox block at a time,
// so each block's four words are computed once. With `input` undefined, writes the
// keep mask (1 / 0) instead of the values.
void dropout_cpu(const Tensor& input, int64_t rows, int64_t columns,
                 const detail::DropoutLaunch& launch, const Tensor& output) {
  const uint64_t count = static_cast<uint64_t>(rows) * static_cast<uint64_t>(columns);
  if (count == 0) return;
  float* out = output.data();
  const bool values = input.defined();
  const float* in = values ? input.data() : nullptr;
  const int64_t in_stride = values ? detail::row_stride(input) : 0;
  const uint64_t end = launch.start + count;
  for (uint64_t block = launch.start / 4; block <= (end - 1) / 4; ++block) {
    const philox::Block words = philox::stream_block(launch.seed, block);
    for (uint64_t j = 0; j < 4; ++j) {
      const uint64_t position = block * 4 + j;
      if (position < launch.start || position >= end) continue;
      const uint64_t element = position - launch.start;
      const auto row = static_cast<int64_t>(element / static_cast<uint64_t>(columns));
      const auto column = static_cast<int64_t>(element % static_cast<uint64_t>(columns));
      const bool kept = words[j] <= launch.threshold;
      out[element] = !values ? (kept ? 1.0f : 0.0f)
                             : (kept ? in[row * in_stride + column] * launch.scale : 0.0f);
    }
  }
}

Tensor apply(const char* op, const Tensor& input, const DropoutMask& mask) {
  SEQPAR_CHECK(input.defined(), op, ": input must be defined");
  SEQPAR_CHECK(input.dim() == 2, op, ": input must be [n, m], got shape ", input.shape());
  const int64_t rows = input.size(0), columns = input.size(1);
  const detail::DropoutLaunch launch = launch_for(op, rows, columns, mask);
  const Tensor input_rows = detail::with_unit_column_stride(input);
  Tensor output = Tensor::empty(input.shape(), input.device());
  switch (input.device().type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      dropout_cpu(input_rows, rows, columns, launch, output);
      return output;
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      detail::dropout_cuda(input_rows, rows, columns, launch, output);
      return output;
#else
      require_host(op, input.device());
#endif
    }
  }
  SEQPAR_FAIL(op, ": unknown device ", input.device());
}

}  // namespace

float dropout_keep_probability(float p) {
  check_p(p);
  return static_cast<float>(1.0 - static_cast<double>(p));
}

float dropout_scale(float p) {
  return static_cast<float>(1.0 / static_cast<double>(dropout_keep_probability(p)));
}

uint32_t dropout_keep_threshold(float p) {
  const float keep = dropout_keep_probability(p);
  // philox::uniform is non-decreasing in the word, and uniform(0) = 2^-33 is below any
  // keep (at least 2^-24 for p < 1): bisect for the last word whose value is <= keep.
  uint64_t low = 0, high = std::numeric_limits<uint32_t>::max();
  if (philox::uniform(static_cast<uint32_t>(high)) <= keep) return static_cast<uint32_t>(high);
  while (high - low > 1) {  // invariant: uniform(low) <= keep < uniform(high)
    const uint64_t middle = low + (high - low) / 2;
    (philox::uniform(static_cast<uint32_t>(middle)) <= keep ? low : high) = middle;
  }
  return static_cast<uint32_t>(low);
}

uint64_t dropout_positions(int64_t rows, int64_t columns) {
  SEQPAR_CHECK(rows >= 0 && columns >= 0, "dropout_positions: rows and columns must be at least 0, got ",
               rows, " x ", columns);
  const auto count = static_cast<uint64_t>(rows) * static_cast<uint64_t>(columns);
  SEQPAR_CHECK(columns == 0 || count / static_cast<uint64_t>(columns) == static_cast<uint64_t>(rows),
               "dropout_positions: ", rows, " x ", columns, " overflows 64 bits");
  return (count + 3) / 4 * 4;
}

Tensor dropout_forward(const Tensor& input, const DropoutMask& mask) {
  return apply("dropout", input, mask);
}

Tensor dropout_backward(const Tensor& grad_output, const DropoutMask& mask) {
  return apply("dropout_backward", grad_output, mask);
}

Tensor dropout_keep_mask(int64_t rows, int64_t columns, const DropoutMask& mask, Device device) {
  const detail::DropoutLaunch launch = launch_for("dropout_keep_mask", rows, columns, mask);
  Tensor output = Tensor::empty({rows, columns}, device);
  switch (device.type) {
    case DeviceType::Reference:
    case DeviceType::CPU: {
      dropout_cpu(Tensor(), rows, columns, launch, output);
      return output;
    }
    case DeviceType::CUDA: {
#ifdef SEQPAR_WITH_CUDA
      detail::dropout_cuda(Tensor(), rows, columns, launch, output);
      return output;
#else
      require_host("dropout_keep_mask", device);
#endif
    }
  }
  SEQPAR_FAIL("dropout_keep_mask: unknown device ", device);
}

// ---------------------------------------------------------------- autograd

namespace {

// The mask is recomputed from its key rather than stored: it is a pure function of
// (seed, position), so backward draws the forward's words again.
struct DropoutBackward : autograd::Node {
  explicit DropoutBackward(const DropoutMask& mask) : mask(mask) {}
  std::vector<Tensor> apply(const Tensor& grad_output) override {
    return {dropout_backward(grad_output, mask)};
  }
  std::string name() const override { return "DropoutBackward"; }
  DropoutMask mask;
};

}  // namespace

Variable dropout(const Variable& input, float p, uint64_t seed, uint64_t offset,
                 int64_t first_row) {
  SEQPAR_CHECK(input.defined(), "dropout: input must be defined");
  const DropoutMask mask{p, seed, offset, first_row};
  Tensor output = dropout_forward(input.data(), mask);
  if (!autograd::any_requires_grad({&input})) return Variable(std::move(output));
  auto node = std::make_shared<DropoutBackward>(mask);
  node->add_input(input);
  return Variable::from_op(std::move(output), std::move(node));
}

}  // namespace seqpar::nn
