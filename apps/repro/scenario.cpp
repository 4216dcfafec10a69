#include "apps/repro/scenario.h"

#include <chrono>
#include <memory>

#include "apps/repro/pitfall.h"
#include "autograd/engine.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/mesh.h"
#include "core/nvtx.h"
#include "nn/l1_loss.h"
#include "optim/clip.h"

namespace seqpar::repro {

namespace {

using autograd::Variable;
using Clock = std::chrono::steady_clock;

int64_t flatten_count(const std::vector<Tensor>& tensors) {
  int64_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.numel();
  return total;
}

// The parameters' (or gradients') values as one flat tensor: weight row-major, then bias.
Tensor flatten(const std::vector<Tensor>& tensors, Device device) {
  Tensor flat = Tensor::empty({flatten_count(tensors)}, device);
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

std::vector<Tensor> values_of(const std::vector<Variable>& variables, bool gradients) {
  std::vector<Tensor> tensors;
  for (const Variable& variable : variables) {
    tensors.push_back(gradients ? variable.grad() : variable.data());
  }
  return tensors;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Variable forward_loss(const nn::Linear& model, const Variable& x, const Variable& target,
                      nn::Reduction reduction) {
  SEQPAR_NVTX_RANGE("forward");
  return nn::l1_loss(model.forward(x), target, reduction);
}

// The one-rank baseline on world rank 0: its own model and optimizer, all rows.
class BaselineTrainer {
 public:
  BaselineTrainer(const ReproConfig& config, const RankData& data, Device device)
      : model_(make_model(config, data, device)),
        parameters_(model_->parameters()),
        optimizer_(parameters_, config.adamw),
        x_(data.inputs),
        target_(data.inputs.narrow(1, 0, config.out_features)),
        gradient_clipping_(config.gradient_clipping) {}

  // One step; appends its loss and norm to `run` and leaves the state after the step in
  // run.parameters and run.gradients (overwriting the previous step's).
  void step(BaselineRun& run) {
    SEQPAR_NVTX_RANGE("one-rank baseline step");
    const auto start = Clock::now();
    model_->zero_grad();
    const Variable loss = forward_loss(*model_, x_, target_, nn::Reduction::mean());
    loss.backward();
    const Tensor norm = gradient_clipping_ > 0
                            ? optim::clip_grad_norm(parameters_, gradient_clipping_)
                            : optim::grad_norm(parameters_);
    optimizer_.step();
    run.losses.push_back(loss.data().item());  // item() waits for the device
    run.norms.push_back(norm.item());
    run.seconds += seconds_since(start);
    run.parameters = flat_values(parameters_, false);
    run.gradients = flat_values(parameters_, true);
  }

 private:
  std::unique_ptr<nn::Linear> model_;
  std::vector<Variable> parameters_;
  optim::AdamW optimizer_;
  Variable x_, target_;
  double gradient_clipping_;
};

// One policy on this rank: its own model and engine, its shard of its replica's rows.
class PolicyTrainer {
 public:
  PolicyTrainer(const Policy& policy, const RankGroups& groups, const ReproConfig& config,
                const RankData& data, Device device)
      : model_(make_model(config, data, device)),
        engine_(policy, *model_, groups, config.adamw, config.gradient_clipping),
        reduction_(loss_reduction(policy, config.rows, config.out_features,
                                  config.data_parallel_size)),
        device_(device) {
    const Tensor batch = data.inputs.narrow(0, groups.dp_rank * config.rows, config.rows);
    const Tensor shard = shard_rows(policy, batch, groups.sp, groups.sp_rank);
    x_ = Variable(shard);
    target_ = Variable(shard.narrow(1, 0, config.out_features));
    engine_.broadcast_parameters();
  }

  // One step on every rank, timed from a barrier (so a rank's wait for the others is
  // not counted) into `seconds`, then every rank's state gathered on world rank 0,
  // timed into `gather_seconds`.
  StepRecord step(dist::ProcessGroup& world, double& seconds, double& gather_seconds) {
    world.barrier();
    SEQPAR_NVTX_RANGE_TEXT("policy " + engine_.policy().name);
    const auto start = Clock::now();
    model_->zero_grad();
    const Variable loss = forward_loss(*model_, x_, target_, reduction_);
    engine_.backward(loss);
    const StepNorms norms = engine_.step();
    if (device_.is_cuda()) cuda::synchronize(device_.index);
    seconds += seconds_since(start);

    const auto gather_start = Clock::now();

    // One gather of everything the figures need: parameters, gradients, then the loss
    // and the two norms (each collective and host copy is a round trip, which on a GPU
    // costs more than the step's kernels).
    std::vector<Tensor> state = values_of(engine_.parameters(), false);
    for (const Tensor& gradient : values_of(engine_.parameters(), true)) state.push_back(gradient);
    state.push_back(loss.data().view({1}));
    state.push_back(norms.local.view({1}));
    state.push_back(norms.used.view({1}));
    const std::vector<std::vector<float>> per_rank = gather(world, flatten(state, device_));
    StepRecord record;
    const size_t count = static_cast<size_t>(flatten_count(values_of(engine_.parameters(), false)));
    for (const std::vector<float>& values : per_rank) {
      record.parameters.emplace_back(values.begin(), values.begin() + count);
      record.gradients.emplace_back(values.begin() + count, values.begin() + 2 * count);
      record.losses.push_back(values[2 * count]);
      record.local_norms.push_back(values[2 * count + 1]);
      record.used_norms.push_back(values[2 * count + 2]);
    }
    gather_seconds += seconds_since(gather_start);
    return record;
  }

 private:
  std::unique_ptr<nn::Linear> model_;
  PolicyStep engine_;
  Variable x_, target_;
  nn::Reduction reduction_;
  Device device_;
};

}  // namespace

RankData draw_data(const ReproConfig& config, Device device) {
  Generator generator(config.seed);
  nn::Linear model(config.in_features, config.out_features, generator, device);
  RankData data{Tensor(), model.weight().data().clone(), model.bias().data().clone()};
  // One draw per replica, as each replica's script draws its own batch. With one
  // replica the draw is the inputs: no second copy of the largest tensor, whose
  // transient copies on every rank at once would set the run's peak memory.
  if (config.data_parallel_size == 1) {
    data.inputs = generator.randn({config.rows, config.in_features}, device);
    data.random_offset = generator.offset();
    return data;
  }
  data.inputs = Tensor::empty({config.data_parallel_size * config.rows, config.in_features}, device);
  for (int64_t replica = 0; replica < config.data_parallel_size; ++replica) {
    data.inputs.narrow(0, replica * config.rows, config.rows)
        .copy_(generator.randn({config.rows, config.in_features}, device));
  }
  data.random_offset = generator.offset();
  return data;
}

// A fresh model holding the drawn initial parameters. Its own generator's numbers are
// overwritten, so making one draws nothing from the data's generator.
std::unique_ptr<nn::Linear> make_model(const ReproConfig& config, const RankData& data,
                                       Device device) {
  Generator unused(config.seed);
  auto model = std::make_unique<nn::Linear>(config.in_features, config.out_features, unused, device);
  model->weight().data().copy_(data.initial_weight);
  model->bias().data().copy_(data.initial_bias);
  model->zero_grad();
  return model;
}

RankGroups rank_groups(const std::shared_ptr<dist::ProcessGroup>& world, const ReproConfig& config) {
  const dist::Mesh mesh(world->size(), static_cast<int>(config.sequence_parallel_size),
                        static_cast<int>(config.data_parallel_size));
  const dist::MeshGroups mesh_groups = dist::build_mesh_groups(mesh, *world);
  return RankGroups{world, mesh_groups.sp_group, mesh_groups.dp_group, mesh_groups.sp_dp_group,
                    mesh.sp_size(), mesh.dp_size(), mesh_groups.coordinates.sp_rank,
                    mesh_groups.coordinates.dp_rank, mesh.str()};
}

int64_t parameter_count(const ReproConfig& config) {
  return config.out_features * config.in_features + config.out_features;
}

RunResults run_scenario(const RankGroups& groups, const ReproConfig& config,
                        const std::vector<const Policy*>& policies, Device device,
                        const std::string& placement, Progress* progress) {
  dist::ProcessGroup& world = *groups.world;
  const bool is_root = world.rank() == 0;
  if (!is_root) progress = nullptr;
  if (progress) progress->set_phase("drawing the data and the initial parameters");
  const RankData data = draw_data(config, device);
  const double lr = config.adamw.lr();

  RunResults results;
  results.config = config;
  results.placement = placement;
  results.mesh_layout = groups.mesh_layout;
  results.initial_parameters =
      gather(world, flatten({data.initial_weight, data.initial_bias}, device));
  std::unique_ptr<BaselineTrainer> baseline;
  if (is_root) {
    results.inputs = data.inputs.to(Device::cpu());
    baseline = std::make_unique<BaselineTrainer>(config, data, device);
  }
  // Set up in the policies' order on every rank, so their collectives (the initial
  // broadcast, then each step's) are called in the same order everywhere. A skipped
  // policy is skipped on every rank alike.
  // The per-step series are sized once: growing them step by step would leave freed
  // blocks between the short-lived snapshots, and the heap would grow with the steps.
  if (is_root) {
    results.baseline.losses.reserve(size_t(config.steps));
    results.baseline.norms.reserve(size_t(config.steps));
  }
  std::vector<std::unique_ptr<PolicyTrainer>> trainers;
  std::vector<double> seconds(policies.size(), 0), analysis_seconds(policies.size(), 0);
  for (const Policy* policy : policies) {
    PolicyRun run;
    run.figures.policy = policy;
    run.figures.skipped = cannot_shard_reason(*policy, config.rows, groups.sp);
    if (is_root && run.figures.skipped.empty()) run.figures.steps.reserve(size_t(config.steps));
    trainers.push_back(run.figures.skipped.empty()
                           ? std::make_unique<PolicyTrainer>(*policy, groups, config, data, device)
                           : nullptr);
    results.policies.push_back(std::move(run));
  }

  // Lockstep: the other ranks wait for rank 0's baseline step at the first policy's
  // barrier, and for its analysis of a policy's step at the next barrier, so no wait is
  // longer than about one step, however many steps there are.
  for (int64_t step = 0; step < config.steps; ++step) {
    if (progress) progress->set_step("one-rank baseline", step, config.steps);
    if (is_root) baseline->step(results.baseline);
    for (size_t i = 0; i < policies.size(); ++i) {
      if (trainers[i] == nullptr) continue;
      if (progress) progress->set_step("policy " + policies[i]->name, step, config.steps);
      StepRecord record = trainers[i]->step(world, seconds[i], analysis_seconds[i]);
      if (!is_root) continue;
      const auto start = Clock::now();
      PolicyFigures& figures = results.policies[i].figures;
      const BaselineStep expected{results.baseline.parameters, results.baseline.gradients,
                                   results.baseline.losses.back(),
                                   results.baseline.norms.back()};
      figures.steps.push_back(figures_of_step(record, expected, lr));
      if (step == 0) {
        figures.first_step_signs = signs_of_first_step(record.parameters, record.gradients, lr);
        figures.gradient_scale = expected.norm > 0 ? record.used_norms[0] / expected.norm : 1;
      }
      if (step + 1 == config.steps) results.policies[i].last = std::move(record);
      analysis_seconds[i] += seconds_since(start);
    }
  }
  if (!is_root) return {};
  if (progress) progress->set_phase("deciding the verdicts");
  for (size_t i = 0; i < policies.size(); ++i) {
    PolicyFigures& figures = results.policies[i].figures;
    if (!figures.skipped.empty() || figures.steps.empty()) continue;
    figures.seconds_per_step = seconds[i] / static_cast<double>(figures.steps.size());
    figures.analysis_seconds_per_step =
        analysis_seconds[i] / static_cast<double>(figures.steps.size());
    decide(figures, lr, static_cast<int>(config.sequence_parallel_size),
           static_cast<int>(config.data_parallel_size));
  }
  return results;
}

}  // namespace seqpar::repro
