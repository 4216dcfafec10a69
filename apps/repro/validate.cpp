#include "apps/repro/validate.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

#include "apps/repro/scenario_list.h"
#include "core/error.h"

namespace seqpar::repro {

namespace {

// Ranks run as threads or processes on one machine; beyond this the per-rank setup
// (threads, pipes, groups) dominates any run and the limits of the system are near.
constexpr int64_t kMaxWorldSize = 1024;

// a x b, or an error naming what the product is.
int64_t product(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  SEQPAR_INPUT_CHECK(!__builtin_mul_overflow(a, b, &result), "config: ", what, " = ", a, " x ", b,
                     " overflows a 64-bit integer");
  return result;
}

// The sizes a run allocates, in doubles (validate() has checked their int64 products).
struct Sizes {
  double world;       // sp x dp
  double inputs;      // dp x rows x in_features: all replicas' inputs, which every rank holds
  double parameters;  // out x in + out
};

Sizes sizes(const ReproConfig& c) {
  return {double(c.sequence_parallel_size) * double(c.data_parallel_size),
          double(c.data_parallel_size) * double(c.rows) * double(c.in_features),
          double(c.out_features) * double(c.in_features) + double(c.out_features)};
}

}  // namespace

void validate(const ReproConfig& c) {
  SEQPAR_INPUT_CHECK(c.gradient_accumulation_steps == 1 || scenario_accumulates_gradients(c.scenario),
                     "config key ds_config.gradient_accumulation_steps = ", c.gradient_accumulation_steps,
                     ": only 1 is supported (the report's value; scenario masked-tokens accumulates micro-batches)");
  SEQPAR_INPUT_CHECK(c.zero_stage != 3 || c.scenario == "zero-stage",
                     "config key ds_config.zero_optimization.stage = 3: stage 3 partitions the parameters "
                     "themselves, which scenario ", c.scenario, " does not model; use 0, 1 or 2 (scenario "
                     "zero-stage runs stage 3's reduction)");
  // DeepSpeed refuses a train_batch_size other than micro-batch x accumulation x the
  // data-parallel size, and so does this.
  int64_t batch = 0;
  const bool fits = !__builtin_mul_overflow(c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps,
                                            &batch) && !__builtin_mul_overflow(batch, c.data_parallel_size, &batch);
  SEQPAR_INPUT_CHECK(!c.train_batch_size || (fits && *c.train_batch_size == batch),
                     "config key ds_config.train_batch_size = ", c.train_batch_size.value_or(0),
                     ": DeepSpeed requires train_micro_batch_size_per_gpu ", c.train_micro_batch_size_per_gpu,
                     " x gradient_accumulation_steps ", c.gradient_accumulation_steps, " x data_parallel_size ",
                     c.data_parallel_size, fits ? " = " + std::to_string(batch) : std::string(" (overflows)"));
  const int64_t world = product(c.sequence_parallel_size, c.data_parallel_size,
                                "the world size ds_config.sequence_parallel_size x ds_config.data_parallel_size");
  const int64_t rows = product(c.data_parallel_size, c.rows, "the rows ds_config.data_parallel_size x repro.rows");
  product(rows, c.in_features, "the inputs ds_config.data_parallel_size x repro.rows x repro.in_features");
  const int64_t weights = product(c.out_features, c.in_features, "the weight repro.out_features x repro.in_features");
  SEQPAR_INPUT_CHECK(weights <= INT64_MAX - c.out_features, "config: the parameter count overflows a 64-bit integer");
  SEQPAR_INPUT_CHECK(world <= kMaxWorldSize, "config: the world size ds_config.sequence_parallel_size x "
                     "ds_config.data_parallel_size = ", c.sequence_parallel_size, " x ", c.data_parallel_size, " = ",
                     world, ": must be at most ", kMaxWorldSize);
  SEQPAR_INPUT_CHECK(c.out_features <= c.in_features, "config key repro.out_features = ", c.out_features,
                     " exceeds repro.in_features = ", c.in_features,
                     ": the target is the first out_features columns of x");
  SEQPAR_INPUT_CHECK(c.rows >= c.sequence_parallel_size, "config key repro.rows = ", c.rows,
                     " is smaller than ds_config.sequence_parallel_size = ", c.sequence_parallel_size,
                     ": every rank of a sequence-parallel group needs at least one row");
  estimated_memory_bytes(c);  // refuses an estimate beyond 2^64
}

uint64_t estimated_memory_bytes(const ReproConfig& c) {
  const auto [world, inputs, parameters] = sizes(c);
  // Per rank: all replicas' inputs, one replica's freshly drawn rows, a shard's
  // activations (counted as all replicas'), and for each of the three policies a model
  // with its gradient, Adam's two moments and a few flat copies.
  const double per_rank = inputs + double(c.rows) * double(c.in_features) +
                          double(c.data_parallel_size) * double(c.rows) * double(c.out_features) * 4 +
                          parameters * 3 * 8;
  // Rank 0: a host copy of the inputs, the baseline model, and each policy's last
  // step gathered from every rank (parameters and gradients) twice over.
  const double root = inputs + parameters * 8 + parameters * world * 3 * 2 * 2;
  // Each step's figures, per policy: a few hundred bytes and three floats per rank.
  const double bytes = (per_rank * world + root) * sizeof(float) + double(c.steps) * (512 + world * 3 * 4) * 3;
  SEQPAR_INPUT_CHECK(bytes < 0x1p64, "config: the memory estimate overflows a 64-bit integer");
  return static_cast<uint64_t>(bytes);
}

std::optional<uint64_t> available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t kibibytes = 0;
  while (meminfo >> name >> kibibytes) {  // "MemAvailable:   123456 kB"
    if (name == "MemAvailable:") return kibibytes * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) return uint64_t(pages) * uint64_t(page_size);
  return std::nullopt;
}

void check_memory(const ReproConfig& c, uint64_t available) {
  const uint64_t needed = estimated_memory_bytes(c);
  const auto gib = [](uint64_t bytes) { return double(bytes) / double(1ull << 30); };
  SEQPAR_INPUT_CHECK(needed <= available, "config: this scenario needs about ", gib(needed),
                     " GiB of memory (repro.rows = ", c.rows, ", repro.in_features = ", c.in_features,
                     ", world size ", c.world_size(), ", repro.steps = ", c.steps, "), but ", gib(available),
                     " GiB are available");
}

std::chrono::milliseconds default_collective_timeout(const ReproConfig& c) {
  const auto [world, inputs, parameters] = sizes(c);
  const double out = double(c.out_features);
  const double multiply_adds = 3.0 * inputs * out + 10.0 * world * parameters +
                               world * (10.0 * inputs + 3.0 * 3.0 * inputs / world * out);
  const double seconds = std::min(60 + multiply_adds / 1e7, 7 * 86400.0);  // at most a week
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace seqpar::repro
