// seqpar_nccl_test: the NCCL process group across real processes, one per GPU.
//
//   seqpar_nccl_test --nproc 2                  every collective (the exact sums'
//                                               packed and stream-ordered ones too,
//                                               the all-to-all, send_recv), sub-groups, the same
//                                               bits on every rank
//   seqpar_nccl_test --nproc 2 --die-rank 1     rank 1 vanishes before a collective;
//                                               the others must fail within the timeout
//   seqpar_nccl_test --nproc 2 --die-rank 1 --enqueued
//                                               the same, the survivors' collective
//                                               enqueued (NcclProcessGroup::enqueue),
//                                               the failure surfacing at synchronize()
//   options: --timeout-ms T (default 10000)
//
// Exits 0 when every check passed on every rank (the launcher reports the first
// rank that did not). Not a Catch2 test: it needs several processes and GPUs.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "bench/fused/nccl_enqueued.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "dist/launcher.h"
#include "dist/mesh.h"
#include "dist/nccl_process_group.h"
#include "tests/dist/all_to_all_model.h"
#include "tests/dist/digit_cases.h"
#include "tests/dist/dist_test_util.h"

using namespace seqpar;
using dist::ReduceOp;

namespace {

struct Checks {
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    failures += ok ? 0 : 1;
  }
};

// Two ranks add in either order to the same float; with more, NCCL's ring order
// differs from rank order, so the comparison allows rounding (but every rank must
// still hold the same bits: checked by gathering the results).
bool matches_reference(const std::vector<float>& got, const std::vector<float>& want, int size) {
  if (size <= 2) return test::same_bits(got, want);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-5f * (1.0f + std::abs(want[i]))) return false;
  }
  return got.size() == want.size();
}

bool identical_on_every_rank(dist::ProcessGroup& group, const Tensor& result) {
  const Tensor flat = result.contiguous().view({result.numel()});
  Tensor gathered = Tensor::empty({flat.numel() * group.size()}, flat.device());
  group.all_gather(gathered, flat);
  const auto mine = flat.to_vector();
  for (int rank = 0; rank < group.size(); ++rank) {
    if (!test::same_bits(gathered.narrow(0, rank * flat.numel(), flat.numel()).to_vector(), mine)) {
      return false;
    }
  }
  return true;
}

void check_reductions(dist::NcclProcessGroup& world, const std::vector<Tensor>& inputs, Checks& checks) {
  const int size = world.size();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    Tensor values = inputs[static_cast<size_t>(world.rank())].to(world.device());
    world.all_reduce(values, op);
    const std::string what = std::string("all_reduce ") + dist::reduce_op_name(op);
    checks.expect(matches_reference(values.to_vector(), test::sequential_reduce(inputs, test::all_ranks(size), op), size),
                  what + " equals the rank-order loop" + (size <= 2 ? " bit for bit" : ""));
    checks.expect(identical_on_every_rank(world, values), what + ": same bits on every rank");
  }
  Tensor full = Tensor::full({4, 6}, static_cast<float>(world.rank() + 1), world.device());
  Tensor columns = full.narrow(1, 2, 3);
  world.all_reduce(columns);
  checks.expect(full.at({3, 2}) == static_cast<float>(size * (size + 1) / 2) &&
                    full.at({3, 1}) == static_cast<float>(world.rank() + 1),
                "all_reduce into a strided view changes only the view");
}

void check_gather_broadcast_barrier(dist::NcclProcessGroup& world, const std::vector<Tensor>& inputs,
                                    Checks& checks) {
  const Tensor mine = inputs[static_cast<size_t>(world.rank())].to(world.device());
  Shape shape = mine.shape();
  shape[0] *= world.size();
  Tensor gathered = Tensor::full(shape, -1.0f, world.device());
  world.all_gather(gathered, mine);
  std::vector<float> expected;
  for (const Tensor& input : inputs) {
    const auto values = input.to_vector();
    expected.insert(expected.end(), values.begin(), values.end());
  }
  checks.expect(test::same_bits(gathered.to_vector(), expected), "all_gather: slice r is rank r's input");
  const int root = world.size() - 1;
  Tensor values = mine.clone();
  world.broadcast(values, root);
  checks.expect(test::same_bits(values.to_vector(), inputs[static_cast<size_t>(root)].to_vector()),
                "broadcast from root " + std::to_string(root));
  world.barrier();
  checks.expect(true, "barrier returned");
}

// all_to_all against the model of its permutation, then back again (its own inverse).
void check_all_to_all(dist::NcclProcessGroup& world, Checks& checks) {
  const auto inputs = test::rank_inputs(world.size(), {6 * static_cast<int64_t>(world.size()), 41}, 1100);
  const Tensor mine = inputs[static_cast<size_t>(world.rank())].to(world.device());
  Tensor exchanged = Tensor::full(mine.shape(), -1.0f, world.device());
  world.all_to_all(exchanged, mine);
  checks.expect(test::same_bits(exchanged.to_vector(), test::all_to_all_model(inputs, world.rank())),
                "all_to_all: chunk i is rank i's chunk for this rank");
  world.all_to_all(exchanged, exchanged);  // in place: NCCL receives into a buffer of its own
  checks.expect(test::same_bits(exchanged.to_vector(), mine.to_vector()),
                "all_to_all twice gives the input back");
}

// send_recv: a ring step (rank r's input arrives at r + 1), then the reverse pairing
// r -> size - 1 - r, in place; each against the sender's own input.
void check_send_recv(dist::NcclProcessGroup& world, Checks& checks) {
  const int size = world.size(), rank = world.rank();
  const auto inputs = test::rank_inputs(size, {5, 37}, 1200);
  const Tensor mine = inputs[static_cast<size_t>(rank)].to(world.device());
  Tensor received = Tensor::full(mine.shape(), -1.0f, world.device());
  world.ring_step(received, mine);
  const std::vector<float> previous = inputs[static_cast<size_t>((rank + size - 1) % size)].to_vector();
  checks.expect(test::same_bits(received.to_vector(), previous), "send_recv ring step: the previous rank's input");
  Tensor swapped = mine.clone();
  world.send_recv(swapped, swapped, size - 1 - rank, size - 1 - rank);
  checks.expect(test::same_bits(swapped.to_vector(), inputs[static_cast<size_t>(size - 1 - rank)].to_vector()),
                "send_recv r <-> size - 1 - r, in place");
}

// enqueue(): a caller's NCCL calls, stream-ordered: two tensors' all-reduces in one
// NCCL group, eager and then captured into a CUDA graph (with a copy of the inputs in
// front, so that every replay reduces the same values).
void check_enqueued(dist::NcclProcessGroup& world, const std::vector<Tensor>& inputs, Checks& checks) {
  const int size = world.size();
  const cudaStream_t stream = cuda::current_stream(world.device().index);
  const Tensor mine = inputs[static_cast<size_t>(world.rank())].to(world.device());
  const std::vector<float> expected = test::sequential_reduce(inputs, test::all_ranks(size), ReduceOp::Sum);
  const int64_t split = 41;  // the "bias": the last 41 values, reduced as a tensor of their own
  const int64_t head = mine.numel() - split;
  Tensor flat = mine.clone().view({mine.numel()});
  auto reduced = [&] {  // the two parts, reduced in one NCCL group
    world.enqueue("all_reduce of two parts", stream, [&](ncclComm_t communicator, cudaStream_t s) {
      ncclResult_t result = ncclGroupStart();
      for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, head}, {head, split}}) {
        if (result != ncclSuccess) break;
        const ncclResult_t queued = ncclAllReduce(flat.data() + first, flat.data() + first,
                                                  static_cast<size_t>(count), ncclFloat32, ncclSum,
                                                  communicator, s);
        if (queued != ncclSuccess && queued != ncclInProgress) result = queued;
      }
      const ncclResult_t ended = ncclGroupEnd();
      return result != ncclSuccess ? result : ended;
    });
  };
  reduced();
  world.synchronize(stream);
  checks.expect(matches_reference(flat.to_vector(), expected, size),
                "enqueue: two all-reduces in one NCCL group equal the rank-order loop");
  checks.expect(identical_on_every_rank(world, flat), "enqueue: same bits on every rank");

  const Tensor source = mine.contiguous().view({mine.numel()});
  flat.fill_(-1.0f);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t executable = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemcpyAsync(flat.data(), source.data(), sizeof(float) * static_cast<size_t>(flat.numel()),
                             cudaMemcpyDeviceToDevice, stream));
  reduced();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&executable, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  checks.expect(flat.at({0}) == -1.0f, "capturing enqueue runs nothing");
  bool all_equal = true;
  for (int replay = 0; replay < 3; ++replay) {
    CUDA_CHECK(cudaGraphLaunch(executable, stream));
    world.synchronize(stream);
    all_equal = all_equal && matches_reference(flat.to_vector(), expected, size);
  }
  CUDA_CHECK(cudaGraphExecDestroy(executable));
  checks.expect(all_equal, "enqueue captured in a graph: 3 replays equal the rank-order loop");
  checks.expect(identical_on_every_rank(world, flat), "replayed all-reduce: same bits on every rank");
}

// The blocking exact all-reduce packs the words some rank needs (dist/packed_digits.h):
// its digits equal every rank's added in full, word for word, over every magnitude.
void check_packed_sums(dist::NcclProcessGroup& world, Checks& checks) {
  for (test::Magnitudes m : test::all_magnitudes()) {
    bool all_equal = true;
    int64_t sent = 0, full = 0;
    for (int64_t count : {1, 129, 10256}) {
      const uint64_t seed = 7000 + static_cast<uint64_t>(count) + static_cast<uint64_t>(m);
      exact::ExactSums sums = test::copy_to(test::random_sums(seed, world.rank(), count, m), world.device());
      const auto before = world.digit_traffic();
      world.all_reduce_sums(sums);
      sent += world.digit_traffic().sent_words - before.sent_words;
      full += world.digit_traffic().digit_words - before.digit_words;
      all_equal = all_equal && sums.to_host() == test::full_all_reduce(seed, world.size(), count, m);
    }
    char figure[96];
    std::snprintf(figure, sizeof figure, " (%.1f of %.1f KB sent)", 8e-3 * sent, 8e-3 * full);
    checks.expect(all_equal, "all_reduce_sums, " + test::magnitudes_name(m) +
                                 ": the full all-reduce's digits word for word" + figure);
  }
}

// The captured step's all-reduce (fused::NcclEnqueuedSums, bench/fused/nccl_enqueued.h):
// captured with a copy of the rank's digits in front, each replay's digits (every word
// added) equal the blocking, packed all_reduce_sums' word for word.
void check_enqueued_sums(dist::NcclProcessGroup& world, const std::vector<Tensor>& inputs,
                         Checks& checks) {
  const cudaStream_t stream = cuda::current_stream(world.device().index);
  const Tensor mine = inputs[static_cast<size_t>(world.rank())].to(world.device()).contiguous();
  const Tensor values = mine.view({mine.numel()});
  exact::ExactSums blocking = exact::ExactSums::of_values(values);
  world.all_reduce_sums(blocking);
  const exact::ExactSums source = exact::ExactSums::of_values(values);
  exact::ExactSums enqueued(source.count(), world.device());
  fused::NcclEnqueuedSums sums(world);
  checks.expect(sums.only_enqueues(), "NcclEnqueuedSums declares itself capturable");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t executable = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_CHECK(cudaMemcpyAsync(enqueued.digits(), source.digits(),
                             sizeof(int64_t) * static_cast<size_t>(source.words()),
                             cudaMemcpyDeviceToDevice, stream));
  sums.combine(enqueued);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&executable, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  bool all_equal = true;
  for (int replay = 0; replay < 3; ++replay) {
    CUDA_CHECK(cudaGraphLaunch(executable, stream));
    world.synchronize(stream);
    all_equal = all_equal && enqueued.to_host() == blocking.to_host();
  }
  CUDA_CHECK(cudaGraphExecDestroy(executable));
  checks.expect(all_equal, "all_reduce_sums_enqueue captured in a graph: 3 replays give "
                           "all_reduce_sums' digits word for word");
}

// Both extreme layouts of a world: all ranks in one sp group, or all in one dp group.
void check_mesh_groups(dist::NcclProcessGroup& world, const std::vector<Tensor>& inputs, Checks& checks) {
  const int size = world.size();
  for (int sp : {size, 1}) {
    const dist::Mesh mesh(size, sp, size / sp);
    const dist::MeshGroups groups = dist::build_mesh_groups(mesh, world);
    const std::string layout = "sp " + std::to_string(sp) + " x dp " + std::to_string(size / sp);
    Tensor over_sp = inputs[static_cast<size_t>(world.rank())].to(world.device());
    Tensor over_dp = over_sp.clone();
    groups.sp_group->all_reduce(over_sp, ReduceOp::Sum);
    groups.dp_group->all_reduce(over_dp, ReduceOp::Avg);
    const auto& sp_ranks = mesh.sp_group_of(world.rank());
    const auto& dp_ranks = mesh.dp_group_of(world.rank());
    checks.expect(matches_reference(over_sp.to_vector(), test::sequential_reduce(inputs, sp_ranks, ReduceOp::Sum),
                                    static_cast<int>(sp_ranks.size())),
                  layout + ": sum over " + groups.sp_group->name());
    checks.expect(matches_reference(over_dp.to_vector(), test::sequential_reduce(inputs, dp_ranks, ReduceOp::Avg),
                                    static_cast<int>(dp_ranks.size())),
                  layout + ": average over " + groups.dp_group->name());
    checks.expect(groups.sp_group->rank() == world.rank() % sp && groups.sp_group->global_ranks() == sp_ranks,
                  layout + ": sp group rank and members");
    checks.expect(identical_on_every_rank(*groups.sp_dp_group, over_sp) == (sp == size),
                  layout + ": the sp sums agree across the world exactly when sp spans it");
  }
}

// Rank `die_rank` leaves without a word after one good collective; every other rank
// must get an error from the next one, within the timeout, not hang.
int run_die_test(dist::NcclProcessGroup& world, int die_rank, std::chrono::milliseconds timeout,
                 bool enqueued) {
  Tensor values = Tensor::ones({1024}, world.device());
  world.all_reduce(values);
  if (world.rank() == die_rank) {
    std::printf("exiting on purpose before the next all_reduce\n");
    std::fflush(stdout);
    std::_Exit(0);  // no destructors, no goodbye: as if the process had been killed
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    if (enqueued) {
      const cudaStream_t stream = cuda::current_stream(world.device().index);
      world.enqueue("all_reduce", stream, [&](ncclComm_t communicator, cudaStream_t s) {
        return ncclAllReduce(values.data(), values.data(), static_cast<size_t>(values.numel()),
                             ncclFloat32, ncclSum, communicator, s);
      });  // returns: nothing waits yet
      world.synchronize(stream);
    } else {
      world.all_reduce(values);
    }
  } catch (const Error& error) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double limit = std::chrono::duration<double>(timeout).count() + 5.0;
    std::printf("%s expected error after %.2f s (limit %.1f s): %s\n", seconds <= limit ? "PASS" : "FAIL",
                seconds, limit, error.what());
    return seconds <= limit ? 0 : 1;
  }
  std::printf("FAIL all_reduce succeeded although rank %d is gone\n", die_rank);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (auto status = dist::maybe_launch(argc, argv)) return *status;
  int die_rank = -1;
  bool enqueued = false;
  std::chrono::milliseconds timeout(10000);
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--enqueued") {
      enqueued = true;
      --i;  // takes no value
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n", flag.c_str());
      return 2;
    } else if (flag == "--die-rank") {
      die_rank = std::atoi(argv[i + 1]);
    } else if (flag == "--timeout-ms") {
      timeout = std::chrono::milliseconds(std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  const auto environment = dist::launch_environment_from_process();
  if (!environment) {
    std::fprintf(stderr, "run with --nproc 2 (or under torchrun, mpirun or srun)\n");
    return 2;
  }
  try {
    dist::NcclOptions options;
    options.timeout = timeout;
    auto world = dist::NcclProcessGroup::create_world(*environment, options);
    std::printf("world of %d on %s, NCCL_ALGO=%s NCCL_PROTO=%s NCCL_NVLS_ENABLE=%s\n", world->size(),
                world->device().str().c_str(), std::getenv("NCCL_ALGO"), std::getenv("NCCL_PROTO"),
                std::getenv("NCCL_NVLS_ENABLE"));
    if (die_rank >= 0) return run_die_test(*world, die_rank, timeout, enqueued);
    const auto inputs = test::rank_inputs(world->size(), {1000, 41}, 1000);
    Checks checks;
    check_reductions(*world, inputs, checks);
    check_gather_broadcast_barrier(*world, inputs, checks);
    check_all_to_all(*world, checks);
    check_send_recv(*world, checks);
    check_enqueued(*world, inputs, checks);
    check_packed_sums(*world, checks);
    check_enqueued_sums(*world, inputs, checks);
    check_mesh_groups(*world, inputs, checks);
    std::printf("%s: %d check(s) failed\n", checks.failures ? "FAILED" : "ALL PASSED", checks.failures);
    return checks.failures ? 1 : 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
