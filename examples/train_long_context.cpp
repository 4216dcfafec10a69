// Trains a Llama-shaped attention layer past the head wall: 8 query heads over 2 kv heads
// of 128 dims, a batch of 2 sequences of 128 tokens each packing 4 documents, causal
// within each, its sequences split over sp 8 = ulysses 2 x cp 4 thread ranks (USP:
// nn::LongContextBlock). Ulysses alone could not go past 2 ranks without repeating the kv
// heads; context parallelism alone would gather every head's keys. Here the 2 Ulysses
// ranks take one kv head each, and the 4 cp ranks split each sequence zigzag, so that
// under the causal mask every rank has the same work. The gradients are summed exactly
// over the 8 ranks and rounded once, so the ranks train as one rank holding everything:
// the program checks it bit for bit at the end, and exits 1 otherwise.
//
// Before training it measures what one layer moves per rank in a step (forward and
// backward) for Ulysses 8, CP 8 (all-gather) and USP 2 x 4 at these sizes, and prints it
// beside the arithmetic of docs/context-parallel.md (on stderr: stdout is the loss).
// It exits 1 if a measurement is not its arithmetic.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <seqpar/seqpar.h>

using namespace seqpar;

namespace {

constexpr int kUlysses = 2, kCp = 4, kSteps = 10;
constexpr int64_t kBatch = 2, kSequence = 128, kHeads = 8, kKvHeads = 2, kHeadDim = 128;

nn::LongContextBlockOptions long_context() {
  nn::LongContextBlockOptions options;
  options.model_dim = 32;
  options.heads = kHeads;
  options.kv_heads = kKvHeads;
  options.head_dim = kHeadDim;
  // 21, 50 and 97 fall inside ranks' shards of 16 tokens (zigzag chunks of 16).
  options.documents = {0, 21, 50, 97, kSequence};
  options.layout = nn::ContextParallelLayout::Zigzag;
  return options;
}

// A sequence group that counts the bytes this rank receives from the others: of an
// all-to-all's or an all-gather's output, all but its own slice.
class CountingGroup final : public nn::SequenceGroup {
 public:
  explicit CountingGroup(std::shared_ptr<nn::SequenceGroup> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  void all_to_all(Tensor& output, const Tensor& input) override {
    inner_->all_to_all(output, input);
    count(output);
  }
  void all_gather(Tensor& output, const Tensor& input) override {
    inner_->all_gather(output, input);
    count(output);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void count(const Tensor& output) { bytes_ += output.numel() / size() * (size() - 1) * 4; }
  std::shared_ptr<nn::SequenceGroup> inner_;
  int64_t bytes_ = 0;
};

std::shared_ptr<nn::SequenceGroup> level(const std::shared_ptr<dist::ProcessGroup>& group) {
  return group ? nn::sequence_group(group) : nn::single_rank_group();
}

// What a rank receives in one forward and backward of the layer over ulysses u x cp c,
// in bytes, docs/context-parallel.md's arithmetic: Ulysses' four all-to-alls each way
// (q, k, v, out; k and v with one copy per query head past the kv heads), then the
// context-parallel gathers on the Ulysses rank's heads: K, V forward; Q, dO, O and the
// rows' m and l backward. Each layer's entry check of the ranks' shapes adds an
// all-to-all of 18 floats a rank.
int64_t arithmetic(int64_t u, int64_t c) {
  const int64_t tokens = kSequence / (u * c);  // a rank's
  const int64_t kv = kKvHeads % u == 0 ? kKvHeads : kHeads;  // the kv heads Ulysses moves
  const int64_t ulysses = 2 * (u - 1) * kBatch * tokens * (2 * kHeads + 2 * kv) * kHeadDim / u;
  const int64_t gathered = kBatch * kSequence * (c - 1) / c;  // tokens from the other cp ranks
  const int64_t cp = gathered * (2 * (kv / u) * kHeadDim + (kHeads / u) * (3 * kHeadDim + 2));
  const int64_t checks = ((u - 1) + (c - 1)) * 18;
  return 4 * (ulysses + cp + checks);
}

// Rank 0's bytes for one forward and backward of the layer over ulysses u x cp c.
int64_t measure(int u, int c) {
  int64_t bytes = 0;
  const dist::Mesh mesh(u * c, u, c, 1);
  dist::run_local_world(u * c, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    auto ulysses = std::make_shared<CountingGroup>(level(groups.ulysses_group));
    auto cp = std::make_shared<CountingGroup>(level(groups.cp_group));
    const nn::SequenceParallelAttention attention(
        ulysses, cp, {nn::AttentionMask::causal(), nn::ContextParallelLayout::Zigzag, {}});
    const int64_t tokens = kSequence / (u * c);
    Generator generator(7 + static_cast<uint64_t>(world->rank()));
    const autograd::Variable q(generator.randn({kBatch, tokens, kHeads, kHeadDim}), true);
    const autograd::Variable k(generator.randn({kBatch, tokens, kKvHeads, kHeadDim}), true);
    const autograd::Variable v(generator.randn({kBatch, tokens, kKvHeads, kHeadDim}), true);
    attention.forward(q, k, v).backward(generator.randn({kBatch, tokens, kHeads * kHeadDim}));
    if (world->rank() == 0) bytes = ulysses->bytes() + cp->bytes();
  });
  return bytes;
}

// Prints the three schemes at degree 8; false if a measurement is not its arithmetic.
bool report_traffic() {
  std::fprintf(stderr,
               "bytes received per rank, one layer, one step (forward + backward), B %lld, S %lld, Hq %lld, "
               "Hkv %lld, D %lld, 4-byte floats:\n",
               static_cast<long long>(kBatch), static_cast<long long>(kSequence), static_cast<long long>(kHeads),
               static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim));
  struct Scheme {
    const char* name;
    int u, c;
  };
  bool all_equal = true;
  for (const Scheme& s : {Scheme{"Ulysses 8 (kv heads repeated)", 8, 1}, Scheme{"CP 8 (all-gather)", 1, 8},
                          Scheme{"USP ulysses 2 x cp 4", kUlysses, kCp}}) {
    const int64_t measured = measure(s.u, s.c), expected = arithmetic(s.u, s.c);
    std::fprintf(stderr, "  %-30s measured %9lld  arithmetic %9lld  %s\n", s.name, static_cast<long long>(measured),
                 static_cast<long long>(expected), measured == expected ? "equal" : "DIFFERENT");
    all_equal = all_equal && measured == expected;
  }
  return all_equal;
}

// Rows `positions` of every sequence of [B, S, d]: [B, positions, d].
Tensor rows_at(const Tensor& all, const std::vector<int64_t>& positions) {
  Tensor out = Tensor::empty({all.size(0), static_cast<int64_t>(positions.size()), all.size(2)});
  for (size_t n = 0; n < positions.size(); ++n) {
    out.narrow(1, static_cast<int64_t>(n), 1).copy_(all.narrow(1, positions[n], 1));
  }
  return out;
}

// Trains `block` on the rows of `inputs` at `positions`; gradients summed exactly over
// `gradients`, the loss over `world` for the printout. Returns the final parameters.
std::vector<float> train(const nn::LongContextBlock& block, const std::shared_ptr<dist::ProcessGroup>& gradients,
                         const std::shared_ptr<dist::ProcessGroup>& world, const Tensor& inputs,
                         const Tensor& targets, const std::vector<int64_t>& positions) {
  const std::vector<autograd::Variable> parameters = block.parameters();
  optim::AdamW optimizer(parameters, optim::AdamWOptions(3e-3).weight_decay(0.01));
  nn::ExactGradientSync sync(parameters, gradients);
  const int64_t width = block.options().model_dim, rows = static_cast<int64_t>(positions.size());
  const nn::Reduction share = nn::Reduction::sum_divided_by(kBatch * kSequence * width);
  const autograd::Variable x(rows_at(inputs, positions));
  const autograd::Variable y(rows_at(targets, positions).view({kBatch * rows, width}));
  for (int step = 1; step <= kSteps; ++step) {
    optimizer.zero_grad();
    const autograd::Variable out = autograd::reshape(block.forward(x), {kBatch * rows, width});
    const autograd::Variable loss = nn::l1_loss(out, y, share);
    sync.backward(loss);
    sync.synchronize();  // added over the 8 ranks, rounded once: one-rank training's gradients
    optim::clip_grad_norm(parameters, /*max_norm=*/1.0);
    optimizer.step();
    Tensor total = loss.data().clone();
    world->all_reduce(total);  // every rank's rows
    if (world->rank() == 0 && world->size() > 1 && (step == 1 || step % 2 == 0)) {
      std::printf("step %2d  loss %.4f\n", step, total.item());
    }
  }
  std::vector<float> values;
  for (const autograd::Variable& p : parameters) {
    const std::vector<float> own = p.data().to_vector();
    values.insert(values.end(), own.begin(), own.end());
  }
  return values;
}

}  // namespace

int main() {
  if (!report_traffic()) return 1;
  const nn::LongContextBlockOptions options = long_context();
  // [2, S, d_model]; the target of token t is the mean of its document's tokens up to t,
  // what causal attention within documents gives when every score is equal.
  const Tensor inputs = Generator(1).randn({kBatch, kSequence, options.model_dim});
  Tensor targets = Tensor::empty(inputs.shape());
  for (int64_t b = 0; b < kBatch; ++b) {
    std::vector<float> running(static_cast<size_t>(options.model_dim));
    for (int64_t t = 0, start = 0, n = 0; t < kSequence; ++t) {
      if (t == options.documents[static_cast<size_t>(n)]) {
        start = t;
        ++n;
        std::fill(running.begin(), running.end(), 0.0f);
      }
      for (int64_t c = 0; c < options.model_dim; ++c) {
        running[static_cast<size_t>(c)] += inputs.at({b, t, c});
        targets.set({b, t, c}, running[static_cast<size_t>(c)] / static_cast<float>(t - start + 1));
      }
    }
  }

  const dist::Mesh mesh(kUlysses * kCp, kUlysses, kCp, 1);
  std::vector<std::vector<float>> trained(kUlysses * kCp);
  dist::run_local_world(kUlysses * kCp, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, *world);
    if (world->rank() == 0) std::fprintf(stderr, "%s", mesh.str().c_str());
    Generator generator(42);  // the same initial layer on every rank
    const nn::LongContextBlock block(options, level(groups.ulysses_group), level(groups.cp_group), generator);
    const std::vector<int64_t> mine = block.positions(kSequence / (kUlysses * kCp));  // two runs, far apart
    trained[static_cast<size_t>(world->rank())] = train(block, groups.sp_dp_group, world, inputs, targets, mine);
  });

  // One rank holding the sequences whole.
  std::vector<float> one_rank;
  dist::run_local_world(1, [&](std::shared_ptr<dist::ProcessGroup> alone) {
    Generator generator(42);
    const nn::LongContextBlock block(options, nn::single_rank_group(), nn::single_rank_group(), generator);
    one_rank = train(block, alone, alone, inputs, targets, block.positions(kSequence));
  });
  for (const std::vector<float>& rank : trained) {
    if (rank.size() != one_rank.size() || std::memcmp(rank.data(), one_rank.data(), rank.size() * sizeof(float)) != 0) {
      std::printf("a rank's parameters differ from one-rank training\n");
      return 1;
    }
  }
  return 0;
}
