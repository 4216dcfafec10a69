// The Generator's Philox (core/philox.h) against the published Philox4x32-10 answer
// and, where cuRAND is installed, against cuRAND's host generator bit for bit: the
// numbers every golden file and every initial parameter rest on.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "core/generator.h"
#include "core/philox.h"

#ifdef SEQPAR_TEST_HAVE_CURAND
#include <curand.h>
#endif

using namespace seqpar;

TEST_CASE("Philox4x32-10 gives the Random123 known-answer values", "[core][philox]") {
  // Random123's kat_vectors: philox4x32 10 rounds, counter and key all ones / pi digits.
  CHECK(philox::philox4x32_10({0, 0, 0, 0}, 0) ==
        philox::Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  CHECK(philox::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                              0xffffffffffffffffull) ==
        philox::Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  CHECK(philox::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                              0x299f31d0a4093822ull) ==
        philox::Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("the host stream spreads blocks over 65536 subsequences", "[core][philox]") {
  philox::HostStream stream(7);
  const philox::Block second_subsequence = philox::philox4x32_10({0, 0, 1, 0}, 7);
  const philox::Block second_step = philox::philox4x32_10({1, 0, 0, 0}, 7);
  CHECK(stream.at(4) == second_subsequence[0]);
  CHECK(stream.at(7) == second_subsequence[3]);
  CHECK(stream.at(4 * 65536 + 2) == second_step[2]);
}

#ifdef SEQPAR_TEST_HAVE_CURAND
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct CurandHost {
  curandGenerator_t generator = nullptr;
  explicit CurandHost(uint64_t seed) {
    REQUIRE(curandCreateGeneratorHost(&generator, CURAND_RNG_PSEUDO_PHILOX4_32_10) ==
            CURAND_STATUS_SUCCESS);
    REQUIRE(curandSetPseudoRandomGeneratorSeed(generator, seed) == CURAND_STATUS_SUCCESS);
  }
  ~CurandHost() { curandDestroyGenerator(generator); }
  std::vector<float> normal(uint64_t offset, size_t count) {
    std::vector<float> values(count);
    REQUIRE(curandSetGeneratorOffset(generator, offset) == CURAND_STATUS_SUCCESS);
    REQUIRE(curandGenerateNormal(generator, values.data(), count, 0.0f, 1.0f) ==
            CURAND_STATUS_SUCCESS);
    return values;
  }
  std::vector<float> uniform(uint64_t offset, size_t count) {
    std::vector<float> values(count);
    REQUIRE(curandSetGeneratorOffset(generator, offset) == CURAND_STATUS_SUCCESS);
    REQUIRE(curandGenerateUniform(generator, values.data(), count) == CURAND_STATUS_SUCCESS);
    return values;
  }
};

}  // namespace

TEST_CASE("Generator equals cuRAND's host generator bit for bit", "[core][philox][curand]") {
  // Past one pass over the 65536 subsequences (262144 values), odd counts, offsets.
  for (const uint64_t seed : {uint64_t{12345}, uint64_t{0x123456789abcull}}) {
    CurandHost curand(seed);
    // 6: an offset inside a Philox block (Generator::set_offset allows it).
    for (const uint64_t offset : {uint64_t{0}, uint64_t{6}, uint64_t{8}, uint64_t{1000004}}) {
      for (const int64_t count : {int64_t{407}, int64_t{600000}}) {
        INFO("seed " << seed << " offset " << offset << " count " << count);
        Generator generator(seed, offset);
        CHECK(same_bits(generator.randn({count}).to_vector(), curand.normal(offset, count)));
        Generator uniform(seed, offset);
        CHECK(same_bits(uniform.uniform({count}, 0.0f, 1.0f).to_vector(),
                        curand.uniform(offset, count)));
      }
    }
  }
}
#endif
