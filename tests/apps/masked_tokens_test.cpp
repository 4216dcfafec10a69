// The masked-tokens scenario (apps/repro/masked_tokens.h) on CPU threads, sp 4 and
// sp 2 x dp 2: the means per micro-batch and per rank must be measurably wrong, the
// global valid count right to float rounding, its exact form one-rank training bit for
// bit, and every variant's ranks must agree. The step-1 gradients in the dump are
// recomputed here in float64 from the mask and the rule the header states, each
// variant with its own weights per row; the one-rank gradient must be the masked mean's,
// which an unmasked mean is measurably not (so a mask that is lost anywhere fails).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/repro/config.h"
#include "apps/repro/masked_tokens.h"
#include "apps/repro/pitfall.h"
#include "core/error.h"
#include "tests/apps/pitfall_test_util.h"
#include "tests/test_util.h"

using namespace seqpar;
using namespace seqpar::repro;

namespace {

PitfallResults run_on_threads(const ReproConfig& config, Device device = Device::cpu()) {
  return test::run_pitfall_on_threads(masked_tokens_scenario(), config, device, /*dump=*/true);
}

// Micro-batches and shards of different sizes.
ReproConfig small(int64_t sp, int64_t dp) {
  ReproConfig config = test::small_pitfall_config("masked-tokens", sp, dp, 301);
  config.gradient_accumulation_steps = 3;
  return config;
}

using test::by_name;

const NamedTensors& dumped(const PitfallResults& results, const std::string& file) {
  for (const auto& [name, tensors] : results.dump) {
    if (name == file) return tensors;
  }
  FAIL("no " << file << " in the dump");
  throw std::logic_error("unreachable");
}

const Tensor& tensor_named(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, tensor] : tensors) {
    if (n == name) return tensor;
  }
  FAIL("no tensor " << name);
  throw std::logic_error("unreachable");
}

// The dumped step-1 gradient, weight then bias, in float64.
std::vector<double> dumped_gradient(const NamedTensors& tensors) {
  std::vector<double> flat;
  for (const char* name : {"grad.weight", "grad.bias"}) {
    for (const float v : tensor_named(tensors, name).to_vector()) flat.push_back(v);
  }
  return flat;
}

double relative_distance(const std::vector<double>& a, const std::vector<double>& b) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(difference / norm);
}

// The step-1 gradient of Σ_i weight_i · Σ_j |y_ij - x_ij| over the rows with a weight,
// in float64: y in float32 in the canonical order (docs/numerics.md: an fma chain over
// the input features from +0, then the bias), so each sign is the one seqpar sees.
struct Model {
  std::vector<float> x, weight, bias;
  int64_t in, out;

  std::vector<double> gradient(const std::vector<double>& row_weights) const {
    std::vector<double> flat(static_cast<size_t>(out * in + out), 0.0);
    for (size_t i = 0; i < row_weights.size(); ++i) {
      if (row_weights[i] == 0) continue;
      const float* row = &x[i * static_cast<size_t>(in)];
      for (int64_t j = 0; j < out; ++j) {
        float y = 0.0f;
        for (int64_t k = 0; k < in; ++k) y = std::fma(row[k], weight[static_cast<size_t>(j * in + k)], y);
        y += bias[static_cast<size_t>(j)];
        const float d = y - row[j];
        const double sign = d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
        for (int64_t k = 0; k < in; ++k) flat[static_cast<size_t>(j * in + k)] += row_weights[i] * sign * row[k];
        flat[static_cast<size_t>(out * in + j)] += row_weights[i] * sign;
      }
    }
    return flat;
  }
};

// The shards of the step, re-derived from the header's rule: micro-batch k of ga holds
// floor(rows (k+1) / (ga (ga+1) / 2)) rows (the last what is left), split over sp as
// torch.tensor_split splits.
struct Part {
  int64_t replica, sp_rank, first, count;
};
std::vector<Part> parts_of(const ReproConfig& c) {
  const int64_t ga = c.gradient_accumulation_steps, sp = c.sequence_parallel_size;
  const int64_t shares = ga * (ga + 1) / 2;
  std::vector<Part> parts;
  for (int64_t d = 0; d < c.data_parallel_size; ++d) {
    int64_t start = d * c.rows, left = c.rows;
    for (int64_t k = 0; k < ga; ++k) {
      const int64_t size = k + 1 < ga ? c.rows * (k + 1) / shares : left;
      for (int64_t r = 0; r < sp; ++r) {
        const int64_t count = size / sp + (r < size % sp ? 1 : 0);
        const int64_t first = start + r * (size / sp) + std::min(r, size % sp);
        parts.push_back({d, r, first, count});
      }
      start += size;
      left -= size;
    }
  }
  return parts;
}

void check_scenario(const ReproConfig& config) {
  const PitfallResults results = run_on_threads(config);
  REQUIRE(results.variants.size() == 4);
  const auto named = by_name(results);
  for (const VariantFigures& f : results.variants) {
    INFO(f.name);
    CHECK(f.ranks_agree);
  }
  // The broken variants: far beyond rounding, by the weights alone.
  const VariantFigures& per_batch = named.at("per-micro-batch mean, averaged");
  const VariantFigures& per_rank = named.at("per-rank count, averaged");
  CHECK(per_batch.gradient_error > 0.05);
  CHECK(per_rank.gradient_error > 0.01);
  CHECK_FALSE(per_batch.equals_baseline);
  CHECK_FALSE(per_rank.equals_baseline);
  CHECK(per_batch.max_difference > 1e-5);
  // The global count: right up to float rounding; exact: one-rank training bitwise.
  const VariantFigures& global = named.at("global count (num_items_in_batch)");
  CHECK(global.gradient_error < 1e-6);
  CHECK(global.gradient_scale == Approx(1).epsilon(1e-6));
  CHECK(global.max_difference < 1e-6);
  const VariantFigures& exact = named.at("global count, exact sums");
  CHECK(exact.exact);
  CHECK(exact.equals_baseline);
  CHECK(exact.gradient_error == 0);
  CHECK(exact.max_difference == 0);

  // The dumped step-1 gradients against float64 recomputations.
  const NamedTensors& inputs = dumped(results, "inputs.safetensors");
  const Model model{tensor_named(inputs, "x").to_vector(), tensor_named(inputs, "weight").to_vector(),
                    tensor_named(inputs, "bias").to_vector(), config.in_features, config.out_features};
  const std::vector<float> mask = tensor_named(inputs, "mask").to_vector();
  CHECK(mask == masked_tokens_mask(config));
  const size_t all_rows = mask.size();
  REQUIRE(all_rows == static_cast<size_t>(config.rows * config.data_parallel_size));
  double valid = 0;
  for (const float m : mask) valid += m;
  const double out = static_cast<double>(config.out_features);
  const double world = static_cast<double>(config.world_size());
  const double ga = static_cast<double>(config.gradient_accumulation_steps);

  std::vector<double> one_rank(all_rows), unmasked(all_rows, 1.0 / (static_cast<double>(all_rows) * out));
  for (size_t i = 0; i < all_rows; ++i) one_rank[i] = mask[i] / (valid * out);
  std::vector<double> batch_means(all_rows, 0.0), rank_means(all_rows, 0.0);
  std::map<std::pair<int64_t, int64_t>, double> rank_valid;
  for (const Part& p : parts_of(config)) {
    for (int64_t i = p.first; i < p.first + p.count; ++i) rank_valid[{p.replica, p.sp_rank}] += mask[static_cast<size_t>(i)];
  }
  for (const Part& p : parts_of(config)) {
    double part_valid = 0;
    for (int64_t i = p.first; i < p.first + p.count; ++i) part_valid += mask[static_cast<size_t>(i)];
    REQUIRE(part_valid >= 1);  // no local mean of nothing
    for (int64_t i = p.first; i < p.first + p.count; ++i) {
      const auto row = static_cast<size_t>(i);
      batch_means[row] = mask[row] / (part_valid * out) / ga / world;
      rank_means[row] = mask[row] / (rank_valid[{p.replica, p.sp_rank}] * out) / world;
    }
  }
  const std::vector<double> expected = model.gradient(one_rank);
  const std::vector<double> reference = dumped_gradient(dumped(results, "reference.safetensors"));
  CHECK(relative_distance(reference, expected) < 1e-5);
  // Sensitivity: without the mask the gradient is far from the masked one.
  CHECK(relative_distance(model.gradient(unmasked), expected) > 0.05);
  CHECK(relative_distance(dumped_gradient(dumped(results, "variant0.safetensors")), model.gradient(batch_means)) < 1e-5);
  CHECK(relative_distance(dumped_gradient(dumped(results, "variant1.safetensors")), model.gradient(rank_means)) < 1e-5);
  CHECK(relative_distance(dumped_gradient(dumped(results, "variant2.safetensors")), expected) < 1e-5);
  CHECK(dumped_gradient(dumped(results, "variant3.safetensors")) == reference);  // bitwise (as doubles of floats)

  std::ostringstream report;
  print_pitfall(report, results);
  CHECK(report.str().find("global count, exact sums") != std::string::npos);
  CHECK(report.str().find("one-rank training, bit for bit") != std::string::npos);
  CHECK(report.str().find("(x1 + x2)/(n1 + n2)") != std::string::npos);
}

}  // namespace

TEST_CASE("masked-tokens, sp 4: local means are wrong, the global count right, exact bitwise", "[app]") {
  check_scenario(small(4, 1));
}

TEST_CASE("masked-tokens, sp 2 x dp 2: the same over replicas", "[app]") {
  check_scenario(small(2, 2));
}

TEST_CASE("masked-tokens with one micro-batch: the ranks' uneven counts alone break the means", "[app]") {
  ReproConfig config = small(4, 1);
  config.gradient_accumulation_steps = 1;
  const auto named = by_name(run_on_threads(config));
  // One micro-batch: the two local conventions coincide, and are still wrong.
  CHECK(named.at("per-micro-batch mean, averaged").gradient_error ==
        named.at("per-rank count, averaged").gradient_error);
  CHECK(named.at("per-rank count, averaged").gradient_error > 0.01);
  CHECK(named.at("global count, exact sums").equals_baseline);
}

TEST_CASE("masked-tokens: the mask is deterministic, uneven over the ranks, never empty in a part",
          "[app]") {
  const ReproConfig config = small(4, 1);
  const std::vector<float> mask = masked_tokens_mask(config);
  CHECK(mask == masked_tokens_mask(config));
  ReproConfig other = config;
  other.seed = 778;
  CHECK(mask != masked_tokens_mask(other));
  std::vector<double> ignored(4, 0), rows(4, 0);
  for (const Part& p : parts_of(config)) {
    double part_valid = 0;
    for (int64_t i = p.first; i < p.first + p.count; ++i) {
      const float m = mask[static_cast<size_t>(i)];
      CHECK((m == 0.0f || m == 1.0f));
      part_valid += m;
      ignored[static_cast<size_t>(p.sp_rank)] += 1 - m;
      rows[static_cast<size_t>(p.sp_rank)] += 1;
    }
    CHECK(part_valid >= 1);
  }
  double lowest = 1, highest = 0;
  for (size_t r = 0; r < 4; ++r) {
    lowest = std::min(lowest, ignored[r] / rows[r]);
    highest = std::max(highest, ignored[r] / rows[r]);
  }
  CHECK(highest - lowest > 0.1);  // the ranks' shares of ignored rows differ
  // The micro-batches: different sizes, covering the replica's rows.
  const std::vector<RowRange> batches = micro_batches_of(301, 3);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].count == 50);
  CHECK(batches[1].count == 100);
  CHECK(batches[2].count == 151);
  CHECK(batches[2].first == 150);
}

TEST_CASE("masked-tokens: configurations it cannot run are refused, naming the keys", "[app]") {
  ReproConfig config = small(4, 1);
  config.rows = 23;  // three micro-batches of 1/6, 2/6, 3/6 need 24 rows for 4 ranks
  CHECK_THROWS_AS(masked_tokens_scenario().check(config), InputError);
  CHECK_THROWS_WITH(masked_tokens_scenario().check(config),
                    Catch::Contains("repro.rows = 23") && Catch::Contains("gradient_accumulation_steps = 3") &&
                        Catch::Contains("at least 24 rows"));
  config.rows = 24;
  CHECK_NOTHROW(masked_tokens_scenario().check(config));
  // Accumulation is accepted for this scenario and refused for the others.
  CHECK(parse_config("", {"repro.scenario=\"masked-tokens\"", "ds_config.gradient_accumulation_steps=8"}, "test")
            .gradient_accumulation_steps == 8);
  CHECK_THROWS_WITH(parse_config("", {"ds_config.gradient_accumulation_steps=8"}, "test"),
                    Catch::Contains("gradient_accumulation_steps = 8: only 1 is supported"));
  CHECK_THROWS_WITH(parse_config("", {"repro.scenario=\"masked-tokens\"", "ds_config.gradient_accumulation_steps=0"},
                                 "test"),
                    Catch::Contains("ds_config.gradient_accumulation_steps"));
  CHECK_THROWS_WITH(parse_config("", {"repro.scenario=\"masked-tokens\"",
                                      "ds_config.gradient_accumulation_steps=1001"}, "test"),
                    Catch::Contains("must be at most 1000"));
}

TEST_CASE("masked-tokens on a GPU: the exact variant equals one-rank training bitwise", "[app][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  for (const ReproConfig& config : {small(4, 1), small(2, 2)}) {
    const PitfallResults results = run_on_threads(config, Device::cuda(0));
    const auto named = by_name(results);
    CHECK(named.at("global count, exact sums").equals_baseline);
    CHECK(named.at("global count, exact sums").gradient_error == 0);
    for (const VariantFigures& f : results.variants) CHECK(f.ranks_agree);
    // The GPU's dump holds the CPU's numbers: the same mask and the same bits.
    const PitfallResults cpu = run_on_threads(config);
    CHECK(dumped_gradient(dumped(results, "reference.safetensors")) ==
          dumped_gradient(dumped(cpu, "reference.safetensors")));
  }
}
