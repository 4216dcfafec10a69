// seqpar-bench --nproc 2: the issue step on 2 GPUs over NCCL, one process per
// GPU, rank 0 reporting. Each rank draws the issue's model and x exactly as the
// one-GPU figures do (Generator(12345): the Linear, then x), keeps its rows of
// x.tensor_split(world) (6000 of 12000 for 2 ranks) and takes the "exact" policy's
// step, fused::ExactL1Step: loss = its sum over (12000 x 16), backward, the gradients'
// digits summed over the ranks (fused::NcclEnqueuedSums, stream-ordered, so the step is
// captured with its all-reduce), clip 1.0, AdamW.
//
// Timing: before each call a barrier (a blocking one-float all-reduce) lines the
// ranks up; each rank then brackets its call with CUDA events on its stream and waits
// for it through the group (never a hang). The figure is rank 0's median; every
// rank's median is printed beside it. A back-to-back figure runs the replays one
// after another with no barrier and reports the time per step.
//
// Checks, printed and reflected in the exit status: the ranks start from identical
// parameters, end the step's figures with bitwise-identical parameters, and those
// equal one rank's training on all 12000 rows bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/src/bench_sections.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/generator.h"
#include "dist/nccl_check.h"
#include "dist/nccl_process_group.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "core/exact_bins.h"
#include "core/exact_sums.h"
#include "bench/fused/exact_l1_step.h"
#include "bench/fused/nccl_enqueued.h"

namespace seqpar::bench {

namespace {

constexpr int64_t kRows = 12000, kIn = 640, kOut = 16;
constexpr double kF = sizeof(float);

// The issue's model, drawn first from Generator(12345) as in the one-GPU figures.
std::unique_ptr<nn::Linear> issue_model(Device gpu) {
  Generator generator(12345);
  return std::make_unique<nn::Linear>(kIn, kOut, generator, gpu);
}

// [weight, bias] flattened: the 10256 values the ranks must agree on.
Tensor flat_parameters(const nn::Linear& model) {
  const Tensor weight = model.weight().data(), bias = model.bias().data();
  Tensor flat = Tensor::empty({weight.numel() + bias.numel()}, weight.device());
  flat.narrow(0, 0, weight.numel()).copy_(weight.contiguous().view({weight.numel()}));
  flat.narrow(0, weight.numel(), bias.numel()).copy_(bias);
  return flat;
}

// Every rank's copy of `values` (collective), as host vectors in rank order.
std::vector<std::vector<float>> gather(dist::NcclProcessGroup& group, const Tensor& values) {
  const Tensor flat = values.contiguous().view({values.numel()});
  Tensor all = Tensor::empty({flat.numel() * group.size()}, flat.device());
  group.all_gather(all, flat);
  std::vector<std::vector<float>> per_rank;
  for (int r = 0; r < group.size(); ++r) {
    per_rank.push_back(all.narrow(0, r * flat.numel(), flat.numel()).to_vector());
  }
  return per_rank;
}

struct Agreement {
  int64_t differing = 0;  // values that differ from rank 0's in any bit
  double max_abs = 0.0;   // the largest |difference| from rank 0's
};

// Collective: how far every rank's `values` are from rank 0's.
Agreement agreement(dist::NcclProcessGroup& group, const Tensor& values) {
  const auto per_rank = gather(group, values);
  Agreement result;
  for (size_t r = 1; r < per_rank.size(); ++r) {
    for (size_t i = 0; i < per_rank[0].size(); ++i) {
      const float a = per_rank[0][i], b = per_rank[r][i];
      if (std::memcmp(&a, &b, sizeof a) != 0) ++result.differing;
      result.max_abs = std::max(result.max_abs, std::fabs(double(a) - double(b)));
    }
  }
  return result;
}

class CudaEvents {
 public:
  CudaEvents() {
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~CudaEvents() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  CudaEvents(const CudaEvents&) = delete;
  CudaEvents& operator=(const CudaEvents&) = delete;
  double microseconds() const {
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
    return 1000.0 * milliseconds;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
};

Timing summarize(std::vector<double> times, int repeats) {
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), repeats};
}

// Each call alone: a barrier, then the call between two events on this rank's stream.
Timing time_aligned(dist::NcclProcessGroup& group, const std::function<void()>& call,
                    const Settings& s) {
  const cudaStream_t stream = cuda::current_stream(group.device().index);
  CudaEvents events;
  std::vector<double> times;
  for (int i = 0; i < s.warmup + s.repeats; ++i) {
    group.barrier();
    CUDA_CHECK(cudaEventRecord(events.start, stream));
    call();
    CUDA_CHECK(cudaEventRecord(events.stop, stream));
    group.synchronize(stream);
    if (i >= s.warmup) times.push_back(events.microseconds());
  }
  return summarize(times, s.repeats);
}

// `s.repeats` calls in a row between one pair of events, five rounds: the median
// round's time per call (launch latency hidden behind the previous call's work).
Timing time_back_to_back(dist::NcclProcessGroup& group, const std::function<void()>& call,
                         const Settings& s) {
  const cudaStream_t stream = cuda::current_stream(group.device().index);
  CudaEvents events;
  for (int i = 0; i < s.warmup; ++i) call();
  std::vector<double> per_call;
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    group.barrier();
    CUDA_CHECK(cudaEventRecord(events.start, stream));
    for (int i = 0; i < s.repeats; ++i) call();
    CUDA_CHECK(cudaEventRecord(events.stop, stream));
    group.synchronize(stream);
    per_call.push_back(events.microseconds() / s.repeats);
  }
  return summarize(per_call, kRounds * s.repeats);
}

// Graph-captures `work` (stream-ordered calls on `stream`) and returns the executable.
cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& work) {
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    work();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t executable = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&executable, graph, 0);
  (void)cudaGraphDestroy(graph);
  CUDA_CHECK(status);
  return executable;
}

// Adds a figure on rank 0, with every rank's median in its description (collective).
struct WorldReport {
  dist::NcclProcessGroup& group;
  Report report;
  void add(const std::string& name, const std::string& what, const Timing& timing,
           double bytes = 0.0, double flops = 0.0) {
    const Tensor mine = Tensor::full({1}, static_cast<float>(timing.median_us), group.device());
    const auto medians = gather(group, mine);
    if (group.rank() != 0) return;
    std::string text = what + " (rank medians";
    for (size_t r = 0; r < medians.size(); ++r) {
      char value[32];
      std::snprintf(value, sizeof value, "%s %.2f", r ? "," : ":", medians[r][0]);
      text += value;
    }
    report.add(name, text + " us)", timing, bytes, flops);
  }
};

struct Checks {
  dist::NcclProcessGroup& group;
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    failures += ok ? 0 : 1;
    if (group.rank() == 0) std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    std::fflush(stdout);
  }
  // The ranks' parameters after a figure's steps: bitwise equal, or how far apart.
  void same_parameters(const nn::Linear& model, int64_t steps, const std::string& after) {
    const Agreement a = agreement(group, flat_parameters(model));
    char text[256];
    std::snprintf(text, sizeof text,
                  "after %lld steps (%s): parameters on all %d ranks %s (%lld of %d values "
                  "differ from rank 0's, max |diff| %.3g)",
                  static_cast<long long>(steps), after.c_str(), group.size(),
                  a.differing == 0 ? "bitwise equal" : "DIFFER", static_cast<long long>(a.differing),
                  static_cast<int>(kOut * kIn + kOut), a.max_abs);
    expect(a.differing == 0, text);
  }
};

void print_header(const dist::NcclProcessGroup& group, const Settings& s) {
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, group.device().index));
  auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "(unset)";
  };
  std::printf("seqpar-bench over NCCL: world of %d, one process per GPU, %s; NCCL %s, NCCL_ALGO=%s "
              "NCCL_PROTO=%s NCCL_NVLS_ENABLE=%s\n",
              group.size(), properties.name, dist::detail::nccl_version_string().c_str(),
              env("NCCL_ALGO"), env("NCCL_PROTO"), env("NCCL_NVLS_ENABLE"));
  std::printf("each call timed alone after a barrier (median of %d after %d warm-up calls), "
              "figures from rank 0\n",
              s.repeats, s.warmup);
  std::fflush(stdout);
}

}  // namespace

int bench_nccl_world(const Settings& s, const dist::LaunchEnvironment& environment) {
  const auto world = dist::NcclProcessGroup::create_world(environment);
  dist::NcclProcessGroup& group = *world;
  const int rank = group.rank(), size = group.size();
  const Device gpu = group.device();
  const cudaStream_t stream = cuda::current_stream(gpu.index);
  if (rank == 0) print_header(group, s);

  Generator generator(12345);  // the model first, then x: as the one-GPU figures draw them
  const nn::Linear drawn(kIn, kOut, generator, gpu);
  const Tensor x = generator.randn({kRows, kIn}, gpu);
  const Tensor shard = x.tensor_split(size)[static_cast<size_t>(rank)];
  const std::vector<fused::Batch> batch{{shard, shard.narrow(1, 0, kOut)}};
  const int64_t rows = shard.size(0);
  const nn::Reduction exact = nn::Reduction::sum_divided_by(kRows * kOut);
  const double bytes = kF * rows * kIn, flops = 4.0 * rows * kIn * kOut;  // per rank
  const std::string world_name = std::to_string(size) + "gpu_nccl";

  Checks checks{group};
  WorldReport out{group, {}};
  const Agreement initial = agreement(group, flat_parameters(drawn));  // collective: every
  const Agreement first_rows = agreement(group, x.narrow(0, 0, 64));   // rank calls both
  checks.expect(initial.differing == 0 && first_rows.differing == 0,
                "every rank drew the same initial parameters and x (Generator(12345))");
  {  // the exact step: every rank's dW and db digits added by one integer all-reduce inside
     // the graph, so the split must equal one rank on all rows bit for bit
    exact::ExactSums zeros(kOut * kIn + kOut, gpu);
    fused::NcclEnqueuedSums sums(group);
    const cudaGraphExec_t digits_graph = capture(stream, [&] { sums.combine(zeros); });
    const int64_t digit_words = exact::kDigits * (kOut * kIn + kOut);
    out.add("allreduce/" + world_name + "/" + std::to_string(digit_words * 8 / 1000) +
                "KB_digits/seqpar_graph",
            "the exact step's digits (" + std::to_string(exact::kDigits) + " x " +
                std::to_string(kOut * kIn + kOut) + " int64), replayed from a CUDA graph",
            time_aligned(group, [&] { CUDA_CHECK(cudaGraphLaunch(digits_graph, stream)); }, s));
    group.synchronize(stream);
    CUDA_CHECK(cudaGraphExecDestroy(digits_graph));

    const auto split_model = issue_model(gpu), whole_model = issue_model(gpu);
    fused::ExactL1Step split(*split_model, batch, exact, issue_adamw(), 1.0, &sums);
    out.add("step/" + world_name + "/exact_eager",
            "ExactL1Step::run, the digits' all-reduce between the sums and their rounding",
            time_aligned(group, [&] { split.run(); }, s), bytes, flops);
    split.capture();
    out.add("step/" + world_name + "/exact_graph",
            "ExactL1Step::replay, the digits' all-reduce inside the graph",
            time_aligned(group, [&] { split.replay(); }, s), bytes, flops);
    out.add("step/" + world_name + "/exact_graph_back_to_back",
            "replays back to back, no barrier, time per step",
            time_back_to_back(group, [&] { split.replay(); }, s), bytes, flops);
    group.synchronize(stream);
    fused::ExactL1Step whole(*whole_model, {{x, x.narrow(1, 0, kOut)}}, nn::Reduction::mean(),
                             issue_adamw(), 1.0);
    for (int64_t i = 0; i < split.step_count(); ++i) whole.run();
    auto differing = [](const Tensor& a, const Tensor& b) {
      const std::vector<float> u = a.to_vector(), v = b.to_vector();
      int64_t count = 0;
      for (size_t i = 0; i < u.size(); ++i) count += std::memcmp(&u[i], &v[i], sizeof(float)) != 0;
      return count;
    };
    const int64_t parameters = differing(flat_parameters(*split_model), flat_parameters(*whole_model));
    const int64_t gradients = differing(split.gradients(), whole.gradients());
    const bool norm = differing(split.total_norm(), whole.total_norm()) == 0;
    char text[320];
    std::snprintf(text, sizeof text,
                  "exact step, %lld steps over %d ranks (eager, then replayed) vs one rank on all "
                  "%lld rows: %lld of %d parameters and %lld gradients differ, norm %s",
                  static_cast<long long>(split.step_count()), size, static_cast<long long>(kRows),
                  static_cast<long long>(parameters), static_cast<int>(kOut * kIn + kOut),
                  static_cast<long long>(gradients), norm ? "bitwise equal" : "DIFFERS");
    checks.expect(parameters == 0 && gradients == 0 && norm, text);
    checks.same_parameters(*split_model, split.step_count(), "exact step");
  }
  group.barrier();
  if (rank == 0) {
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, gpu.index));
    out.report.write_json(s.json, properties.name);
    std::printf("%s: %d check(s) failed; figures in %s\n",
                checks.failures ? "FAILED" : "ALL CHECKS PASSED", checks.failures, s.json.c_str());
  }
  return checks.failures ? 1 : 0;
}

}  // namespace seqpar::bench
