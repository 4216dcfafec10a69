// The dropout scenario (apps/repro/dropout_scenario.h) on CPU threads: the same seed and
// offset on every rank must train away from one-rank training, a mask keyed by the
// global row must give the one-rank gradient up to rounding, and with the exact sums bit
// for bit; the ranks agree in every variant. The mask-mismatch figure is checked
// against a count made shard by shard with nn::dropout itself.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include "apps/repro/config.h"
#include "apps/repro/dropout_scenario.h"
#include "apps/repro/pitfall.h"
#include "core/device.h"
#include "core/error.h"
#include "nn/dropout.h"
#include "tests/apps/pitfall_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

PitfallResults run_on_threads(const ReproConfig& config, Device device = Device::cpu(), bool dump = false) {
  return test::run_pitfall_on_threads(dropout_scenario(), config, device, dump);
}

ReproConfig small(int64_t sp, int64_t dp) {
  ReproConfig config = test::small_pitfall_config("dropout", sp, dp, 203);
  config.dropout = 0.1;
  return config;
}

using test::by_name;

}  // namespace

TEST_CASE("dropout: the same offset on every rank trains elsewhere, the global row is exact", "[app]") {
  for (const auto& [sp, dp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    INFO("sp " << sp << " dp " << dp);
    const PitfallResults results = run_on_threads(small(sp, dp));
    REQUIRE(results.variants.size() == 3);
    for (const VariantFigures& f : results.variants) {
      INFO(f.name);
      CHECK(f.ranks_agree);
    }
    const auto named = by_name(results);
    // A tenth of the shards' mask elements wrong: far above rounding, at the right scale.
    const VariantFigures& same = named.at("same seed and offset on every rank");
    CHECK(same.gradient_error > 1e-2);
    CHECK(same.gradient_scale == Approx(1).epsilon(0.2));
    CHECK_FALSE(same.equals_baseline);
    CHECK(same.max_difference > 1e-5);
    const VariantFigures& global = named.at("mask keyed by global row");
    CHECK(global.gradient_error < 1e-6);
    CHECK(global.gradient_scale == Approx(1).epsilon(1e-6));
    CHECK(global.max_difference < 1e-6);
    const VariantFigures& exact = named.at("global row, exact sums");
    CHECK(exact.exact);
    CHECK(exact.equals_baseline);
    CHECK(exact.gradient_error == 0);
    CHECK(exact.max_difference == 0);
  }
}

TEST_CASE("dropout: the mismatch figure counts the shards' wrong mask elements", "[app]") {
  for (const auto& [sp, dp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}, {1, 2}}) {
    INFO("sp " << sp << " dp " << dp);
    ReproConfig config = small(sp, dp);
    config.rows = 1001;
    config.out_features = 16;
    config.in_features = 16;
    const uint64_t random_offset = 12345;
    // Counted shard by shard: each rank's mask with first_row at its replica's start (the
    // same offset everywhere) against the mask with its global first row.
    const float p = static_cast<float>(config.dropout);
    const uint64_t offset = dropout_mask_offset(config, random_offset, 1);
    CHECK(offset == random_offset + 4 * ((dp * config.rows * 16 + 3) / 4));
    int64_t wrong = 0;
    for (int64_t replica = 0; replica < dp; ++replica) {
      for (int64_t rank = 0; rank < sp; ++rank) {
        const RowRange shard = shard_of(config.rows, sp, rank);
        const int64_t replica_first = replica * config.rows;
        const auto same = nn::dropout_keep_mask(shard.count, 16, {p, config.seed, offset, replica_first}).to_vector();
        const auto right = nn::dropout_keep_mask(shard.count, 16, {p, config.seed, offset, replica_first + shard.first}).to_vector();
        for (size_t i = 0; i < same.size(); ++i) wrong += same[i] != right[i];
      }
    }
    const double fraction = same_offset_mask_mismatch(config, random_offset, 1);
    CHECK(fraction == static_cast<double>(wrong) / static_cast<double>(dp * config.rows * 16));
    if (sp == 1) {
      CHECK(fraction == 0);  // one shard per replica: it is the whole sequence
    } else {
      // 2p(1-p) of the elements beyond the first shard, within 6 standard deviations.
      const double beyond = static_cast<double>(config.rows - shard_of(config.rows, sp, 0).count) / config.rows;
      const double n = static_cast<double>(dp * config.rows * 16) * beyond;
      const double q = 2 * 0.1 * 0.9;
      CHECK(std::fabs(fraction / beyond - q) < 6 * std::sqrt(q * (1 - q) / n));
    }
  }
}

TEST_CASE("dropout: the report, the notes and the dump's one-rank mask", "[app]") {
  const ReproConfig config = small(4, 1);
  const PitfallResults results = run_on_threads(config, Device::cpu(), true);
  std::ostringstream report;
  print_pitfall(report, results);
  CHECK(report.str().find("one-rank training, bit for bit") != std::string::npos);
  CHECK(report.str().find("of the mask's elements are wrong") != std::string::npos);
  REQUIRE(results.dump.size() == 2 + results.variants.size());
  const NamedTensors& inputs = results.dump[0].second;
  REQUIRE(inputs.size() == 4);
  CHECK(inputs[3].first == "dropout_mask");
  // Step 1's mask starts where the data's draws end: the offset after the Linear's
  // weight and bias and the batch, each rounded up to a whole Philox block.
  const auto block = [](int64_t n) { return static_cast<uint64_t>((n + 3) / 4 * 4); };
  const uint64_t after_data = block(4 * 24) + block(4) + block(203 * 24);
  const Tensor expected = nn::dropout_keep_mask(203, 4, {0.1f, 777, after_data, 0});
  CHECK(test::bitwise_equal(inputs[3].second, expected));
}

TEST_CASE("dropout: p = 0 is refused by the scenario, p of 1 or more or below 0 by the config", "[app]") {
  ReproConfig config = small(4, 1);
  config.dropout = 0;
  CHECK_THROWS_AS(dropout_scenario().check(config), InputError);
  CHECK_THROWS_WITH(dropout_scenario().check(config), Catch::Contains("repro.dropout = 0 drops nothing"));
  for (const std::string value : {"1", "1.5", "-0.1", "0.99999999", "nan", "1e-300"}) {
    INFO(value);
    CHECK_THROWS_AS(parse_config("", {"repro.dropout=" + value}, "test"), InputError);
    CHECK_THROWS_WITH(parse_config("", {"repro.dropout=" + value}, "test"), Catch::Contains("repro.dropout"));
  }
  CHECK_THROWS_WITH(parse_config("", {"repro.dropout=0.99999999"}, "test"), Catch::Contains("rounds to 1"));
  CHECK(parse_config("", {"repro.dropout=0.25"}, "test").dropout == 0.25);
  CHECK(parse_config("", {"repro.dropout=0"}, "test").dropout == 0);
  // It round-trips through --print-config's TOML.
  const ReproConfig read = parse_config("", {"repro.dropout=0.3", "repro.scenario=\"dropout\""}, "test");
  CHECK(parse_config(to_toml(read), {}, "round trip").dropout == 0.3);
}

TEST_CASE("dropout scenario on a GPU: the exact variant equals one-rank training bitwise", "[app][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const auto& [sp, dp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    const PitfallResults results = run_on_threads(small(sp, dp), Device::cuda(0));
    const auto named = by_name(results);
    CHECK(named.at("global row, exact sums").equals_baseline);
    CHECK(named.at("mask keyed by global row").gradient_error < 1e-6);
    CHECK(named.at("same seed and offset on every rank").gradient_error > 1e-2);
    for (const VariantFigures& f : results.variants) CHECK(f.ranks_agree);
  }
}
