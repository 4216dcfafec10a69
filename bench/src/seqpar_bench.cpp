// seqpar-bench: the issue step and its kernels, timed with CUDA
// events (median of --repeats calls after --warmup calls), printed and written as
// JSON for bench/run.sh, which sets them beside bench/torch_reference.py's figures.
//
//   seqpar-bench [--repeats N] [--warmup N] [--json PATH] [--no-stress]
//                [--kernel-parts | --kernel-parts-only]
//   seqpar-bench --nproc 2 [--repeats N] [--warmup N] [--json PATH]
//
// With --nproc N (or under torchrun, mpirun, srun) each process is one rank on its
// own GPU and only the step over NCCL runs (seqpar_bench_nccl.cpp): the figures
// step/Ngpu_nccl/... and allreduce/Ngpu_nccl/..., written by rank 0.
//
// Steps (forward, L1 loss, backward, gradient sync, clip 1.0, AdamW lr 1e-4 wd 0.01;
// the "exact" policy): the fused step (fused::ExactL1Step) replayed from a CUDA graph
// and run eagerly, and the public API (autograd), on the full batch of 12000 rows and
// on one rank's 3000-row shard; the public API also over 4 ranks of a threads group
// sharing the GPU.
//
// --kernel-parts adds the issue's kernels one launcher at a time where the default
// sections time them in pairs (what the former seqpar-kernel-timings printed):
// dx = dy W, L1 forward, L1 backward, grad norm, clip, and axpby.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/src/bench_util.h"
#include "bench/src/bench_sections.h"
#include "autograd/variable.h"
#include "core/generator.h"
#include "dist/environment.h"
#include "dist/launcher.h"
#include "dist/local_process_group.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "bench/fused/exact_l1_step.h"

using namespace seqpar;
using autograd::Variable;
using bench::issue_adamw;
using bench::Report;
using bench::Settings;
using bench::time_calls;
using bench::time_host_calls;

namespace {

constexpr int64_t kRows = 12000, kIn = 640, kOut = 16, kShards = 4;
constexpr double kF = sizeof(float);
const Device kGpu = Device::cuda(0);

// The public API's step, as seqpar-repro's exact policy takes it on one rank.
struct ApiStep {
  nn::Linear& model;
  Variable x, target;
  nn::Reduction reduction;
  optim::AdamW optimizer;
  dist::ProcessGroup* group;  // gradients summed over it when set
  void operator()() {
    model.zero_grad();
    const Variable loss = nn::l1_loss(model.forward(x), target, reduction);
    loss.backward();
    if (group != nullptr) {
      for (const Variable& parameter : model.parameters()) {
        Tensor gradient = parameter.grad();
        group->all_reduce(gradient, dist::ReduceOp::Sum);
      }
    }
    optim::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
  }
};

void bench_copy(Report& report, const Settings& s) {
  const int64_t count = int64_t{1} << 28;  // 1 GiB
  const Tensor a = Tensor::full({count}, 1.0f, kGpu), b = Tensor::empty({count}, kGpu);
  cudaStream_t stream = cuda::current_stream(0);
  report.add("copy/1GiB", "device-to-device cudaMemcpyAsync, bytes read + written",
             time_calls([&] {
               CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), count * kF,
                                          cudaMemcpyDeviceToDevice, stream));
             }, 5, std::max(20, s.repeats / 10)),
             2.0 * count * kF);
}

void bench_steps(Report& report, const Settings& s) {
  Generator generator(12345);
  nn::Linear model(kIn, kOut, generator, kGpu);
  const Tensor x = generator.randn({kRows, kIn}, kGpu);
  const double step_bytes = kF * kRows * kIn, shard_bytes = step_bytes / kShards;
  const double step_flops = 2.0 * 2.0 * kRows * kIn * kOut;
  const nn::Reduction exact = nn::Reduction::sum_divided_by(kRows * kOut);

  {  // the fused step on one batch (x stays in L2 from one step to the next): the public
     // API's bits
    fused::ExactL1Step step(model, {{x, x.narrow(1, 0, kOut)}}, nn::Reduction::mean(),
                            issue_adamw(), 1.0);
    report.add("step/full12000/exact_eager", "ExactL1Step::run, exact numerics",
               time_calls([&] { step.run(); }, s.warmup, s.repeats), step_bytes, step_flops);
    step.capture();
    report.add("step/full12000/exact_graph", "ExactL1Step::replay (one CUDA graph)",
               time_calls([&] { step.replay(); }, s.warmup, s.repeats), step_bytes, step_flops);
  }
  {
    ApiStep step{model, Variable(x), Variable(x.narrow(1, 0, kOut)), nn::Reduction::mean(),
                 optim::AdamW(model.parameters(), issue_adamw()), nullptr};
    report.add("step/full12000/public_api", "autograd + kernels, eager",
               time_calls([&] { step(); }, s.warmup, s.repeats), step_bytes, step_flops);
    report.add("step/full12000/public_api_host", "the host's time to enqueue that step",
               time_host_calls([&] { step(); }, s.warmup, s.repeats));
  }
  const Tensor shard = x.tensor_split(kShards)[0];
  {  // one SP rank's share: the exact loss over its 3000 rows (no peers to sync with)
    fused::ExactL1Step exact_step(model, {{shard, shard.narrow(1, 0, kOut)}}, exact,
                                  issue_adamw(), 1.0);
    exact_step.capture();
    report.add("step/shard3000/exact_graph", "one rank of sp 4, exact numerics, no peers",
               time_calls([&] { exact_step.replay(); }, s.warmup, s.repeats), shard_bytes,
               step_flops / kShards);
    ApiStep api{model, Variable(shard), Variable(shard.narrow(1, 0, kOut)), exact,
                optim::AdamW(model.parameters(), issue_adamw()), nullptr};
    report.add("step/shard3000/public_api", "autograd + kernels, eager",
               time_calls([&] { api(); }, s.warmup, s.repeats), shard_bytes, step_flops / kShards);
  }
}

// 4 ranks as threads sharing the GPU, exact policy, the public API: rank 0 times each
// step between two barriers (all ranks' kernels of the step are queued between its
// events).
void bench_four_ranks(Report& report, const Settings& s) {
  Generator generator(12345);
  nn::Linear initial(kIn, kOut, generator, kGpu);
  const Tensor x = generator.randn({kRows, kIn}, kGpu);
  bench::Timing timing;
  dist::run_local_world(kShards, [&](std::shared_ptr<dist::ProcessGroup> world) {
    Generator unused(0);
    nn::Linear model(kIn, kOut, unused, kGpu);
    model.weight().data().copy_(initial.weight().data());
    model.bias().data().copy_(initial.bias().data());
    const Tensor shard = x.tensor_split(kShards)[static_cast<size_t>(world->rank())];
    const nn::Reduction exact = nn::Reduction::sum_divided_by(kRows * kOut);
    ApiStep one_step{model, Variable(shard), Variable(shard.narrow(1, 0, kOut)), exact,
                     optim::AdamW(model.parameters(), issue_adamw()), world.get()};
    cudaStream_t stream = cuda::current_stream(0);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> times;
    for (int i = 0; i < s.warmup + s.repeats; ++i) {
      world->barrier();
      if (world->rank() == 0) CUDA_CHECK(cudaEventRecord(start, stream));
      world->barrier();
      one_step();
      world->barrier();
      if (world->rank() == 0) {
        CUDA_CHECK(cudaEventRecord(stop, stream));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float milliseconds = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
        if (i >= s.warmup) times.push_back(1000.0 * milliseconds);
      }
    }
    cuda::synchronize(0);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    if (world->rank() == 0) {
      std::sort(times.begin(), times.end());
      timing = {times[times.size() / 2], times.front(), static_cast<int>(times.size())};
    }
  });
  report.add("step/4ranks_threads/public_api",
             "4 threads on one GPU, exact policy, sum all-reduce of the gradients", timing,
             kF * kRows * kIn, 4.0 * kRows * kIn * kOut);
}

}  // namespace


int main(int argc, char** argv) {
  if (auto status = dist::maybe_launch(argc, argv)) return *status;
  Settings settings;
  const std::string usage =
      "usage: seqpar-bench [--nproc N] [--repeats N] [--warmup N] [--json PATH] [--no-stress]\n"
      "                    [--kernel-parts | --kernel-parts-only | --exact-dw-only | --attention-only]\n"
      "                    [--help] [--version]\n"
      "  --kernel-parts       also time the issue's kernels one launcher at a time (dx, L1\n"
      "                       forward, L1 backward, grad norm, clip, axpby)\n"
      "  --kernel-parts-only  only that section\n"
      "  --exact-dw-only      only exact dW with a randn dy (binned and CRT; with the stress\n"
      "                       shape unless --no-stress)\n"
      "  --attention-only     only exact attention at 4,096 to 131,072 tokens, and the Ulysses\n"
      "                       layer's step at 65,536 tokens on 4 thread ranks\n";
  const int status = bench::parse_arguments(argc, argv, "seqpar-bench", usage, {
      bench::integer_option("--repeats", settings.repeats, 1),
      bench::integer_option("--warmup", settings.warmup, 0),
      {{"--json"}, true, [&](const std::string& v) { settings.json = v; }},
      {{"--no-stress"}, false, [&](const std::string&) { settings.stress = false; }},
      {{"--kernel-parts"}, false, [&](const std::string&) { settings.kernel_parts = true; }},
      {{"--kernel-parts-only"}, false, [&](const std::string&) { settings.kernel_parts_only = true; }},
      {{"--exact-dw-only"}, false, [&](const std::string&) { settings.exact_dw_only = true; }},
      {{"--attention-only"}, false, [&](const std::string&) { settings.attention_only = true; }},
  });
  if (status >= 0) return status;
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "seqpar-bench: no CUDA device\n");
    return 1;
  }
  try {
    if (const auto environment = dist::launch_environment_from_process()) {
#ifdef SEQPAR_WITH_NCCL
      return bench::bench_nccl_world(settings, *environment);
#else
      std::fprintf(stderr, "seqpar-bench: started as rank %d of %d, but this build has no NCCL\n",
                   environment->rank, environment->world_size);
      return 1;
#endif
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "seqpar-bench: %s\n", error.what());
    return 1;
  }
  cudaDeviceProp properties;
  CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  std::printf("seqpar-bench on %s (%d SMs, L2 %d MB): median of %d calls after %d warm-up calls\n",
              properties.name, properties.multiProcessorCount, properties.l2CacheSize >> 20,
              settings.repeats, settings.warmup);
  Report report;
  if (settings.attention_only) {
    bench::bench_ulysses_step(report, settings);
    bench::bench_attention_long(report, settings);
    report.write_json(settings.json, properties.name);
    return 0;
  }
  if (settings.exact_dw_only) {
    bench::bench_exact_dw(report, settings);
    report.write_json(settings.json, properties.name);
    return 0;
  }
  if (!settings.kernel_parts_only) {
    bench_copy(report, settings);
    bench_steps(report, settings);
    bench_four_ranks(report, settings);
    bench::bench_kernels(report, settings);
    bench::bench_exact_dw(report, settings);
  }
  if (settings.kernel_parts || settings.kernel_parts_only) bench::bench_kernel_parts(report, settings);
  if (settings.stress && !settings.kernel_parts_only) bench::bench_stress(report, settings);
  report.write_json(settings.json, properties.name);
  return 0;
}
