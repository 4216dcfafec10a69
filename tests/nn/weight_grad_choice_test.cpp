// choose_weight_grad_kernel (nn/cuda/weight_grad_choice.h): its choice in every regime,
// at each threshold and on either side of it. Host code: no GPU needed.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "nn/cuda/weight_grad_choice.h"

using namespace seqpar;
using nn::detail::DyStructure;
using nn::detail::WeightGradChoice;
using nn::detail::WeightGradKernel;
using nn::detail::WeightGradLaunch;
using nn::detail::WeightGradShape;

namespace {

// x [rows, in] and dy [rows, out], contiguous.
WeightGradShape contiguous(int64_t rows, int64_t in, int64_t out) { return {rows, in, out, in, out}; }

WeightGradChoice choose(const WeightGradShape& shape, DyStructure dy = DyStructure::Unknown,
                        bool capturing = false) {
  return nn::detail::choose_weight_grad_kernel(shape, capturing, dy);
}

constexpr WeightGradChoice kReadDy{WeightGradLaunch::ReadDyStructure, WeightGradKernel::None};
constexpr WeightGradChoice kBinned{WeightGradLaunch::Run, WeightGradKernel::Binned};
constexpr WeightGradChoice kCrt{WeightGradLaunch::Run, WeightGradKernel::Crt};
constexpr WeightGradChoice kManyOutputs{WeightGradLaunch::Run, WeightGradKernel::OneMagnitudeManyOutputs};
constexpr WeightGradChoice kDeviceFew{WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeFewOutputs};
constexpr WeightGradChoice kDeviceMany{WeightGradLaunch::DeviceChooses, WeightGradKernel::OneMagnitudeManyOutputs};

}  // namespace

TEST_CASE("weight-grad choice: few outputs leave the choice to the device", "[cpu]") {
  // The Linear (16 outputs), eager or captured, whatever the host knows of dy.
  for (const bool capturing : {false, true}) {
    for (const DyStructure dy : {DyStructure::Unknown, DyStructure::OneMagnitude, DyStructure::General}) {
      CHECK(choose(contiguous(12000, 768, 16), dy, capturing) == kDeviceFew);
      CHECK(choose(contiguous(1, 1, 1), dy, capturing) == kDeviceFew);
      // One output short of the many-outputs kernel.
      CHECK(choose(contiguous(5000, 300, nn::detail::kManyOutputsMin - 1), dy, capturing) == kDeviceFew);
    }
  }
}

TEST_CASE("weight-grad choice: many outputs when eager read dy's structure and run one path", "[cpu]") {
  const int64_t out = nn::detail::kManyOutputsMin;  // the fewest outputs the GEMMs take
  const WeightGradShape large = contiguous(2048, 128, out);  // 2^24 terms
  REQUIRE(large.rows * large.in * large.out >= nn::detail::kCrtMinTerms);
  const WeightGradShape small = contiguous(100, 32, out);
  REQUIRE(small.rows * small.in * small.out < nn::detail::kCrtMinTerms);
  for (const WeightGradShape& shape : {large, small}) {
    CHECK(choose(shape, DyStructure::Unknown) == kReadDy);
    CHECK(choose(shape, DyStructure::OneMagnitude) == kManyOutputs);
  }
  CHECK(choose(large, DyStructure::General) == kCrt);
  CHECK(choose(small, DyStructure::General) == kBinned);
}

TEST_CASE("weight-grad choice: many outputs inside a capture leave the choice to the device",
          "[cpu]") {
  for (const DyStructure dy : {DyStructure::Unknown, DyStructure::OneMagnitude, DyStructure::General}) {
    CHECK(choose(contiguous(2000, 128, 64), dy, /*capturing=*/true) == kDeviceMany);
    CHECK(choose(contiguous(3, 5, 1000), dy, /*capturing=*/true) == kDeviceMany);
  }
}

TEST_CASE("weight-grad choice: the CRT from kCrtMinTerms terms for a general dy", "[cpu]") {
  const int64_t terms = nn::detail::kCrtMinTerms;
  // 2^24 terms exactly, and one row fewer, with many outputs and a general dy.
  const int64_t in = 256, out = 128, rows = terms / (in * out);
  REQUIRE(rows * in * out == terms);
  CHECK(choose(contiguous(rows, in, out), DyStructure::General) == kCrt);
  CHECK(choose(contiguous(rows - 1, in, out), DyStructure::General) == kBinned);
}

TEST_CASE("weight-grad choice: few outputs past the kernel's grid take the general path",
          "[cpu]") {
  using Grid = nn::detail::FewOutputsGrid;
  // Rows: 65,535 chunks of kRowsPerChunk fit; one row more does not.
  const int64_t most_rows = 65535 * Grid::kRowsPerChunk;
  CHECK(nn::detail::few_outputs_kernel_fits(contiguous(most_rows, 4, 16)));
  CHECK_FALSE(nn::detail::few_outputs_kernel_fits(contiguous(most_rows + 1, 4, 16)));
  // So many rows are above the CRT's threshold, even over one input and one output.
  CHECK(choose(contiguous(most_rows + 1, 4, 16)) == kCrt);
  CHECK(choose(contiguous(most_rows + 1, 1, 1)) == kCrt);
  // A row stride whose 32 rows pass 2^31 elements: x's, then dy's.
  const int64_t too_far = (int64_t{1} << 31) / Grid::kStepRows;
  CHECK(nn::detail::few_outputs_kernel_fits({100, 8, 16, too_far - 1, 16}));
  CHECK_FALSE(nn::detail::few_outputs_kernel_fits({100, 8, 16, too_far, 16}));
  CHECK_FALSE(nn::detail::few_outputs_kernel_fits({100, 8, 16, 8, too_far}));
  CHECK(choose({100, 8, 16, too_far, 16}) == kBinned);  // 12,800 terms: below the CRT's
}

TEST_CASE("weight-grad choice: a dW with no sums is an error naming its shape", "[cpu]") {
  CHECK_THROWS_WITH(choose(contiguous(0, 4, 4)), Catch::Contains("4 x 4 over 0 rows"));
  CHECK_THROWS_AS(choose(contiguous(4, 0, 4)), Error);
  CHECK_THROWS_AS(choose(contiguous(4, 4, 0)), Error);
}

TEST_CASE("weight-grad choice: every kernel has a name", "[cpu]") {
  CHECK(std::string(nn::detail::to_string(WeightGradKernel::Crt)) == "CRT on int8 products");
  CHECK(std::string(nn::detail::to_string(WeightGradKernel::OneMagnitudeFewOutputs)) ==
        "one-magnitude, few outputs");
}
