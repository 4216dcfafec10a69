#include "apps/repro/sequence_kit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "apps/common/text.h"

namespace seqpar::repro {

Tensor gathered_rows(const Tensor& local, dist::ProcessGroup* world) {
  if (world == nullptr) return local.clone();
  Tensor all = Tensor::empty({local.size(0) * world->size(), local.size(1)}, local.device());
  world->all_gather(all, local.contiguous());
  return all;
}

Tensor stacked_rows(const std::vector<Tensor>& parts) {
  std::vector<float> values;
  for (const Tensor& part : parts) {
    const std::vector<float> own = part.to_vector();
    values.insert(values.end(), own.begin(), own.end());
  }
  return Tensor::from_data({int64_t(values.size()) / parts.front().size(1), parts.front().size(1)}, values);
}

double rank_spread(const std::vector<float>& mine, dist::ProcessGroup* world) {
  const Tensor own = Tensor::from_data({1, int64_t(mine.size())}, mine);
  const std::vector<float> all = gathered_rows(own, world).to_vector();
  double spread = 0;
  for (size_t i = 0; i < all.size(); ++i) spread = std::fmax(spread, std::fabs(all[i] - mine[i % mine.size()]));
  return spread;
}

bool ranks_agree(const std::vector<double>& rank_spread_by_step) {
  return std::all_of(rank_spread_by_step.begin(), rank_spread_by_step.end(), [](double d) { return d == 0; });
}

ParameterComparison compare_parameters(const std::vector<std::vector<float>>& run,
                                       const std::vector<std::vector<float>>& baseline) {
  ParameterComparison c;
  const std::vector<float>& p = run.back();
  const std::vector<float>& p0 = baseline.back();
  for (size_t i = 0; i < p.size(); ++i) {
    c.differing += std::memcmp(&p[i], &p0[i], sizeof(float)) != 0;
    c.max_difference = std::fmax(c.max_difference, std::fabs(double(p[i]) - double(p0[i])));
  }
  for (size_t s = 0; s < run.size() && c.diverged_at_step == 0; ++s) {
    if (std::memcmp(run[s].data(), baseline[s].data(), p.size() * sizeof(float)) != 0) {
      c.diverged_at_step = int64_t(s) + 1;
    }
  }
  return c;
}

DumpTensors variant_dump(NamedTensors inputs, NamedTensors reference, const DumpTensors& variants) {
  DumpTensors dump = {{"inputs.safetensors", std::move(inputs)}, {"reference.safetensors", std::move(reference)}};
  for (const auto& [key, tensors] : variants) dump.push_back({key + ".safetensors", tensors});
  return dump;
}

std::string shard_figures(const std::vector<double>& values) {
  std::string text;
  for (size_t r = 0; r < values.size(); ++r) text += (r ? ", " : "") + number_text(values[r]);
  return "[" + text + "]";
}

int64_t all_to_all_bytes(int64_t tokens, int64_t heads, int64_t dim, int64_t ranks) {
  return tokens * heads * dim * 4 * (ranks - 1) / ranks;
}

int64_t all_gather_bytes(int64_t elements, int64_t ranks) { return elements * 4 * (ranks - 1); }

void add_sequence_ignored(ReproConfig& c, const std::string& block) {
  // The keys the config reader accepts for the other scenarios that these blocks never
  // read: listed, as the scenario lists its own, so none passes silently.
  // (ds_config.train_micro_batch_size_per_gpu is listed by the reader for every scenario.)
  const auto shown = [](double value) { return shortest_float_text(value); };
  c.ignored.push_back({"repro.dropout = " + shown(c.dropout), "the dropout scenario's; " + block + " has no dropout"});
  c.ignored.push_back({"ds_config.gradient_accumulation_steps = " + std::to_string(c.gradient_accumulation_steps),
                       "one micro-batch (each replica's repro.rows tokens) per step; checked against train_batch_size"});
  if (c.train_batch_size) {
    c.ignored.push_back({"ds_config.train_batch_size = " + std::to_string(*c.train_batch_size),
                         "checked as DeepSpeed checks it; the block takes each replica's repro.rows tokens"});
  }
}

}  // namespace seqpar::repro
