#include "apps/repro/validate.h"

#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <cstdio>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "apps/common/text.h"
#include "apps/repro/scenario_list.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

constexpr const char* kLr = "ds_config.optimizer.params.lr";
constexpr const char* kBetas = "ds_config.optimizer.params.betas";
constexpr const char* kEps = "ds_config.optimizer.params.eps";
constexpr const char* kWeightDecay = "ds_config.optimizer.params.weight_decay";
constexpr const char* kClipping = "ds_config.gradient_clipping";

// A double with enough digits to tell 0.99999999 from 1.
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// a x b, or an error naming what the product is.
int64_t product(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  SEQPAR_INPUT_CHECK(!__builtin_mul_overflow(a, b, &result), "config: ", what, " = ", a, " x ",
                     b, " overflows a 64-bit integer");
  return result;
}

uint64_t unsigned_sum(std::initializer_list<uint64_t> terms) {
  uint64_t total = 0;
  for (uint64_t term : terms) {
    SEQPAR_INPUT_CHECK(!__builtin_add_overflow(total, term, &total),
                       "config: the memory estimate overflows a 64-bit integer");
  }
  return total;
}

uint64_t unsigned_product(uint64_t a, uint64_t b) {
  uint64_t result = 0;
  SEQPAR_INPUT_CHECK(!__builtin_mul_overflow(a, b, &result),
                     "config: the memory estimate overflows a 64-bit integer");
  return result;
}

void check_at_least(int64_t value, int64_t least, const char* key) {
  SEQPAR_INPUT_CHECK(value >= least, "config key ", key, " = ", number(value), ": must be at least ",
                     least);
}

// The optimizer's scalars reach float32 kernels: a value must be finite, survive the
// rounding to float32 without overflowing or flushing towards zero, and lie in its range.
void check_float(double value, const char* key, double low, bool low_included, double high) {
  SEQPAR_INPUT_CHECK(std::isfinite(value), "config key ", key, " = ", number(value),
                     ": must be a finite number");
  SEQPAR_INPUT_CHECK(value == 0 || (std::abs(value) >= FLT_MIN && std::abs(value) <= FLT_MAX),
                     "config key ", key, " = ", number(value), ": not representable in float32 (",
                     FLT_MIN, " to ", FLT_MAX, ")");
  const bool above_low = low_included ? value >= low : value > low;
  SEQPAR_INPUT_CHECK(above_low && value <= high, "config key ", key, " = ", number(value),
                     ": must be in ", low_included ? "[" : "(", low, ", ", high, "]");
}

void check_beta(double beta, const char* which) {
  const std::string key = std::string(kBetas) + which;
  check_float(beta, key.c_str(), 0, true, 1);
  // 0.99999999 is below 1 as a double but rounds to 1 in float32, where Adam's bias
  // correction then divides by zero.
  SEQPAR_INPUT_CHECK(static_cast<float>(beta) < 1.0f, "config key ", key, " = ", number(beta),
                     ": must be in [0, 1)", beta < 1 ? " also in float32 (it rounds to 1)" : "");
}

// A probability p with p < 1 also in float32, which the dropout op takes: 0.99999999
// is below 1 as a double but rounds to 1, which keeps nothing and scales by infinity.
void check_drop_probability(double p, const char* key) {
  check_float(p, key, 0, true, 1);
  SEQPAR_INPUT_CHECK(static_cast<float>(p) < 1.0f, "config key ", key, " = ", number(p),
                     ": the drop probability must be in [0, 1)",
                     p < 1 ? " also in float32 (it rounds to 1)" : "");
}

}  // namespace

ScenarioSizes checked_sizes(const ReproConfig& c) {
  ScenarioSizes sizes{};
  sizes.world_size = product(c.sequence_parallel_size, c.data_parallel_size,
                             "the world size ds_config.sequence_parallel_size x ds_config.data_parallel_size");
  sizes.input_rows = product(c.data_parallel_size, c.rows, "the rows ds_config.data_parallel_size x repro.rows");
  sizes.input_values = product(sizes.input_rows, c.in_features,
                               "the inputs ds_config.data_parallel_size x repro.rows x repro.in_features");
  const int64_t weights = product(c.out_features, c.in_features,
                                  "the weight repro.out_features x repro.in_features");
  SEQPAR_INPUT_CHECK(!__builtin_add_overflow(weights, c.out_features, &sizes.parameters),
                     "config: the parameter count overflows a 64-bit integer");
  return sizes;
}

namespace {

// DeepSpeed refuses a train_batch_size other than micro-batch x accumulation x the
// data-parallel size (the world over the sequence-parallel size), and so does this.
void check_train_batch_size(const ReproConfig& c) {
  if (!c.train_batch_size) return;
  int64_t expected = 0;
  const bool fits = !__builtin_mul_overflow(c.train_micro_batch_size_per_gpu,
                                            c.gradient_accumulation_steps, &expected) &&
                    !__builtin_mul_overflow(expected, c.data_parallel_size, &expected);
  SEQPAR_INPUT_CHECK(fits && *c.train_batch_size == expected, "config key ds_config.train_batch_size = ",
                     *c.train_batch_size, ": DeepSpeed requires train_micro_batch_size_per_gpu ",
                     c.train_micro_batch_size_per_gpu, " x gradient_accumulation_steps ",
                     c.gradient_accumulation_steps, " x data_parallel_size ", c.data_parallel_size,
                     fits ? " = " + std::to_string(expected) : std::string(" (overflows)"));
}

}  // namespace

void validate(const ReproConfig& c) {
  check_at_least(c.train_micro_batch_size_per_gpu, 1, "ds_config.train_micro_batch_size_per_gpu");
  check_at_least(c.sequence_parallel_size, 1, "ds_config.sequence_parallel_size");
  check_at_least(c.data_parallel_size, 1, "ds_config.data_parallel_size");
  check_at_least(c.rows, 1, "repro.rows");
  check_at_least(c.in_features, 1, "repro.in_features");
  check_at_least(c.out_features, 1, "repro.out_features");
  check_at_least(c.steps, 1, "repro.steps");
  SEQPAR_INPUT_CHECK(c.steps <= kMaxSteps, "config key repro.steps = ", c.steps,
                     ": must be at most ", kMaxSteps);
  if (scenario_accumulates_gradients(c.scenario)) {
    check_at_least(c.gradient_accumulation_steps, 1, "ds_config.gradient_accumulation_steps");
    SEQPAR_INPUT_CHECK(c.gradient_accumulation_steps <= kMaxGradientAccumulationSteps,
                       "config key ds_config.gradient_accumulation_steps = ",
                       c.gradient_accumulation_steps, ": must be at most ",
                       kMaxGradientAccumulationSteps);
  } else {
    SEQPAR_INPUT_CHECK(c.gradient_accumulation_steps == 1,
                       "config key ds_config.gradient_accumulation_steps = ",
                       c.gradient_accumulation_steps,
                       ": only 1 is supported (the report's value; scenario masked-tokens "
                       "accumulates micro-batches)");
  }
  SEQPAR_INPUT_CHECK(c.zero_stage != 3 || c.scenario == "zero-stage",
                     "config key ds_config.zero_optimization.stage = 3: stage 3 partitions the "
                     "parameters themselves, which scenario ", c.scenario,
                     " does not model; use 0, 1 or 2 (scenario zero-stage runs stage 3's "
                     "reduction)");
  check_train_batch_size(c);
  SEQPAR_INPUT_CHECK(c.optimizer_type == "AdamW", "config key ds_config.optimizer.type = \"",
                     abbreviated(c.optimizer_type), "\": only \"AdamW\" is supported");
  const ScenarioSizes sizes = checked_sizes(c);
  SEQPAR_INPUT_CHECK(sizes.world_size <= kMaxWorldSize,
                     "config: the world size ds_config.sequence_parallel_size x "
                     "ds_config.data_parallel_size = ",
                     c.sequence_parallel_size, " x ", c.data_parallel_size, " = ",
                     sizes.world_size, ": must be at most ", kMaxWorldSize);
  SEQPAR_INPUT_CHECK(c.out_features <= c.in_features, "config key repro.out_features = ",
                     c.out_features, " exceeds repro.in_features = ", c.in_features,
                     ": the target is the first out_features columns of x");
  SEQPAR_INPUT_CHECK(c.rows >= c.sequence_parallel_size, "config key repro.rows = ", c.rows,
                     " is smaller than ds_config.sequence_parallel_size = ",
                     c.sequence_parallel_size,
                     ": every rank of a sequence-parallel group needs at least one row");
  check_float(c.adamw.lr(), kLr, 0, false, kMaxLearningRate);
  check_beta(c.adamw.beta1(), "[0]");
  check_beta(c.adamw.beta2(), "[1]");
  check_float(c.adamw.eps(), kEps, 0, false, kMaxEps);
  check_float(c.adamw.weight_decay(), kWeightDecay, 0, true, kMaxWeightDecay);
  check_float(c.gradient_clipping, kClipping, 0, true, FLT_MAX);  // 0 turns clipping off
  check_drop_probability(c.dropout, "repro.dropout");
  estimated_memory_bytes(c);  // overflow-checks the estimate's products
}

uint64_t estimated_memory_bytes(const ReproConfig& c) {
  const ScenarioSizes sizes = checked_sizes(c);
  const auto u = [](int64_t value) { return static_cast<uint64_t>(value); };
  const uint64_t world = u(sizes.world_size);
  // Per rank: all replicas' inputs, one replica's freshly drawn rows, a shard's
  // activations (counted as a whole replica's), and for each of the three policies a
  // model with its gradient, Adam's two moments and a few flat copies.
  const uint64_t per_rank_values =
      unsigned_sum({u(sizes.input_values), unsigned_product(u(c.rows), u(c.in_features)),
                    unsigned_product(unsigned_product(u(sizes.input_rows), u(c.out_features)), 4),
                    unsigned_product(u(sizes.parameters), 3 * 8)});
  // Rank 0: a host copy of the inputs, the baseline model, and each policy's last
  // step gathered from every rank (parameters and gradients) twice over.
  const uint64_t root_values = unsigned_sum(
      {u(sizes.input_values), unsigned_product(u(sizes.parameters), 8),
       unsigned_product(unsigned_product(u(sizes.parameters), world), 3 * 2 * 2)});
  // Each step's figures, per policy: a few hundred bytes and three floats per rank.
  const uint64_t per_step_bytes = unsigned_sum({512, unsigned_product(world, 3 * 4)});
  return unsigned_sum({unsigned_product(unsigned_sum({unsigned_product(per_rank_values, world),
                                                      root_values}),
                                        sizeof(float)),
                       unsigned_product(unsigned_product(u(c.steps), per_step_bytes), 3)});
}

std::optional<uint64_t> available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string name;
    uint64_t kibibytes = 0;
    if (fields >> name >> kibibytes && name == "MemAvailable:") return kibibytes * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) return uint64_t(pages) * uint64_t(page_size);
  return std::nullopt;
}

void check_memory(const ReproConfig& config, uint64_t available) {
  const uint64_t needed = estimated_memory_bytes(config);
  const auto gib = [](uint64_t bytes) { return double(bytes) / double(1ull << 30); };
  SEQPAR_INPUT_CHECK(needed <= available, "config: this scenario needs about ", gib(needed),
                     " GiB of memory (repro.rows = ", config.rows, ", repro.in_features = ",
                     config.in_features, ", world size ", checked_sizes(config).world_size,
                     ", repro.steps = ", config.steps, "), but ", gib(available),
                     " GiB are available");
}

std::chrono::milliseconds default_collective_timeout(const ReproConfig& config) {
  const ScenarioSizes sizes = checked_sizes(config);
  // Rank 0's reference step and analysis, and every rank's drawing of the data and its
  // share of a step: ranks that are threads share the machine's cores, so a wait can
  // last as long as all of their work together.
  const double world = double(sizes.world_size);
  const double multiply_adds =
      3.0 * double(sizes.input_values) * double(config.out_features) +
      10.0 * world * double(sizes.parameters) +
      world * (10.0 * double(sizes.input_values) +
               3.0 * 3.0 * double(sizes.input_values) / world * double(config.out_features));
  const double seconds = 60 + multiply_adds / 1e7;
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(seconds, 7 * 86400.0) * 1000));
}

}  // namespace seqpar::repro
