// nn/rope.h: the table against MPFR; the rotation's formula; a shard with its global
// positions equals the full call's rows; the gradient against finite differences;
// bad input. Against float64 PyTorch: scripts/crosscheck_attention.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "apps/common/safetensors.h"
#include "nn/rope.h"
#include "tests/cuda_test_util.h"
#include "tests/gradcheck.h"
#include "tests/mpfr_float.h"
#include "tests/test_util.h"

using namespace seqpar;
using autograd::Variable;
using test::same_bits;

namespace {

std::vector<int64_t> range(int64_t first, int64_t count) {
  std::vector<int64_t> positions(count);
  for (int64_t t = 0; t < count; ++t) positions[t] = first + t;
  return positions;
}

}  // namespace

#ifdef SEQPAR_TEST_HAVE_MPFR
TEST_CASE("rope: the table's cos and sin are correctly rounded at pos · θ", "[rope]") {
  test::MpfrFloat mpfr;
  std::vector<int64_t> positions = range(0, 1024);  // the Ulysses scenario's
  // Large ones; at 2127657 and 59297659 (cos) and 5428171 and 46204913 (sin), with θ_0 = 1,
  // the double value cannot decide the rounding: the long double one does.
  for (const int64_t p : {int64_t{-7}, int64_t{4095}, int64_t{65537}, int64_t{1} << 20,
                          (int64_t{1} << 29) - 3, int64_t{2127657}, int64_t{59297659},
                          int64_t{5428171}, int64_t{46204913}}) {
    positions.push_back(p);
  }
  for (const int64_t dim : {16, 64, 6}) {
    for (const float base : {10000.0f, 500000.0f}) {
      const nn::RopeTable table(positions, dim, base);
      const std::vector<float> cos = table.cos().to_vector(), sin = table.sin().to_vector();
      // θ_m = base^(-2m/D) (the double exponent), correctly rounded to float by MPFR.
      std::vector<float> theta(dim / 2);
      mpfr_t b, e, r;
      mpfr_inits2(256, b, e, r, static_cast<mpfr_ptr>(nullptr));
      for (int64_t m = 0; m < dim / 2; ++m) {
        mpfr_set_flt(b, base, MPFR_RNDN);
        mpfr_set_d(e, -static_cast<double>(2 * m) / static_cast<double>(dim), MPFR_RNDN);
        mpfr_pow(r, b, e, MPFR_RNDN);
        theta[m] = mpfr_get_flt(r, MPFR_RNDN);  // 256 bits first: no double rounding in practice
      }
      mpfr_clears(b, e, r, static_cast<mpfr_ptr>(nullptr));
      int64_t mismatches = 0;
      for (size_t t = 0; t < positions.size(); ++t) {
        for (int64_t m = 0; m < dim / 2; ++m) {
          const double angle = static_cast<double>(positions[t]) * theta[m];
          mismatches += !same_bits(cos[t * dim / 2 + m], mpfr(mpfr_cos, angle));
          mismatches += !same_bits(sin[t * dim / 2 + m], mpfr(mpfr_sin, angle));
        }
      }
      INFO("D " << dim << ", base " << base);
      CHECK(mismatches == 0);
    }
  }
}
#endif

TEST_CASE("rope: the rotation is the stated formula, and positions are global", "[rope]") {
  Generator generator(7100);
  const int64_t tokens = 10, heads = 3, dim = 8, half = dim / 2;
  const Tensor x = generator.randn({tokens, heads, dim});
  const std::vector<int64_t> positions = range(37, tokens);
  for (const Device device : {Device::reference(), Device::cpu()}) {
    const nn::RopeTable table(positions, dim, 10000.0f, device);
    const Tensor out = nn::rope_forward(x.to(device), table);
    const std::vector<float> c = table.cos().to_vector(), s = table.sin().to_vector();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t m = 0; m < half; ++m) {
          const float a = x.at({t, h, m}), b = x.at({t, h, m + half});
          const float cm = c[t * half + m], sm = s[t * half + m];
          CHECK(same_bits(out.at({t, h, m}), a * cm - b * sm));
          CHECK(same_bits(out.at({t, h, m + half}), b * cm + a * sm));
        }
      }
    }
    // A shard of tokens 4..9 with their global positions: the full call's rows.
    const std::vector<int64_t> shard(positions.begin() + 4, positions.end());
    const Tensor part = nn::rope_forward(x.narrow(0, 4, tokens - 4).to(device),
                                         nn::RopeTable(shard, dim, 10000.0f, device));
    CHECK(same_bits(part, out.narrow(0, 4, tokens - 4)));
    // Shard-local positions 0..5 (Megatron-DeepSpeed #392's bug) give other values.
    const Tensor local = nn::rope_forward(x.narrow(0, 4, tokens - 4).to(device),
                                          nn::RopeTable(range(0, tokens - 4), dim, 10000.0f, device));
    CHECK_FALSE(same_bits(local, out.narrow(0, 4, tokens - 4)));
  }
}

// A batch [B, S, H, D]: with S positions every sequence rotates at them, with B·S each
// sequence at its own; either way each sequence's rows are its call alone, bit for bit.
// Packed documents rotate at their positions within each document.
TEST_CASE("rope: a batch rotates each sequence as alone; documents restart their positions", "[rope]") {
  Generator generator(7300);
  const int64_t batch = 3, tokens = 7, heads = 2, dim = 8;
  const Tensor x = generator.randn({batch, tokens, heads, dim});
  const std::vector<int64_t> shared = range(40, tokens);
  std::vector<int64_t> each;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p : range(100 * b, tokens)) each.push_back(p);
  }
  for (const Device device : {Device::reference(), Device::cpu()}) {
    INFO(device);
    const Tensor all_shared = nn::rope_forward(x.to(device), nn::RopeTable(shared, dim, 10000.0f, device));
    const Tensor all_each = nn::rope_forward(x.to(device), nn::RopeTable(each, dim, 10000.0f, device));
    const Tensor back = nn::rope_backward(x.to(device), nn::RopeTable(each, dim, 10000.0f, device));
    for (int64_t b = 0; b < batch; ++b) {
      const Tensor one = x.narrow(0, b, 1).contiguous().view({tokens, heads, dim}).to(device);
      const std::vector<int64_t> own(each.begin() + b * tokens, each.begin() + (b + 1) * tokens);
      CHECK(same_bits(all_shared.narrow(0, b, 1),
                      nn::rope_forward(one, nn::RopeTable(shared, dim, 10000.0f, device))));
      CHECK(same_bits(all_each.narrow(0, b, 1), nn::rope_forward(one, nn::RopeTable(own, dim, 10000.0f, device))));
      CHECK(same_bits(back.narrow(0, b, 1), nn::rope_backward(one, nn::RopeTable(own, dim, 10000.0f, device))));
    }
  }
  CHECK(nn::document_positions({0, 3, 7}, range(0, 7)) == std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3});
  CHECK(nn::document_positions({0, 3, 7}, {2, 5, 6}) == std::vector<int64_t>{2, 2, 3});  // a shard's tokens
  CHECK_THROWS_WITH(nn::document_positions({0, 3, 7}, {7}), Catch::Contains("position 7 lies outside the documents [0, 7)"));
  CHECK_THROWS_WITH(nn::document_positions({1, 3}, {2}), Catch::Contains("must start at 0"));
  CHECK_THROWS_WITH(nn::rope_forward(x, nn::RopeTable(range(0, 5), dim)),
                    Catch::Contains("needs a table of 7 positions (or one per token of the batch, 21)"));
}

TEST_CASE("rope over a batch on the GPU gives the reference's bits", "[cuda]") {
  SEQPAR_REQUIRE_CUDA();
  Generator generator(7301);
  const int64_t batch = 3, tokens = 33, heads = 4, dim = 16;
  const Tensor x = generator.uniform({batch, tokens, heads, dim}, -10.0f, 10.0f);
  std::vector<int64_t> each;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t p : range(1000 * b + 7, tokens)) each.push_back(p);
  }
  for (const std::vector<int64_t>& positions : {range(5, tokens), each}) {
    const nn::RopeTable host(positions, dim), gpu(positions, dim, 10000.0f, Device::cuda());
    CHECK(test::bitwise_equal(nn::rope_forward(x.to(Device::cuda()), gpu), nn::rope_forward(x, host)));
    CHECK(test::bitwise_equal(nn::rope_backward(x.to(Device::cuda()), gpu), nn::rope_backward(x, host)));
  }
}

TEST_CASE("rope: the gradient matches central finite differences in float64", "[rope]") {
  Generator generator(7200);
  const int64_t tokens = 5, heads = 2, dim = 6;
  const std::vector<int64_t> positions = {3, 900, 17, 123456, 0};
  const nn::RopeTable table(positions, dim);
  const Tensor x = generator.randn({tokens, heads, dim}), g = generator.randn({tokens, heads, dim});
  Variable xv(x, true);
  nn::rope(xv, table).backward(g);
  const std::vector<float> c = table.cos().to_vector(), s = table.sin().to_vector();
  const test::MatrixD weights = test::to_double(g.view({tokens, heads * dim}));
  const test::ScalarFunction loss = [&](const std::vector<test::MatrixD>& in) {
    double total = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t m = 0; m < dim / 2; ++m) {
          const double a = in[0](t, h * dim + m), b = in[0](t, h * dim + m + dim / 2);
          const double cm = c[t * dim / 2 + m], sm = s[t * dim / 2 + m];
          total += weights(t, h * dim + m) * (a * cm - b * sm) +
                   weights(t, h * dim + m + dim / 2) * (b * cm + a * sm);
        }
      }
    }
    return total;
  };
  const test::MatrixD numeric = test::numeric_gradient(loss, {test::to_double(x.view({tokens, heads * dim}))}, 0);
  CHECK(test::relative_error(test::to_double(xv.grad().view({tokens, heads * dim})), numeric) < 1e-6);
}

TEST_CASE("rope: bad input is a clear error", "[rope]") {
  CHECK_THROWS_WITH(nn::RopeTable(range(0, 4), 7), Catch::Contains("must be even"));
  CHECK_THROWS_WITH(nn::RopeTable({int64_t{1} << 30}, 8), Catch::Contains("beyond +-2^29"));
  CHECK_THROWS_WITH(nn::RopeTable(range(0, 4), 8, 1.0f), Catch::Contains("base"));
  const nn::RopeTable table(range(0, 4), 8);
  CHECK_THROWS_WITH(nn::rope_forward(Tensor::zeros({5, 2, 8}), table), Catch::Contains("needs a table of 5 positions"));
  CHECK_THROWS_WITH(nn::rope_forward(Tensor::zeros({4, 8}), table), Catch::Contains("[S, H, D] or [B, S, H, D]"));
  CHECK_THROWS_WITH(nn::rope_forward(Tensor::zeros({4, 2, 8}, Device::reference()), table),
                    Catch::Contains("table is on"));
}

TEST_CASE("rope: cases for the PyTorch cross-check", "[.torch]") {
  const char* directory = std::getenv("SEQPAR_CROSSCHECK_DIR");
  REQUIRE(directory != nullptr);
  Generator generator(7300);
  const int64_t tokens = 24, heads = 3, dim = 16;
  const std::vector<int64_t> positions = range(1000, tokens);  // a shard's global positions
  const nn::RopeTable table(positions, dim, 10000.0f);
  const Tensor x = generator.randn({tokens, heads, dim}), g = generator.randn({tokens, heads, dim});
  Variable xv(x, true);
  Variable out = nn::rope(xv, table);
  out.backward(g);
  save_safetensors(std::string(directory) + "/rope.safetensors",
                   {{"x", x}, {"grad_out", g}, {"out", out.data()}, {"grad_x", xv.grad()}},
                   {{"first_position", "1000"}, {"base", "10000"}});
}
