// The API docs/library.md shows, named through <seqpar/seqpar.h> alone: a program that
// compiles and links only if the umbrella header brings each part (tests/package/check.sh
// builds it with pkg-config's flags, seqpar's and seqpar-cpu's). It is not run.
#include <seqpar/seqpar.h>

#include <cstdio>

int main() {
  using namespace seqpar;
  // core: tensors, devices, storage, random numbers, the correctly rounded exp, NVTX ranges.
  Generator generator(1);
  const Tensor x = generator.randn({4, 8});
  const Storage* storage = nullptr;
  const DeviceBuffer<int64_t>* buffer = nullptr;
  const NvtxRange range("library_api");
  // autograd, reshape included.
  const autograd::NoGradGuard* guard = nullptr;
  const autograd::Variable flat = autograd::reshape(autograd::Variable(x), {32});
  // nn: Linear, the L1 loss, the exact gradient sync, the Ulysses block.
  const nn::Linear model(8, 2, generator);
  const nn::Reduction share = nn::Reduction::sum_divided_by(8);
  const nn::ExactGradientSync* sync = nullptr;
  const nn::UlyssesBlockOptions options;
  const auto group = nn::single_rank_group();
  // optim and dist.
  optim::AdamW optimizer(model.parameters(), optim::AdamWOptions().lr(1e-2).weight_decay(0.01));
  const auto clip = &optim::clip_grad_norm;
  const auto run = &dist::run_local_world;
  const dist::Mesh* mesh = nullptr;
  std::printf("%p %p %p %p %p %p %p %p %f %d\n", static_cast<const void*>(storage), static_cast<const void*>(buffer),
              static_cast<const void*>(guard), static_cast<const void*>(sync), static_cast<const void*>(mesh),
              reinterpret_cast<void*>(clip), reinterpret_cast<void*>(run), static_cast<const void*>(group.get()),
              static_cast<double>(correctly_rounded_exp(1.0f)) + share.scale(8) + double(flat.shape()[0]),
              int(options.model_dim));
  return 0;
}
