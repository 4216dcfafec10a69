// The Ulysses block trained under the exact policy over sp x dp thread ranks equals
// one-rank training bit for bit, step after step: the projections' weight gradients are
// exact row sums added over sp x dp before one rounding, and the attention is computed
// per head over the whole sequence wherever its heads went. A deliberately wrong
// all-to-all layout must break that equality: the test can fail.
#include <catch2/catch.hpp>

#include <functional>
#include <vector>

#include "core/generator.h"
#include "dist/local_process_group.h"
#include "dist/mesh.h"
#include "nn/exact_gradients.h"
#include "nn/l1_loss.h"
#include "nn/ulysses_block.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tests/dist/dist_test_util.h"
#include "tests/dist/swapped_group.h"

using namespace seqpar;
using autograd::Variable;

namespace {

nn::UlyssesBlockOptions block_options(bool causal) {
  nn::UlyssesBlockOptions options;
  options.model_dim = 16;
  options.heads = 4;  // 1, 2 or 4 heads a rank
  options.head_dim = 4;
  options.causal = causal;
  return options;
}
const int64_t kModelDim = block_options(true).model_dim;
const int64_t kSequence = 32;
const int kSteps = 3;

// dp sequences of kSequence rows, stacked: sequence b is rows [b * S, (b + 1) * S).
struct Data {
  Tensor inputs, targets;
  explicit Data(int dp)
      : inputs(Generator(71).randn({dp * kSequence, kModelDim})),
        targets(Generator(72).randn({dp * kSequence, kModelDim})) {}
};

// What one rank saw: its output rows at the first step, and every parameter's values
// (flattened, in order) after each step.
struct Trace {
  std::vector<float> first_output;
  std::vector<std::vector<float>> parameters_after_step;
};

std::vector<float> flattened(const std::vector<Variable>& parameters) {
  std::vector<float> values;
  for (const Variable& parameter : parameters) {
    const std::vector<float> own = parameter.data().to_vector();
    values.insert(values.end(), own.begin(), own.end());
  }
  return values;
}

// One training run of `block` on the rows this rank holds (`rows_of(b)` for each of its
// sequences b), under the exact policy: each loss is its rows' share of the global mean;
// backward keeps the projections' exact row sums; `add_across_ranks` adds their digits
// over sp x dp (nothing for one rank); they are rounded once; then clipping and AdamW,
// the same on every rank.
Trace train(nn::UlyssesBlock& block, const Data& data, const std::vector<int>& sequences,
            int64_t first_row, int64_t rows, int dp,
            const std::function<void(exact::ExactSums&)>& add_across_ranks,
            Device device = Device::cpu()) {
  const std::vector<Variable> parameters = block.parameters();
  optim::AdamW optimizer(parameters, optim::AdamWOptions(1e-2).weight_decay(0.01));
  const nn::Reduction global_mean = nn::Reduction::sum_divided_by(dp * kSequence * kModelDim);
  Trace trace;
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    nn::ExactGradients exact;
    {
      const nn::ExactGradients::Recording recording(exact);
      for (int sequence : sequences) {
        const int64_t first = sequence * kSequence + first_row;
        const Variable x(data.inputs.narrow(0, first, rows).to(device));
        const Variable target(data.targets.narrow(0, first, rows).to(device));
        const Variable y = block.forward(x);
        if (step == 0) {
          const std::vector<float> values = y.data().to_vector();
          trace.first_output.insert(trace.first_output.end(), values.begin(), values.end());
        }
        nn::l1_loss(y, target, global_mean).backward();
      }
    }
    for (exact::ExactSums* sums : exact.sums()) add_across_ranks(*sums);
    exact.round_into_grads();
    optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
    optimizer.step();
    trace.parameters_after_step.push_back(flattened(parameters));
  }
  return trace;
}

// One rank holding every sequence whole: the baseline.
Trace train_baseline(int dp, bool causal, Device device = Device::cpu()) {
  const Data data(dp);
  Generator generator(7);
  nn::UlyssesBlock block(block_options(causal), nn::single_rank_group(), generator, device);
  std::vector<int> sequences;
  for (int b = 0; b < dp; ++b) sequences.push_back(b);
  return train(block, data, sequences, 0, kSequence, dp, [](exact::ExactSums&) {}, device);
}

using GroupWrapper = std::function<std::shared_ptr<nn::SequenceGroup>(std::shared_ptr<nn::SequenceGroup>)>;

// sp x dp thread ranks: rank (sp_rank, dp_rank) holds rows sp_rank * S/sp ... of
// sequence dp_rank. `wrap` may put a test double around the sp group.
std::vector<Trace> train_distributed(int sp, int dp, bool causal, const GroupWrapper& wrap = nullptr) {
  const Data data(dp);
  const dist::Mesh mesh(sp * dp, sp, dp);
  std::vector<Trace> traces(static_cast<size_t>(sp * dp));
  dist::run_local_world(sp * dp, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    std::shared_ptr<nn::SequenceGroup> sequence_group = nn::sequence_group(groups.sp_group);
    if (wrap) sequence_group = wrap(sequence_group);
    Generator generator(7);
    nn::UlyssesBlock block(block_options(causal), sequence_group, generator);
    const int64_t rows = kSequence / sp;
    traces[static_cast<size_t>(world->rank())] =
        train(block, data, {groups.coordinates.dp_rank}, groups.coordinates.sp_rank * rows, rows, dp,
              [&](exact::ExactSums& sums) { groups.sp_dp_group->all_reduce_sums(sums); });
  });
  return traces;
}

// The baseline's first-step output rows of rank (sp_rank, dp_rank).
std::vector<float> baseline_rows(const Trace& baseline, int sp, int rank) {
  const int64_t rows = kSequence / sp, width = kModelDim;
  const int64_t first = (rank / sp) * kSequence + (rank % sp) * rows;
  return std::vector<float>(baseline.first_output.begin() + first * width,
                            baseline.first_output.begin() + (first + rows) * width);
}

// Every rank's first outputs are the baseline's rows of that rank, and its parameters
// after every step the baseline's, bit for bit.
void check_same_training(const Trace& baseline, const std::vector<Trace>& traces, int sp, int dp,
                         bool causal) {
  for (int rank = 0; rank < sp * dp; ++rank) {
    INFO("sp " << sp << ", dp " << dp << ", rank " << rank << (causal ? ", causal" : ", not causal"));
    const Trace& trace = traces[static_cast<size_t>(rank)];
    CHECK(test::same_bits(trace.first_output, baseline_rows(baseline, sp, rank)));
    for (int step = 0; step < kSteps; ++step) {
      INFO("after step " << step + 1);
      CHECK(test::same_bits(trace.parameters_after_step[static_cast<size_t>(step)],
                            baseline.parameters_after_step[static_cast<size_t>(step)]));
    }
  }
}

}  // namespace

TEST_CASE("the Ulysses block over sp {1, 2, 4} x dp {1, 2} trains as one rank, bit for bit",
          "[dist][cpu]") {
  for (const bool causal : {true, false}) {
    for (int dp : {1, 2}) {
      const Trace baseline = train_baseline(dp, causal);
      for (int sp : {1, 2, 4}) {
        check_same_training(baseline, train_distributed(sp, dp, causal), sp, dp, causal);
      }
    }
  }
}

// The plain reference loops define the bits: the block on the reference device (every op's
// reference row) trains as the CPU's fast rows do.
TEST_CASE("the Ulysses block on the reference device trains with the CPU's bits", "[dist][cpu]") {
  for (const bool causal : {true, false}) {
    INFO((causal ? "causal" : "not causal"));
    const Trace cpu = train_baseline(2, causal);
    const Trace reference = train_baseline(2, causal, Device::reference());
    CHECK(test::same_bits(reference.first_output, cpu.first_output));
    for (int step = 0; step < kSteps; ++step) {
      INFO("after step " << step + 1);
      CHECK(test::same_bits(reference.parameters_after_step[static_cast<size_t>(step)],
                            cpu.parameters_after_step[static_cast<size_t>(step)]));
    }
  }
}

// RoPE's positions are the tokens' global indices, not 0..rows-1 on every shard.
TEST_CASE("the block's positions are global: rank r's rows start at r * rows", "[dist][cpu]") {
  std::vector<std::vector<int64_t>> positions(4);
  dist::run_local_world(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Generator generator(7);
    const nn::UlyssesBlock block(block_options(true), nn::sequence_group(world), generator);
    positions[static_cast<size_t>(world->rank())] = block.positions(3);
  });
  for (int64_t rank = 0; rank < 4; ++rank) {
    CHECK(positions[static_cast<size_t>(rank)] == std::vector<int64_t>{3 * rank, 3 * rank + 1, 3 * rank + 2});
  }
}

// The same comparison must fail when the exchange files chunks under the wrong ranks.
TEST_CASE("a wrong all-to-all layout breaks the equality the exactness test checks",
          "[dist][cpu]") {
  const Trace baseline = train_baseline(1, true);
  for (int sp : {2, 4}) {
    const std::vector<Trace> traces = train_distributed(sp, 1, true, [](std::shared_ptr<nn::SequenceGroup> group) {
      return std::make_shared<test::SwappedSlices>(std::move(group), test::SwappedSlices::Which::AllToAll);
    });
    bool outputs_differ = false, parameters_differ = false;
    for (int rank = 0; rank < sp; ++rank) {
      const Trace& trace = traces[static_cast<size_t>(rank)];
      outputs_differ |= !test::same_bits(trace.first_output, baseline_rows(baseline, sp, rank));
      parameters_differ |= !test::same_bits(trace.parameters_after_step.back(),
                                            baseline.parameters_after_step.back());
    }
    INFO("sp " << sp);
    CHECK(outputs_differ);
    CHECK(parameters_differ);
  }
}
