#include "apps/repro/scenario.h"

#include <chrono>
#include <functional>

#include "autograd/engine.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/generator.h"
#include "nn/l1_loss.h"
#include "optim/clip.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;
using Clock = std::chrono::steady_clock;

// Every rank's copy of the same data and initial parameters.
struct RankData {
  Tensor inputs;  // all replicas' rows, [dp * rows, in]
  Tensor initial_weight, initial_bias;
};

RankData draw_data(const ReproConfig& config, Device device) {
  Generator generator(config.seed);
  nn::Linear model(config.in_features, config.out_features, generator, device);
  RankData data{Tensor::empty({config.data_parallel_size * config.rows, config.in_features}, device),
                model.weight().data().clone(), model.bias().data().clone()};
  for (int64_t replica = 0; replica < config.data_parallel_size; ++replica) {
    data.inputs.narrow(0, replica * config.rows, config.rows)
        .copy_(generator.randn({config.rows, config.in_features}, device));
  }
  return data;
}

// The parameters' (or gradients') values as one flat tensor: weight row-major, then bias.
Tensor flatten(const std::vector<Tensor>& tensors, Device device) {
  int64_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.numel();
  Tensor flat = Tensor::empty({total}, device);
  int64_t offset = 0;
  for (const Tensor& tensor : tensors) {
    flat.narrow(0, offset, tensor.numel()).view(tensor.shape()).copy_(tensor);
    offset += tensor.numel();
  }
  return flat;
}

// Every rank's `flat` (one length everywhere) as host vectors on world rank 0.
std::vector<std::vector<float>> gather(dist::ProcessGroup& world, const Tensor& flat) {
  Tensor all = Tensor::empty({world.size() * flat.numel()}, flat.device());
  world.all_gather(all, flat);
  if (world.rank() != 0) return {};
  const std::vector<float> values = all.to_vector();
  std::vector<std::vector<float>> per_rank;
  for (int rank = 0; rank < world.size(); ++rank) {
    per_rank.emplace_back(values.begin() + rank * flat.numel(),
                          values.begin() + (rank + 1) * flat.numel());
  }
  return per_rank;
}

std::vector<float> gather_scalar(dist::ProcessGroup& world, const Tensor& scalar) {
  std::vector<std::vector<float>> per_rank = gather(world, scalar.view({1}));
  std::vector<float> values;
  for (const auto& one : per_rank) values.push_back(one[0]);
  return values;
}

std::vector<Tensor> values_of(const std::vector<Variable>& variables, bool gradients) {
  std::vector<Tensor> tensors;
  for (const Variable& variable : variables) {
    tensors.push_back(gradients ? variable.grad() : variable.data());
  }
  return tensors;
}

void reset_parameters(const nn::Linear& model, const RankData& data) {
  model.weight().data().copy_(data.initial_weight);
  model.bias().data().copy_(data.initial_bias);
  model.zero_grad();
}

// `after_step` runs after each step: world rank 0 trains the reference while the other
// ranks wait, and meeting them once a step keeps every wait one step long, well inside
// the group's timeout however many steps there are.
ReferenceRun run_reference(const ReproConfig& config, const nn::Linear& model,
                           const RankData& data, const std::function<void()>& after_step) {
  reset_parameters(model, data);
  const auto start = Clock::now();
  ReferenceRun run;
  const std::vector<Variable> parameters = model.parameters();
  optim::AdamW optimizer(parameters, config.adamw);
  const Variable x(data.inputs);
  const Variable target(data.inputs.narrow(1, 0, config.out_features));
  for (int64_t step = 0; step < config.steps; ++step) {
    model.zero_grad();
    const Variable loss = nn::l1_loss(model.forward(x), target, nn::Reduction::mean());
    loss.backward();
    const Tensor norm = config.gradient_clipping > 0
                            ? optim::clip_grad_norm(parameters, config.gradient_clipping)
                            : optim::grad_norm(parameters);
    optimizer.step();
    run.losses.push_back(loss.data().item());
    run.norms.push_back(norm.item());
    run.parameters.push_back(flatten(values_of(parameters, false), Device::cpu()).to_vector());
    run.gradients.push_back(flatten(values_of(parameters, true), Device::cpu()).to_vector());
    after_step();
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

PolicyRun run_policy(const Policy& policy, const RankGroups& groups, const ReproConfig& config,
                     const nn::Linear& model, const RankData& data) {
  PolicyRun run;
  run.policy = &policy;
  run.skipped = cannot_shard_reason(policy, config.rows, groups.sp);
  if (!run.skipped.empty()) return run;  // the same on every rank: no collective skipped unevenly

  reset_parameters(model, data);
  PolicyStep engine(policy, model, groups, config.adamw, config.gradient_clipping);
  engine.broadcast_parameters();
  const Tensor batch = data.inputs.narrow(0, groups.dp_rank * config.rows, config.rows);
  const Tensor shard = shard_rows(policy, batch, groups.sp, groups.sp_rank);
  const Variable x(shard);
  const Variable target(shard.narrow(1, 0, config.out_features));
  const nn::Reduction reduction =
      loss_reduction(policy, config.rows, config.out_features, config.data_parallel_size);
  const Device device = data.inputs.device();

  double seconds = 0;
  for (int64_t step = 0; step < config.steps; ++step) {
    groups.world->barrier();
    const auto start = Clock::now();
    model.zero_grad();
    const Variable loss = nn::l1_loss(model.forward(x), target, reduction);
    engine.backward(loss);
    const StepNorms norms = engine.step();
    if (device.is_cuda()) cuda::synchronize(device.index);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();

    StepRecord record;
    record.parameters = gather(*groups.world, flatten(values_of(engine.parameters(), false), device));
    record.gradients = gather(*groups.world, flatten(values_of(engine.parameters(), true), device));
    record.losses = gather_scalar(*groups.world, loss.data());
    record.local_norms = gather_scalar(*groups.world, norms.local);
    record.used_norms = gather_scalar(*groups.world, norms.used);
    run.steps.push_back(std::move(record));
  }
  run.seconds = seconds;
  return run;
}

}  // namespace

int64_t parameter_count(const ReproConfig& config) {
  return config.out_features * config.in_features + config.out_features;
}

RunResults run_scenario(const RankGroups& groups, const ReproConfig& config,
                        const std::vector<const Policy*>& policies, Device device,
                        const std::string& placement) {
  const RankData data = draw_data(config, device);
  Generator unused(config.seed);  // the module's parameters are overwritten from `data`
  const nn::Linear model(config.in_features, config.out_features, unused, device);
  const bool is_root = groups.world->rank() == 0;

  RunResults results;
  results.config = config;
  results.placement = placement;
  results.mesh_layout = groups.mesh_layout;
  results.initial_parameters =
      gather(*groups.world, flatten({data.initial_weight, data.initial_bias}, device));
  if (is_root) {
    results.inputs = data.inputs.to(Device::cpu());
    results.reference = run_reference(config, model, data, [&] { groups.world->barrier(); });
  } else {
    for (int64_t step = 0; step < config.steps; ++step) groups.world->barrier();
  }
  for (const Policy* policy : policies) {
    results.policies.push_back(run_policy(*policy, groups, config, model, data));
  }
  return results;
}

}  // namespace seqpar::repro
