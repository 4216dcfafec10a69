// seqpar-allreduce-bench: all-reduce latency and bus bandwidth through
// NcclProcessGroup, next to the same ncclAllReduce called directly on the same
// communicator and stream.
//
//   seqpar-allreduce-bench --nproc 2 [--repeats 200] [--warmup 20]
//
// Sizes: 10256 floats (41 KB, the gradient of the issue's Linear(640, 16)) and 64 MiB.
// Every call is bracketed by its own pair of CUDA events and waited for; the figure
// is the median over --repeats calls after --warmup calls. Three ways per size:
//   direct    ncclAllReduce between the events: the collective's GPU time;
//   direct+sync  the same, plus cudaStreamSynchronize before the stop event is
//             recorded: what a caller that waits for the result pays;
//   group     group.all_reduce() between the events: enqueue, then the group's own
//             wait (cudaStreamQuery / ncclCommGetAsyncError polling) before it returns.
// Then the exact step's all-reduce: the digits of the issue's dW and db (10256 exact
// sums of this rank's rows of Linear(640, 16) from Generator(12345) on x = randn(12000,
// 640), L1 loss), two ways:
//   digits full    every word (ncclInt64, ncclSum) directly, as a captured step
//                  carries them (bench/fused/nccl_enqueued.h), plus the wait;
//   digits packed  group.all_reduce_sums(): the hulls' all-reduce, then only the
//                  words inside them (dist/packed_digits.h); its size column is what it
//                  sent (ProcessGroup::digit_traffic).
// Bus bandwidth = bytes / time x 2 (n - 1) / n, the figure nccl-tests reports.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "bench/src/bench_util.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/exact_sums.h"
#include "core/generator.h"
#include "dist/launcher.h"
#include "dist/nccl_check.h"
#include "dist/nccl_process_group.h"
#include "nn/exact_gradients.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"

using namespace seqpar;

namespace {

struct Settings {
  int repeats = 200;
  int warmup = 20;
};

// Median, 10th and 90th percentile of one way of calling, in milliseconds.
struct Timing {
  double median, p10, p90;
};

// `prepare` runs before each call's start event (untimed).
Timing time_calls(const std::function<void()>& call, const std::function<void()>& before_stop,
                  const Settings& settings, cudaStream_t stream,
                  const std::function<void()>& prepare = [] {}) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> milliseconds;
  for (int i = 0; i < settings.warmup + settings.repeats; ++i) {
    prepare();
    CUDA_CHECK(cudaEventRecord(start, stream));
    call();
    before_stop();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (i >= settings.warmup) milliseconds.push_back(elapsed);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(milliseconds.begin(), milliseconds.end());
  auto at = [&](double q) { return milliseconds[static_cast<size_t>(q * (milliseconds.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// A non-blocking communicator may finish a launch in the background; the benchmark
// just waits for it (the group does the same, with a timeout).
void direct_all_reduce(dist::NcclProcessGroup& group, Tensor& values, cudaStream_t stream) {
  const ncclResult_t launched = ncclAllReduce(values.data(), values.data(), static_cast<size_t>(values.numel()),
                                              ncclFloat32, ncclSum, group.communicator(), stream);
  NCCL_CHECK(launched, group.rank());
  ncclResult_t state = launched;
  while (state == ncclInProgress) NCCL_CHECK(ncclCommGetAsyncError(group.communicator(), &state), group.rank());
  NCCL_CHECK(state, group.rank());
}

void report(const char* way, double bytes, int world_size, const Timing& timing, int rank) {
  const double algorithm_gbps = bytes / (timing.median * 1e-3) / 1e9;
  const double bus_gbps = algorithm_gbps * 2.0 * (world_size - 1) / world_size;
  if (rank != 0) return;
  std::printf("| %9.1f KB | %-13s | %9.1f | %9.1f | %9.1f | %8.2f | %8.2f |\n", bytes / 1000, way,
              timing.median * 1e3, timing.p10 * 1e3, timing.p90 * 1e3, algorithm_gbps, bus_gbps);
}

void benchmark_size(dist::NcclProcessGroup& group, int64_t count, const Settings& settings) {
  const cudaStream_t stream = cuda::current_stream(group.device().index);
  // Zeros: the sum stays zero however often it runs, so no call sees infinities.
  Tensor values = Tensor::zeros({count}, group.device());
  auto nothing = [] {};
  auto sync = [&] { CUDA_CHECK(cudaStreamSynchronize(stream)); };
  auto direct = [&] { direct_all_reduce(group, values, stream); };
  auto through_group = [&] { group.all_reduce(values); };
  const double bytes = static_cast<double>(count) * sizeof(float);
  report("direct", bytes, group.size(), time_calls(direct, nothing, settings, stream), group.rank());
  report("direct+sync", bytes, group.size(), time_calls(direct, sync, settings, stream), group.rank());
  report("group", bytes, group.size(), time_calls(through_group, nothing, settings, stream), group.rank());
}

// This rank's digits of the issue's dW and db (see the top of the file).
exact::ExactSums issue_gradient_digits(const dist::NcclProcessGroup& group) {
  constexpr int64_t kRows = 12000, kIn = 640, kOut = 16;
  Generator generator(12345);
  const nn::Linear model(kIn, kOut, generator, group.device());
  const Tensor x = generator.randn({kRows, kIn}, group.device());
  const Tensor shard = x.tensor_split(group.size())[static_cast<size_t>(group.rank())];
  nn::ExactGradients gradients;
  {
    const nn::ExactGradients::Recording recording(gradients);
    const autograd::Variable rows(shard), target(shard.narrow(1, 0, kOut));
    nn::l1_loss(model.forward(rows), target, nn::Reduction::sum_divided_by(kRows * kOut)).backward();
  }
  exact::ExactSums digits(gradients.sums().at(0)->count(), group.device());
  digits.copy_from(*gradients.sums()[0]);
  return digits;
}

void benchmark_digits(dist::NcclProcessGroup& group, const Settings& settings) {
  const cudaStream_t stream = cuda::current_stream(group.device().index);
  const exact::ExactSums source = issue_gradient_digits(group);
  exact::ExactSums digits(source.count(), group.device());
  auto restore = [&] { digits.copy_from(source); };  // each call adds the same digits
  auto nothing = [] {};
  auto full = [&] {
    group.enqueue("digits full", stream, [&](ncclComm_t communicator, cudaStream_t s) {
      return ncclAllReduce(digits.digits(), digits.digits(), static_cast<size_t>(digits.words()),
                           ncclInt64, ncclSum, communicator, s);
    });
    group.synchronize(stream);
  };
  auto packed = [&] { group.all_reduce_sums(digits); };
  const auto before = group.digit_traffic();
  restore();
  packed();
  const double sent = 8.0 * static_cast<double>(group.digit_traffic().sent_words - before.sent_words);
  const double whole = 8.0 * static_cast<double>(digits.words());
  report("digits full", whole, group.size(), time_calls(full, nothing, settings, stream, restore),
         group.rank());
  report("digits packed", sent, group.size(), time_calls(packed, nothing, settings, stream, restore),
         group.rank());
  if (group.rank() == 0) {
    std::printf("\nexact digits of dW and db: %.1f KB packed of %.1f KB in full (%.2fx fewer bytes)\n",
                sent / 1000, whole / 1000, whole / sent);
  }
}

void print_header(const dist::NcclProcessGroup& group, const Settings& settings, int argc, char** argv) {
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, group.device().index));
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::printf("all-reduce (float32, sum) on %d x %s, NCCL %s, %s\n", group.size(), properties.name,
              dist::detail::nccl_version_string().c_str(), date);
  std::printf("rank command: %s; NCCL_ALGO=%s NCCL_PROTO=%s; median of %d after %d warm-up\n\n",
              command.c_str(), std::getenv("NCCL_ALGO"), std::getenv("NCCL_PROTO"), settings.repeats,
              settings.warmup);
  std::printf("| size         | way           | median us | p10 us    | p90 us    | alg GB/s | bus GB/s |\n");
  std::printf("|--------------|---------------|-----------|-----------|-----------|----------|----------|\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (auto status = dist::maybe_launch(argc, argv)) return *status;
  Settings settings;
  const std::string usage =
      "usage: seqpar-allreduce-bench --nproc N [--repeats N] [--warmup N] [--help] [--version]\n"
      "  (or one rank of a world started by torchrun, mpirun or srun)\n";
  const int status = bench::parse_arguments(argc, argv, "seqpar-allreduce-bench", usage, {
      bench::integer_option("--repeats", settings.repeats, 1),
      bench::integer_option("--warmup", settings.warmup, 0),
  });
  if (status >= 0) return status;
  const auto environment = dist::launch_environment_from_process();
  if (!environment) {
    std::fprintf(stderr, "run with --nproc N (one GPU per rank), or under torchrun/mpirun/srun\n");
    return 2;
  }
  try {
    auto group = dist::NcclProcessGroup::create_world(*environment);
    if (group->rank() == 0) print_header(*group, settings, argc, argv);
    benchmark_size(*group, 10256, settings);
    benchmark_size(*group, int64_t{64} << 20 >> 2, settings);  // 64 MiB of floats
    benchmark_digits(*group, settings);
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
