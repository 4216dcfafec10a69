#include "apps/repro/ulysses.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include "apps/repro/sequence_kit.h"
#include "apps/repro/ulysses_mask.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/attention.h"
#include "nn/l1_loss.h"
#include "nn/ulysses_block.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace seqpar::repro {

void check_ulysses_config(const ReproConfig& c) {
  SEQPAR_INPUT_CHECK(c.out_features == c.in_features, "config key repro.out_features = ", c.out_features,
                     ": the ulysses block maps d_model = repro.in_features (", c.in_features,
                     ") to itself; set both to the same value");
  SEQPAR_INPUT_CHECK(c.heads >= 1 && c.head_dim >= 2 && c.head_dim % 2 == 0 && c.head_dim <= 128,
                     "config keys repro.heads = ", c.heads, ", repro.head_dim = ", c.head_dim,
                     ": need at least one head, and an even head_dim of at most 128 (RoPE rotates pairs)");
  SEQPAR_INPUT_CHECK(c.heads % c.sequence_parallel_size == 0, "config key repro.heads = ", c.heads,
                     ": Ulysses splits the heads over ds_config.sequence_parallel_size = ",
                     c.sequence_parallel_size, " ranks; H must be a multiple of sp (the report shows "
                     "the layer's refusal of an uneven split)");
  SEQPAR_INPUT_CHECK(c.rows % c.sequence_parallel_size == 0 && c.rows <= 8192, "config key repro.rows = ",
                     c.rows, ": the sequence length S must be a multiple of sp = ", c.sequence_parallel_size,
                     " (each rank holds S/sp tokens) and at most 8192");
  SEQPAR_INPUT_CHECK(c.in_features <= 4096 && c.heads * c.head_dim <= 4096, "config keys repro.in_features = ",
                     c.in_features, ", heads x head_dim = ", c.heads * c.head_dim, ": at most 4096 each");
}

namespace {

const std::vector<UlyssesVariant> kVariants = {
    {"correct", "correct Ulysses", UlyssesMistake::None, UlyssesSync::RoundedPartials},
    {"exact", "exact", UlyssesMistake::None, UlyssesSync::Exact},
    {"no-all-to-all", "no all-to-all", UlyssesMistake::NoAllToAll, UlyssesSync::Exact},
    {"local-positions", "local positions", UlyssesMistake::LocalPositions, UlyssesSync::Exact},
    {"local-mask", "local causal mask", UlyssesMistake::LocalMask, UlyssesSync::Exact},
    {"issue-6868", "#6868 (deepspeed-0.16)", UlyssesMistake::None, UlyssesSync::DeepSpeed016},
};

nn::UlyssesBlockOptions block_options(const ReproConfig& c) {
  nn::UlyssesBlockOptions options;
  options.model_dim = c.in_features;
  options.heads = c.heads;
  options.head_dim = c.head_dim;
  return options;
}

// The block of `variant` as this rank builds it: the mistakes are explicit options.
nn::UlyssesBlockOptions variant_options(const ReproConfig& c, UlyssesMistake mistake) {
  nn::UlyssesBlockOptions options = block_options(c);
  options.shard_local_positions = mistake == UlyssesMistake::LocalPositions;
  options.exchange = mistake != UlyssesMistake::NoAllToAll;
  if (mistake == UlyssesMistake::LocalMask) {
    const int64_t shard = c.rows / c.sequence_parallel_size;
    const nn::AttentionMask mask = nn::AttentionMask::causal().at_positions(shard_local_positions(c.rows, shard));
    options.attention = [mask](const autograd::Variable& q, const autograd::Variable& k,
                               const autograd::Variable& v) {
      return nn::scaled_dot_product_attention(q, k, v, mask);
    };
  }
  return options;
}

struct Data {
  Tensor inputs, targets;  // [dp * S, d_model]
};

// Where this rank's rows are, and the group its block exchanges over (one rank: all).
struct Seat {
  std::shared_ptr<nn::SequenceGroup> group;
  std::vector<int64_t> first_rows;  // one per sequence this rank holds
  int64_t rows = 0;
};

// Combines the ranks' gradients as `sync` says, then clips.
void synchronize(UlyssesSync sync, const Parameters& parameters, nn::ExactGradients& exact,
                 const RankGroups* groups, double clipping) {
  if (sync == UlyssesSync::Exact) {
    if (groups != nullptr) {
      for (exact::ExactSums* sums : exact.sums()) groups->sequence_data_parallel->all_reduce_sums(*sums);
    }
    exact.round_into_grads();
  } else if (groups != nullptr) {
    // RoundedPartials: the ranks' rounded gradients over sp x dp; DeepSpeed 0.16: over dp alone, x sp/dp.
    dist::ProcessGroup& group =
        sync == UlyssesSync::RoundedPartials ? *groups->sequence_data_parallel : *groups->data_parallel;
    for (const autograd::Variable& parameter : parameters) {
      Tensor gradient = parameter.grad();
      group.all_reduce(gradient, dist::ReduceOp::Sum);
      if (sync == UlyssesSync::DeepSpeed016) mul_(gradient, float(groups->sp) / float(groups->dp));
    }
  }
  Tensor norm = optim::grad_norm(parameters);
  if (sync == UlyssesSync::DeepSpeed016 && groups != nullptr) {
    groups->data_parallel->all_reduce(norm, dist::ReduceOp::Avg);
  }
  if (clipping > 0) optim::clip_grads_with_norm(parameters, clipping, norm);
}

// Where `groups` puts this rank's rows (one rank: every sequence whole).
Seat seat_of(const ReproConfig& c, const RankGroups* groups) {
  Seat seat{nn::single_rank_group(), {}, c.rows};
  if (groups == nullptr) {
    for (int64_t b = 0; b < c.data_parallel_size; ++b) seat.first_rows.push_back(b * c.rows);
  } else {
    seat.group = nn::sequence_group(groups->sequence_parallel);
    seat.rows = c.rows / groups->sp;
    seat.first_rows = {groups->dp_rank * c.rows + groups->sp_rank * seat.rows};
  }
  return seat;
}

// One step's forward, loss and backward on this rank's rows: its attention and output rows.
struct StepRows {
  std::vector<Tensor> attentions, outputs;
};
StepRows forward_backward(const nn::UlyssesBlock& block, const Seat& seat, const Data& data,
                          nn::Reduction reduction, Device device, StepContext& context) {
  StepRows rows;
  for (const int64_t first : seat.first_rows) {
    autograd::Variable attention;
    const autograd::Variable y =
        block.forward(autograd::Variable(data.inputs.narrow(0, first, seat.rows).to(device)), &attention);
    const autograd::Variable target(data.targets.narrow(0, first, seat.rows).to(device));
    context.backward(nn::l1_loss(y, target, reduction));
    rows.attentions.push_back(attention.data().to(Device::cpu()));
    rows.outputs.push_back(y.data().to(Device::cpu()));
  }
  return rows;
}

// Adds a finished step to `trace`: the loss over every rank's rows, the first step's
// tensors, rank 0's parameters and how far the other ranks' are from them.
void record_step(UlyssesTrace& trace, const StepRows& rows, const Parameters& parameters, const Data& data,
                 const RankGroups* groups) {
  dist::ProcessGroup* world = groups == nullptr ? nullptr : groups->world.get();
  const Tensor y = gathered_rows(stacked_rows(rows.outputs), world);
  const std::vector<float> outputs = y.to_vector(), targets = data.targets.to_vector();
  double loss = 0;
  for (size_t i = 0; i < outputs.size(); ++i) loss += std::fabs(double(outputs[i]) - double(targets[i]));
  trace.losses.push_back(loss / double(outputs.size()));
  if (trace.parameters.empty()) {
    trace.first_output = y;
    trace.first_attention = gathered_rows(stacked_rows(rows.attentions), world);
  }
  std::vector<float> mine = flat_values(parameters, false);
  trace.rank_spread.push_back(rank_spread(mine, world));
  trace.parameters.push_back(std::move(mine));
}

// Trains `variant` (the baseline when groups == nullptr) for config.steps steps.
UlyssesTrace train(const UlyssesVariant& variant, const ReproConfig& c, const Data& data,
                   const RankGroups* groups, Device device) {
  const Seat seat = seat_of(c, groups);
  Generator generator(c.seed + 2);  // the same initial block on every rank
  const nn::UlyssesBlock block(variant_options(c, variant.mistake), seat.group, generator, device);
  const Parameters parameters = block.parameters();
  optim::AdamW optimizer(parameters, c.adamw);
  // The exact and float syncs: each rank's share of the global mean. DeepSpeed 0.16's
  // script: the mean over the rank's own rows.
  const nn::Reduction reduction = nn::Reduction::sum_divided_by(
      (variant.sync == UlyssesSync::DeepSpeed016 ? seat.rows : c.data_parallel_size * c.rows) * c.in_features);
  UlyssesTrace trace;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < c.steps; ++step) {
    optimizer.zero_grad();
    nn::ExactGradients exact;
    StepContext context(step, variant.sync == UlyssesSync::Exact ? &exact : nullptr);
    const StepRows rows = forward_backward(block, seat, data, reduction, device, context);
    synchronize(variant.sync, parameters, exact, groups, c.gradient_clipping);
    optimizer.step();
    record_step(trace, rows, parameters, data, groups);
  }
  trace.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return trace;
}

// The layer's refusal of H + 1 heads over sp ranks, on every rank, before any exchange.
std::string uneven_heads_refusal(const ReproConfig& c, const RankGroups& groups, Device device) {
  nn::UlyssesBlockOptions options = block_options(c);
  options.heads = c.heads + 1;
  Generator generator(c.seed);
  const nn::UlyssesBlock block(options, nn::sequence_group(groups.sequence_parallel), generator, device);
  try {
    block.forward(autograd::Variable(Tensor::zeros({2, c.in_features}, device)));
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";  // accepted: decide_ulysses names that a failure
}

// Without the all-to-all, token i of shard r > 0 cannot see keys 0..r*S/P-1. The mass
// one-rank attention puts on them (first sequence, mean over heads and the shard's
// tokens) is what each token loses; softmax spreads it over the keys it still sees.
std::vector<double> attention_mass_lost(const ReproConfig& c, Device device, const Data& data) {
  Tensor q, k;
  nn::UlyssesBlockOptions options = block_options(c);
  options.attention = [&](const autograd::Variable& qv, const autograd::Variable& kv,
                          const autograd::Variable& vv) {
    q = qv.data().to(Device::cpu());
    k = kv.data().to(Device::cpu());
    return nn::scaled_dot_product_attention(qv, kv, vv, true);
  };
  Generator generator(c.seed + 2);
  const nn::UlyssesBlock block(options, nn::single_rank_group(), generator, device);
  block.forward(autograd::Variable(data.inputs.narrow(0, 0, c.rows).to(device)));
  const int64_t tokens = c.rows, heads = c.heads, dim = c.head_dim, shard = c.rows / c.sequence_parallel_size;
  const double scale = nn::attention_scale(dim);
  const std::vector<float> qs = q.contiguous().to_vector(), ks = k.contiguous().to_vector();
  std::vector<double> lost(size_t(c.sequence_parallel_size), 0.0);
  std::vector<double> score(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = shard; i < tokens; ++i) {
      double max = -INFINITY, total = 0, outside = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t d = 0; d < dim; ++d) {
          s += double(qs[size_t((i * heads + h) * dim + d)]) * ks[size_t((j * heads + h) * dim + d)];
        }
        score[size_t(j)] = scale * s;
        max = std::fmax(max, score[size_t(j)]);
      }
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(score[size_t(j)] - max);
        total += p;
        if (j < (i / shard) * shard) outside += p;
      }
      lost[size_t(i / shard)] += outside / total / double(heads * shard);
    }
  }
  return lost;
}

NamedTensors trace_tensors(const UlyssesTrace& trace) {
  return {{"attention", trace.first_attention}, {"output", trace.first_output}};
}

class UlyssesScenario : public Scenario {
 public:
  void check(const ReproConfig& config, const Request& request) const override {
    check_takes_no_policy_or_plot("ulysses", request);
    check_ulysses_config(config);
  }

  std::optional<Results> run(const RankGroups& groups, const ReproConfig& config, const Request& request,
                             const Placement& placement, Progress*) const override {
    UlyssesResults results = run_ulysses(groups, config, placement.device, placement.description);
    if (groups.world->rank() != 0) return std::nullopt;
    decide_ulysses(results);
    DumpTensors dump;
    if (request.dump) {
      DumpTensors variants;
      for (const UlyssesFigures& f : results.variants) variants.push_back({f.variant.key, trace_tensors(f.trace)});
      dump = variant_dump(results.inputs, trace_tensors(results.baseline), variants);
    }
    return scenario_results(ulysses_text(results), ulysses_json(results), std::move(dump));
  }
};

}  // namespace

UlyssesResults run_ulysses(const RankGroups& groups, const ReproConfig& c, Device device,
                           const std::string& placement) {
  const int64_t rows = c.data_parallel_size * c.rows;
  const Data data{Generator(c.seed).randn({rows, c.in_features}), Generator(c.seed + 1).randn({rows, c.in_features})};
  UlyssesResults results;
  const bool first = groups.world->rank() == 0;
  if (first) {
    const UlyssesVariant baseline{"baseline", "one rank", UlyssesMistake::None, UlyssesSync::Exact};
    results.baseline = train(baseline, c, data, nullptr, device);
    results.mass_lost_by_shard = attention_mass_lost(c, device, data);
  }
  for (const UlyssesVariant& variant : kVariants) {
    UlyssesTrace trace = train(variant, c, data, &groups, device);
    if (first) results.variants.push_back({variant, std::move(trace), {}, 0, 0, 0, 0, "", false});
  }
  if (c.sequence_parallel_size > 1) {
    results.uneven_heads_case =
        "H = " + std::to_string(c.heads + 1) + ", sp = " + std::to_string(c.sequence_parallel_size);
    results.uneven_heads_message = uneven_heads_refusal(c, groups, device);
  }
  if (!first) return {};
  results.config = c;
  add_sequence_ignored(results.config, "the ulysses block");
  results.placement = placement;
  results.inputs = {{"x", data.inputs}, {"target", data.targets}};
  Generator generator(c.seed + 2);
  const nn::UlyssesBlock block(block_options(c), nn::single_rank_group(), generator);
  for (const auto& [name, parameter] : block.named_parameters()) results.inputs.push_back({name, parameter.data()});
  return results;
}

const Scenario& ulysses_scenario() {
  static const UlyssesScenario scenario;
  return scenario;
}

}  // namespace seqpar::repro
