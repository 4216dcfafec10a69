#include "apps/repro/context_parallel.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>

#include "apps/repro/sequence_kit.h"
#include "autograd/node.h"
#include "autograd/reshape.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/mesh.h"
#include "nn/l1_loss.h"
#include "nn/attention_projections.h"
#include "nn/sequence_parallel_attention.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace seqpar::repro {

using autograd::Variable;
using nn::ContextParallelLayout;

void check_context_parallel_config(const ReproConfig& c) {
  const int64_t sp = c.sequence_parallel_size;
  SEQPAR_INPUT_CHECK(c.out_features == c.in_features, "config key repro.out_features = ", c.out_features,
                     ": the block maps d_model = repro.in_features (", c.in_features,
                     ") to itself; set both to the same value");
  SEQPAR_INPUT_CHECK(c.heads >= 1 && c.head_dim >= 2 && c.head_dim % 2 == 0 && c.head_dim <= 128,
                     "config keys repro.heads = ", c.heads, ", repro.head_dim = ", c.head_dim,
                     ": need at least one head, and an even head_dim of at most 128 (RoPE rotates pairs)");
  SEQPAR_INPUT_CHECK(sp >= 2, "config key ds_config.sequence_parallel_size = ", sp,
                     ": context parallelism needs at least 2 ranks to split a sequence over");
  SEQPAR_INPUT_CHECK(c.data_parallel_size == 1, "config key ds_config.data_parallel_size = ", c.data_parallel_size,
                     ": the context-parallel scenario trains one sequence over sp ranks (dp 1)");
  SEQPAR_INPUT_CHECK(c.rows % (2 * sp) == 0 && c.rows <= 4096, "config key repro.rows = ", c.rows,
                     ": the sequence length S must be a multiple of 2 x sp = ", 2 * sp,
                     " (zigzag cuts it into 2 x sp chunks) and at most 4096");
  SEQPAR_INPUT_CHECK(c.in_features <= 1024 && c.heads * c.head_dim <= 1024, "config keys repro.in_features = ",
                     c.in_features, ", heads x head_dim = ", c.heads * c.head_dim, ": at most 1024 each");
}

int64_t usp_ulysses_degree(int64_t heads, int64_t sp) {
  for (int64_t u = sp / 2; u > 1; --u) {
    if (sp % u == 0 && heads % u == 0) return u;
  }
  return 1;
}

namespace {

const std::vector<CpVariant> kVariants = {
    {"contiguous", "exact CP, contiguous", CpSchedule::Contiguous},
    {"zigzag", "exact CP, zigzag", CpSchedule::Zigzag},
    {"usp", "USP (ulysses x cp)", CpSchedule::Usp},
    {"ring", "online-softmax ring", CpSchedule::Ring},
    {"stale-kv", "stale K/V in the ring's backward", CpSchedule::StaleKv},
    {"dkv-not-reduced", "dK, dV not reduced across CP", CpSchedule::DkvNotReduced},
    {"loss-per-rank", "loss normalized per rank", CpSchedule::LossPerRank},
    {"unpermuted-positions", "positions not following the zigzag", CpSchedule::Unpermuted},
    {"head-wall", "Ulysses past the head wall", CpSchedule::HeadWall},
};

using Attend = std::function<Variable(const Variable&, const Variable&, const Variable&)>;

// A classic ring over the cp group, written in the app from nn's block calls: rank r
// visits the K/V blocks r, r-1, ... (as they arrive), attends its queries to each, and
// merges the partial softmaxes by their log-sum-exp in float, in that order. The
// backward runs the blocks again against the merged m and l, adds dq over the blocks,
// and sends each block's dK/dV partial to its owner, who adds them in float. (Gathered
// at once here: the sums are the ring's; only the overlap is not modelled.)
struct RingAttention : autograd::Node {
  std::shared_ptr<dist::ProcessGroup> group;
  CpSchedule schedule = CpSchedule::Ring;
  std::vector<std::vector<int64_t>> positions;  // every rank's, in its order
  Tensor q, keys, values;                       // q [1, s, H, D]; keys, values [C, s·H·D]
  nn::AttentionForward merged;

  int rank() const { return group->rank(); }
  int ranks() const { return group->size(); }
  Tensor block(const Tensor& all, int b) const { return all.narrow(0, b, 1).view(q.shape()); }
  nn::AttentionMask mask(int b) const {
    return nn::AttentionMask::causal().at_positions(positions[size_t(rank())], positions[size_t(b)]);
  }

  Variable forward(const Variable& qv, const Variable& kv, const Variable& vv) {
    q = qv.data().contiguous().view({1, qv.shape()[0], qv.shape()[1], qv.shape()[2]});
    const int64_t n = q.numel();
    keys = Tensor::empty({ranks(), n}, q.device());
    values = Tensor::empty({ranks(), n}, q.device());
    group->all_gather(keys, kv.data().contiguous().view({1, n}));
    group->all_gather(values, vv.data().contiguous().view({1, n}));
    const int64_t s = q.size(1), heads = q.size(2), dim = q.size(3);
    std::vector<float> o, m, l;
    for (int j = 0; j < ranks(); ++j) {
      const int b = (rank() - j + ranks()) % ranks();
      const nn::AttentionForward f = nn::attention_forward(q, block(keys, b), block(values, b), mask(b));
      const std::vector<float> ob = f.out.to_vector(), mb = f.row_max.to_vector(), lb = f.row_sum.to_vector();
      if (j == 0) {
        o = ob, m = mb, l = lb;
        continue;
      }
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t t = 0; t < s; ++t) {
          const size_t row = size_t(h * s + t);
          if (std::isinf(mb[row])) continue;  // the block hides every key from this row
          const float top = std::isinf(m[row]) ? mb[row] : std::fmax(m[row], mb[row]);
          const float a = std::isinf(m[row]) ? 0.0f : l[row] * std::exp(m[row] - top);
          const float w = lb[row] * std::exp(mb[row] - top), total = a + w;
          for (int64_t d = 0; d < dim; ++d) {
            float& value = o[size_t((t * heads + h) * dim + d)];
            value = (value * a + ob[size_t((t * heads + h) * dim + d)] * w) / total;
          }
          m[row] = top, l[row] = total;
        }
      }
    }
    merged = {Tensor::from_data(q.shape(), o).to(q.device()), Tensor::from_data({1, heads, s}, m).to(q.device()),
              Tensor::from_data({1, heads, s}, l).to(q.device())};
    Tensor out = merged.out.view(qv.shape());
    add_input(qv);
    add_input(kv);
    add_input(vv);
    return Variable::from_op(std::move(out), shared_from_this());
  }

  std::vector<Tensor> apply(const Tensor& grad_output) override {
    const Tensor g = grad_output.contiguous().view(q.shape());
    const int64_t n = q.numel();
    std::vector<float> dq(size_t(n), 0.0f);
    Tensor dk_parts = Tensor::empty({ranks(), n}, q.device()), dv_parts = Tensor::empty({ranks(), n}, q.device());
    for (int j = 0; j < ranks(); ++j) {
      const int b = (rank() - j + ranks()) % ranks();
      // The forward's ring left rank r+1's block in the buffer; a backward that restarts
      // from it without re-sending its own pairs block b's positions with block b+1's K/V.
      const int held = schedule == CpSchedule::StaleKv ? (b + 1) % ranks() : b;
      const Tensor k = block(keys, held), v = block(values, held);
      const std::vector<float> part = nn::attention_backward_queries(g, q, k, v, merged, mask(b)).to_vector();
      for (size_t i = 0; i < part.size(); ++i) dq[i] += part[i];
      const nn::AttentionKeyGrads kv = nn::attention_backward_keys(g, q, k, v, merged, mask(b));
      dk_parts.narrow(0, b, 1).copy_(kv.k.view({1, n}));
      dv_parts.narrow(0, b, 1).copy_(kv.v.view({1, n}));
    }
    const Shape shape = {q.size(1), q.size(2), q.size(3)};
    return {Tensor::from_data(shape, dq).to(q.device()), reduced(dk_parts).view(shape), reduced(dv_parts).view(shape)};
  }

  // This rank's keys' gradient: every rank's partial for them, added in ring order; or,
  // the mistake, its own queries' partial alone.
  Tensor reduced(const Tensor& parts) const {
    if (schedule == CpSchedule::DkvNotReduced) return parts.narrow(0, rank(), 1).clone();
    Tensor received = Tensor::empty(parts.shape(), parts.device());
    group->all_to_all(received, parts);
    const std::vector<float> all = received.to_vector();
    const size_t n = all.size() / size_t(ranks());
    std::vector<float> sum(all.begin() + long(size_t(rank()) * n), all.begin() + long(size_t(rank() + 1) * n));
    for (int j = 1; j < ranks(); ++j) {
      const size_t from = size_t((rank() + j) % ranks()) * n;
      for (size_t i = 0; i < n; ++i) sum[i] += all[from + i];
    }
    return Tensor::from_data({1, int64_t(n)}, sum).to(parts.device());
  }

  std::string name() const override { return "RingAttentionBackward"; }
};

// The same initial block on every rank and for the baseline: the library's projections
// (q, k, v, output and RoPE) around each variant's attention, drawn as LongContextBlock's.
struct Block : nn::Module {
  nn::AttentionProjections projections;
  Block(const ReproConfig& c, Device device) : Block(c, Generator(c.seed + 2), device) {}

 private:
  Block(const ReproConfig& c, Generator generator, Device device)
      : projections("the context-parallel block", {c.in_features, c.heads, c.heads, c.head_dim}, generator, device) {
    for (const auto& [name, module] : projections.modules()) register_module(name, module);
  }
};

// Where this rank sits in a variant: its tokens' positions, RoPE's positions, and attention.
struct Seat {
  std::vector<int64_t> positions, rope_positions;
  Attend attend;
};

struct UspGroups {
  std::shared_ptr<nn::SequenceGroup> ulysses, cp;
};

Seat seat_of(CpSchedule schedule, const ReproConfig& c, const RankGroups* groups, const UspGroups& usp) {
  Seat seat;
  const int64_t s = groups == nullptr ? c.rows : c.rows / groups->sp;
  const bool ring = schedule == CpSchedule::Ring || schedule == CpSchedule::StaleKv ||
                    schedule == CpSchedule::DkvNotReduced;
  if (ring) {
    const int sp = int(groups->sp);
    std::vector<std::vector<int64_t>> positions;
    for (int r = 0; r < sp; ++r) {
      positions.push_back(nn::context_parallel_positions(c.rows, sp, r, ContextParallelLayout::Zigzag));
    }
    seat.positions = seat.rope_positions = positions[size_t(groups->sp_rank)];
    const std::shared_ptr<dist::ProcessGroup> group = groups->sequence_parallel;
    seat.attend = [group, schedule, positions](const Variable& q, const Variable& k, const Variable& v) {
      auto node = std::make_shared<RingAttention>();
      node->group = group;
      node->schedule = schedule;
      node->positions = positions;
      const Variable out = node->forward(q, k, v);
      return autograd::reshape(out, {q.shape()[0], q.shape()[1] * q.shape()[2]});
    };
    return seat;
  }
  std::shared_ptr<nn::SequenceGroup> ulysses = nn::single_rank_group(), cp = nn::single_rank_group();
  if (groups != nullptr && (schedule == CpSchedule::Usp || schedule == CpSchedule::HeadWall)) {
    ulysses = usp.ulysses, cp = usp.cp;
  } else if (groups != nullptr) {
    cp = nn::sequence_group(groups->sequence_parallel);
  }
  const ContextParallelLayout layout =
      schedule == CpSchedule::Contiguous ? ContextParallelLayout::Contiguous : ContextParallelLayout::Zigzag;
  const auto library = std::make_shared<nn::SequenceParallelAttention>(
      ulysses, cp, nn::SequenceParallelOptions{nn::AttentionMask::causal(), layout, {}});
  seat.positions = library->positions(s);
  seat.rope_positions = seat.positions;
  if (schedule == CpSchedule::Unpermuted) {  // numbered as if the shards were contiguous
    std::iota(seat.rope_positions.begin(), seat.rope_positions.end(), (groups ? groups->sp_rank : 0) * s);
  }
  seat.attend = [library](const Variable& q, const Variable& k, const Variable& v) {
    return library->forward(q, k, v);
  };
  return seat;
}

// The rows of `all` at `positions`, in that order.
Tensor rows_at(const Tensor& all, const std::vector<int64_t>& positions) {
  const int64_t width = all.size(1);
  const std::vector<float> values = all.to_vector();
  std::vector<float> rows;
  for (const int64_t p : positions) rows.insert(rows.end(), values.begin() + p * width, values.begin() + (p + 1) * width);
  return Tensor::from_data({int64_t(positions.size()), width}, rows);
}

struct Data {
  Tensor inputs, targets;  // [S, d_model]
};

Variable block_forward(const Block& b, const Seat& seat, const Variable& x) {
  return b.projections.forward(
      x, [&](int64_t) { return seat.rope_positions; }, 10000.0f, seat.attend);
}

// Trains `variant` (the baseline when groups == nullptr) for config.steps steps.
CpTrace train(CpSchedule schedule, const ReproConfig& c, const Data& data, const RankGroups* groups,
              const UspGroups& usp, Device device) {
  const Seat seat = seat_of(schedule, c, groups, usp);
  const int64_t s = int64_t(seat.positions.size());
  const Block block(c, device);
  const Parameters parameters = block.parameters();
  optim::AdamW optimizer(parameters, c.adamw);
  // The global mean is each rank's sum over S·d; the mistake divides by its own s·d.
  const int64_t count = (schedule == CpSchedule::LossPerRank ? s : c.rows) * c.in_features;
  const nn::Reduction reduction = nn::Reduction::sum_divided_by(count);
  dist::ProcessGroup* world = groups == nullptr ? nullptr : groups->world.get();
  std::vector<float> positions(seat.positions.begin(), seat.positions.end());
  const std::vector<float> where =
      gathered_rows(Tensor::from_data({1, int64_t(positions.size())}, positions), world).to_vector();
  const Variable x(rows_at(data.inputs, seat.positions).to(device));
  const Tensor target = rows_at(data.targets, seat.positions);
  CpTrace trace;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < c.steps; ++step) {
    optimizer.zero_grad();
    nn::ExactGradients exact;
    StepContext context(step, &exact);
    const Variable y = block_forward(block, seat, x);
    context.backward(nn::l1_loss(y, Variable(target.to(device)), reduction));
    if (groups != nullptr) {
      for (exact::ExactSums* sums : exact.sums()) groups->sequence_parallel->all_reduce_sums(*sums);
    }
    exact.round_into_grads();
    if (step == 0) trace.first_gradients = flat_values(parameters, true);
    const Tensor norm = optim::grad_norm(parameters);
    if (c.gradient_clipping > 0) optim::clip_grads_with_norm(parameters, c.gradient_clipping, norm);
    optimizer.step();
    // Every rank's rows, put back in position order; the loss as the run reports it
    // (each rank's share over S·d, or its own mean, summed over the ranks).
    const std::vector<float> rows = gathered_rows(y.data().to(Device::cpu()), world).to_vector();
    const std::vector<float> targets = data.targets.to_vector();
    std::vector<float> ordered(rows.size());
    double loss = 0;
    for (size_t r = 0; r < where.size(); ++r) {
      const size_t p = size_t(where[r]), d = size_t(c.in_features);
      std::copy(rows.begin() + long(r * d), rows.begin() + long((r + 1) * d), ordered.begin() + long(p * d));
      for (size_t i = 0; i < d; ++i) loss += std::fabs(double(rows[r * d + i]) - double(targets[p * d + i]));
    }
    trace.losses.push_back(loss / double(count));
    if (step == 0) trace.first_output = Tensor::from_data({c.rows, c.in_features}, ordered);
    std::vector<float> mine = flat_values(parameters, false);
    trace.rank_spread.push_back(rank_spread(mine, world));
    trace.parameters.push_back(std::move(mine));
  }
  trace.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return trace;
}

// Ulysses over every sp rank: past the head wall (sp does not divide Hq) the layer
// refuses, on every rank, before any exchange.
std::string head_wall_refusal(const ReproConfig& c, const RankGroups& groups, Device device) {
  const nn::UlyssesAttention ulysses(nn::sequence_group(groups.sequence_parallel));
  const Variable q(Tensor::zeros({c.rows / groups.sp, c.heads, c.head_dim}, device));
  try {
    ulysses.forward(q, q, q);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

// USP's two levels as a user builds them: dist::Mesh(world, ulysses U, cp C, dp 1) (a
// level of degree 1 has no group; its layer takes the single-rank group).
UspGroups usp_groups(const RankGroups& groups, int64_t u) {
  const dist::Mesh mesh(int(groups.sp), int(u), int(groups.sp / u), 1);
  const dist::MeshGroups built = dist::build_mesh_groups(mesh, *groups.world);
  const auto level = [](const std::shared_ptr<dist::ProcessGroup>& group) {
    return group ? nn::sequence_group(group) : nn::single_rank_group();
  };
  return {level(built.ulysses_group), level(built.cp_group)};
}

NamedTensors trace_tensors(const CpTrace& trace, const Block& names) {
  NamedTensors tensors = {{"output", trace.first_output}};
  size_t at = 0;
  for (const auto& [name, parameter] : names.named_parameters()) {
    const Tensor& p = parameter.data();
    std::vector<float> g(trace.first_gradients.begin() + long(at), trace.first_gradients.begin() + long(at + p.numel()));
    at += size_t(p.numel());
    tensors.push_back({"grad." + name, Tensor::from_data(p.shape(), g)});
  }
  return tensors;
}

class ContextParallelScenario : public Scenario {
 public:
  void check(const ReproConfig& config, const Request& request) const override {
    check_takes_no_policy_or_plot("context-parallel", request);
    check_context_parallel_config(config);
  }

  std::optional<Results> run(const RankGroups& groups, const ReproConfig& config, const Request& request,
                             const Placement& placement, Progress*) const override {
    CpResults results = run_context_parallel(groups, config, placement.device, placement.description);
    if (groups.world->rank() != 0) return std::nullopt;
    decide_context_parallel(results);
    DumpTensors dump;
    if (request.dump) {
      const Block names(config, Device::cpu());
      DumpTensors variants;
      for (const CpFigures& f : results.variants) variants.push_back({f.variant.key, trace_tensors(f.trace, names)});
      dump = variant_dump(results.inputs, trace_tensors(results.baseline, names), variants);
    }
    return scenario_results(context_parallel_text(results), context_parallel_json(results), std::move(dump));
  }
};

}  // namespace

CpResults run_context_parallel(const RankGroups& groups, const ReproConfig& c, Device device,
                               const std::string& placement) {
  check_context_parallel_config(c);
  const Data data{Generator(c.seed).randn({c.rows, c.in_features}), Generator(c.seed + 1).randn({c.rows, c.in_features})};
  CpResults results;
  results.ulysses = usp_ulysses_degree(c.heads, groups.sp);
  results.cp = groups.sp / results.ulysses;
  const UspGroups usp = usp_groups(groups, results.ulysses);
  const bool first = groups.world->rank() == 0;
  if (first) results.baseline = train(CpSchedule::Contiguous, c, data, nullptr, usp, device);
  for (const CpVariant& variant : kVariants) {
    if (variant.schedule == CpSchedule::HeadWall) {
      results.head_wall_case = "H = " + std::to_string(c.heads) + ", ulysses = sp = " + std::to_string(groups.sp);
      results.head_wall_message = head_wall_refusal(c, groups, device);
    }
    CpTrace trace = train(variant.schedule, c, data, &groups, usp, device);
    if (!first) continue;
    results.variants.emplace_back();
    results.variants.back().variant = variant;
    results.variants.back().trace = std::move(trace);
  }
  if (!first) return {};
  results.config = c;
  add_sequence_ignored(results.config, "the attention block");
  results.placement = placement;
  results.inputs = {{"x", data.inputs}, {"target", data.targets}};
  for (const auto& [name, p] : Block(c, Device::cpu()).named_parameters()) results.inputs.push_back({name, p.data()});
  return results;
}

const Scenario& context_parallel_scenario() {
  static const ContextParallelScenario scenario;
  return scenario;
}

}  // namespace seqpar::repro
