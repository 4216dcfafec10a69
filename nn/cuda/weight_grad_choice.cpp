#include "nn/cuda/weight_grad_choice.h"

#include "core/error.h"

namespace seqpar::nn::detail {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

WeightGradChoice run(WeightGradKernel kernel) { return {WeightGradLaunch::Run, kernel}; }

// A dy of any values: the CRT where the sums are large enough to pay for its launches.
WeightGradChoice general_choice(const WeightGradShape& shape) {
  const bool crt = shape.rows * shape.in * shape.out >= kCrtMinTerms;
  return run(crt ? WeightGradKernel::Crt : WeightGradKernel::Binned);
}

}  // namespace

const char* to_string(WeightGradKernel kernel) {
  switch (kernel) {
    case WeightGradKernel::None: return "none";
    case WeightGradKernel::Binned: return "binned";
    case WeightGradKernel::OneMagnitudeFewOutputs: return "one-magnitude, few outputs";
    case WeightGradKernel::OneMagnitudeManyOutputs: return "one-magnitude, many outputs";
    case WeightGradKernel::Crt: return "CRT on int8 products";
  }
  return "?";
}

bool few_outputs_kernel_fits(const WeightGradShape& shape) {
  using Grid = FewOutputsGrid;
  constexpr int64_t kMaxGridYZ = 65535, kMaxGridX = 0x7fffffff, kMaxOffset = int64_t{1} << 31;
  return ceil_div(shape.rows, Grid::kRowsPerChunk) <= kMaxGridYZ &&
         ceil_div(shape.out, Grid::kOutputsPerBlock) <= kMaxGridYZ &&
         ceil_div(shape.in, Grid::kColumnsPerBlock) <= kMaxGridX &&
         shape.x_row_stride * Grid::kStepRows < kMaxOffset &&
         shape.dy_row_stride * Grid::kStepRows < kMaxOffset;
}

WeightGradChoice choose_weight_grad_kernel(const WeightGradShape& shape, bool capturing,
                                           DyStructure dy) {
  SEQPAR_CHECK(shape.rows > 0 && shape.in > 0 && shape.out > 0,
               "choose_weight_grad_kernel: dW of ", shape.out, " x ", shape.in, " over ",
               shape.rows, " rows has no sums to choose a kernel for");
  if (shape.out >= kManyOutputsMin) {
    if (capturing) return {WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeManyOutputs};
    switch (dy) {
      case DyStructure::Unknown: return {WeightGradLaunch::ReadDyStructure, WeightGradKernel::None};
      case DyStructure::OneMagnitude: return run(WeightGradKernel::OneMagnitudeManyOutputs);
      case DyStructure::General: return general_choice(shape);
    }
  }
  if (few_outputs_kernel_fits(shape)) {
    return {WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeFewOutputs};
  }
  return general_choice(shape);
}

}  // namespace seqpar::nn::detail
