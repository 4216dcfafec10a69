#include "dist/nccl_process_group.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "dist/all_to_all.h"
#include "core/nvtx.h"
#include "dist/nccl_check.h"

namespace seqpar::dist {

namespace {

using Clock = std::chrono::steady_clock;

// Deterministic mode. For every call NCCL's tuner picks an algorithm (ring, tree,
// NVLS, ...) and a protocol (LL, LL128, Simple) from the message size and the
// topology. Each algorithm adds the ranks' values in its own order, and the
// protocol decides how the data is cut into chunks (so where each ring step
// starts): the same inputs can round differently depending on what was picked,
// for instance after a change of bucket size. Ring + Simple leaves one order, fixed
// for a given world, message size and channel count. NVLink SHARP (NVLS) reduces
// inside the NVSwitch, in an order NCCL does not control, and the GPU hosts we run on
// need multicast off (docs/gpu.md). With at most two ranks every element is one
// addition a + b, the same bits whatever NCCL picks, so the world of two keeps NCCL's
// choice: its low-latency protocol is much faster for the step's small gradient
// all-reduce (measured: see bench/RESULTS.md). A value the user already exported wins
// (overwrite = 0): this is a default, not a lock.
void pin_nccl_choices(int world_size) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  if (world_size <= 2) return;
  setenv("NCCL_ALGO", "Ring", 0);
  setenv("NCCL_PROTO", "Simple", 0);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // float32: each input times float(1 / size), then summed
    case ReduceOp::Max: return ncclMax;
  }
  SEQPAR_FAIL("unknown reduce op");
}

// A 41 KB all-reduce takes tens of microseconds: spin first, then sleep so a long
// wait (a slow peer) does not burn a core.
void back_off(int polls) {
  if (polls < 2000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// NCCL writes the communicator handle from its own init thread as well; read it
// the way it is written.
ncclComm_t load(ncclComm_t& slot) { return __atomic_load_n(&slot, __ATOMIC_ACQUIRE); }

// Polls a communicator that NCCL is still working on in the background (init, a
// split, a deferred launch) until it settles. Returns its state, or ncclInProgress
// when the deadline came first.
ncclResult_t wait_until_settled(ncclComm_t communicator, Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(communicator, &state);
    if (queried != ncclSuccess) return queried;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    back_off(polls);
  }
}

std::string describe(ncclResult_t state) {
  const char* last_error = ncclGetLastError(nullptr);
  return std::string(ncclGetErrorString(state)) + " (last NCCL error: " +
         (last_error && *last_error ? last_error : "none") + "; NCCL " +
         detail::nccl_version_string() + ")";
}

std::string timeout_text(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << "did not finish within " << std::setprecision(3)
      << std::chrono::duration<double>(timeout).count()
      << " s (a peer rank may have died, or be stuck elsewhere)";
  return out.str();
}

std::string failure_text(ncclResult_t state, std::chrono::milliseconds timeout) {
  return state == ncclInProgress ? timeout_text(timeout) : describe(state);
}

}  // namespace

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::create_world(const LaunchEnvironment& env,
                                                                 NcclOptions options) {
  const int devices = cuda::device_count();
  SEQPAR_CHECK(env.local_rank < devices, "init on group world: rank ", env.rank, " wants cuda:",
               env.local_rank, " (its local rank) but this machine has ", devices,
               " CUDA device(s); NCCL needs one GPU per rank");
  if (options.deterministic) pin_nccl_choices(env.world_size);
  // Read by ncclGetUniqueId on every rank (so all compute the same id) and by rank
  // 0's init, which then hosts the bootstrap root at this address.
  setenv("NCCL_COMM_ID", env.nccl_comm_id.c_str(), 1);
  cuda::set_device(env.local_rank);

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id), env.rank);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t communicator = nullptr;
  const ncclResult_t started =
      ncclCommInitRankConfig(&communicator, env.world_size, id, env.rank, &config);
  if (started != ncclSuccess && started != ncclInProgress && load(communicator) != nullptr) {
    ncclCommAbort(load(communicator));  // release what a failed start left behind
  }
  NCCL_CHECK(started, env.rank);
  SEQPAR_CHECK(load(communicator) != nullptr, "init on group world: NCCL returned no communicator");
  const ncclResult_t state = wait_until_settled(load(communicator), Clock::now() + options.timeout);
  if (state != ncclSuccess) {
    ncclCommAbort(load(communicator));
    SEQPAR_FAIL("init on group world: rank ", env.rank, " of ", env.world_size, " (NCCL_COMM_ID=",
                env.nccl_comm_id, "): ", failure_text(state, options.timeout));
  }
  std::vector<int> ranks(static_cast<size_t>(env.world_size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::shared_ptr<NcclProcessGroup>(new NcclProcessGroup(
      load(communicator), env.rank, std::move(ranks), "world", env.local_rank, options));
}

NcclProcessGroup::NcclProcessGroup(ncclComm_t communicator, int rank, std::vector<int> global_ranks,
                                   std::string name, int device, NcclOptions options)
    : communicator_(communicator),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      name_(std::move(name)),
      device_(device),
      options_(options),
      barrier_buffer_(Tensor::zeros({1}, Device::cuda(device))) {}

// Finalize flushes this rank's outstanding work, which a dead peer can stall
// forever: bounded by the timeout like every other wait, and aborted past it.
NcclProcessGroup::~NcclProcessGroup() {
  if (aborted_) return;  // ncclCommAbort already released everything
  ncclResult_t state = ncclCommFinalize(communicator_);
  if (state == ncclSuccess || state == ncclInProgress) {
    state = wait_until_settled(communicator_, Clock::now() + options_.timeout);
  }
  if (state == ncclSuccess) {
    ncclCommDestroy(communicator_);
  } else {
    ncclCommAbort(communicator_);
  }
}

void NcclProcessGroup::check_usable(const char* operation) const {
  SEQPAR_CHECK(!aborted_, operation, " on group ", name_, ": the group was aborted earlier (",
               abort_reason_, ")");
}

void NcclProcessGroup::check_tensor(const char* operation, const Tensor& tensor) const {
  SEQPAR_CHECK(tensor.defined(), operation, " on group ", name_, ": the tensor is undefined");
  SEQPAR_CHECK(tensor.device() == device(), operation, " on group ", name_, ": the tensor is on ",
               tensor.device(), " but this rank's communicator is on ", device());
}

void NcclProcessGroup::abort(const char* operation, const std::string& reason) {
  ncclCommAbort(communicator_);  // also stops this communicator's kernels on the device
  aborted_ = true;
  abort_reason_ = std::string(operation) + ": " + reason;
  SEQPAR_FAIL(operation, " on group ", name_, " (rank ", world_rank(), "): ", reason,
              "; the group is aborted");
}

// Makes one NCCL call (or group) on `stream` and waits, on the host only, until NCCL
// has launched it: a non-blocking communicator may answer ncclInProgress and finish
// the launch in the background (on first use it also connects to its peers), and
// refuses the next call until then. Nothing here touches the stream, so this is
// legal while the stream is being captured.
template <typename Launch>
void NcclProcessGroup::launch_and_settle(const char* operation, cudaStream_t stream,
                                         Clock::time_point deadline, Launch launch) {
  const ncclResult_t launched = launch(stream);
  if (launched == ncclInProgress) {
    const ncclResult_t state = wait_until_settled(communicator_, deadline);
    if (state != ncclSuccess) abort(operation, failure_text(state, options_.timeout));
  } else if (launched != ncclSuccess) {
    abort(operation, describe(launched));
  }
}

// Enqueues one NCCL call on the device's stream and waits for it, within one
// deadline for the whole call.
template <typename Launch>
void NcclProcessGroup::run_collective(const char* operation, Launch launch) {
  SEQPAR_NVTX_RANGE(operation);
  check_usable(operation);
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  cuda::set_device(device_);
  const cudaStream_t stream = cuda::current_stream(device_);
  launch_and_settle(operation, stream, deadline, launch);
  wait_for_stream(operation, stream, deadline);
}

void NcclProcessGroup::wait_for_stream(const char* operation, cudaStream_t stream,
                                       Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) {
      abort(operation, std::string("the stream failed: ") + cudaGetErrorName(done) + " (" +
                           cudaGetErrorString(done) + ")");
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(communicator_, &state);
    if (state != ncclSuccess && state != ncclInProgress) abort(operation, describe(state));
    if (Clock::now() >= deadline) abort(operation, timeout_text(options_.timeout));
    back_off(polls);
  }
}

void NcclProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  if (tensor.numel() == 0) return;  // every rank has the same shape, so every rank skips
  if (op != ReduceOp::Max) return all_reduce_exact(tensor, op);
  Tensor buffer = tensor.contiguous();  // NCCL works on one dense block
  const size_t count = static_cast<size_t>(buffer.numel());
  run_collective("all_reduce", [&](cudaStream_t stream) {
    return ncclAllReduce(buffer.data(), buffer.data(), count, ncclFloat32, nccl_op(op),
                         communicator_, stream);
  });
  if (!tensor.is_contiguous()) tensor.copy_(buffer);
}

void NcclProcessGroup::all_reduce_words(int64_t* words, int64_t count, WordOp op,
                                        const DigitsCall& call) {
  static_assert(sizeof(long long) == sizeof(int64_t), "ncclInt64 is a 64-bit integer");
  check_usable(call.operation);
  SEQPAR_CHECK(call.sums->device() == device(), call.operation, " on group ", name_,
               ": the sums are on ", call.sums->device(), " but the group's GPU is cuda:", device_);
  if (count == 0) return;  // every rank has the same count, so every rank skips
  run_collective(call.operation, [&](cudaStream_t stream) {
    return ncclAllReduce(words, words, static_cast<size_t>(count), ncclInt64,
                         op == WordOp::Max ? ncclMax : ncclSum, communicator_, stream);
  });
}

void NcclProcessGroup::enqueue(const char* operation, cudaStream_t stream, const NcclCall& call) {
  check_usable(operation);
  cuda::set_device(device_);
  launch_and_settle(operation, stream, Clock::now() + options_.timeout,
                    [&](cudaStream_t s) { return call(communicator_, s); });
}

void NcclProcessGroup::synchronize(cudaStream_t stream) {
  check_usable("synchronize");
  cuda::set_device(device_);
  wait_for_stream("synchronize", stream, Clock::now() + options_.timeout);
}

void NcclProcessGroup::all_gather(Tensor& output, const Tensor& input) {
  check_tensor("all_gather", input);
  check_tensor("all_gather", output);
  SEQPAR_CHECK(input.dim() >= 1, "all_gather on group ", name_,
               ": the input must have at least one dimension");
  Shape expected = input.shape();
  expected[0] *= size();
  SEQPAR_CHECK(output.shape() == expected, "all_gather on group ", name_, ": output ",
               output.shape(), " should be ", expected);
  if (input.numel() == 0) return;
  const Tensor send = input.contiguous();
  Tensor receive = output.is_contiguous() ? output : Tensor::empty(expected, output.device());
  const size_t count = static_cast<size_t>(send.numel());
  run_collective("all_gather", [&](cudaStream_t stream) {
    return ncclAllGather(send.data(), receive.data(), count, ncclFloat32, communicator_, stream);
  });
  if (!output.is_contiguous()) output.copy_(receive);
}

void NcclProcessGroup::all_to_all(Tensor& output, const Tensor& input) {
  check_tensor("all_to_all", input);
  check_tensor("all_to_all", output);
  check_all_to_all_arguments("all_to_all on group " + name_, output, input, size());
  if (input.numel() == 0) return;  // every rank has the same shape, so every rank skips
  const Tensor send = input.contiguous();
  // NCCL must not receive into the buffer it sends from.
  Tensor receive = output.is_contiguous() && output.storage() != send.storage()
                       ? output
                       : Tensor::empty(output.shape(), output.device());
  const size_t chunk = static_cast<size_t>(send.numel() / size());
  run_collective("all_to_all", [&](cudaStream_t stream) {
    // The pattern of nccl-tests' alltoall. The group is closed whatever happens inside
    // it; the first failure is the one reported (a non-blocking communicator may answer
    // ncclInProgress, which launch_and_settle waits out).
    auto failed = [](ncclResult_t state) { return state != ncclSuccess && state != ncclInProgress; };
    ncclResult_t state = ncclGroupStart();
    if (failed(state)) return state;
    for (int peer = 0; peer < size() && !failed(state); ++peer) {
      const size_t at = static_cast<size_t>(peer) * chunk;
      state = ncclSend(send.data() + at, chunk, ncclFloat32, peer, communicator_, stream);
      if (!failed(state)) {
        state = ncclRecv(receive.data() + at, chunk, ncclFloat32, peer, communicator_, stream);
      }
    }
    const ncclResult_t ended = ncclGroupEnd();
    return failed(state) ? state : ended;
  });
  if (receive.data() != output.data()) output.copy_(receive);
}

void NcclProcessGroup::send_recv(Tensor& output, const Tensor& input, int send_to, int receive_from) {
  check_tensor("send_recv", input);
  check_tensor("send_recv", output);
  check_send_recv_arguments("send_recv on group " + name_, output, input, send_to, receive_from, size());
  if (input.numel() == 0) return;  // every rank has the same shape, so every rank skips
  const Tensor send = input.contiguous();
  // As all_to_all: NCCL must not receive into the buffer it sends from.
  Tensor receive = output.is_contiguous() && output.storage() != send.storage()
                       ? output
                       : Tensor::empty(output.shape(), output.device());
  const size_t count = static_cast<size_t>(send.numel());
  run_collective("send_recv", [&](cudaStream_t stream) {
    auto failed = [](ncclResult_t state) { return state != ncclSuccess && state != ncclInProgress; };
    ncclResult_t state = ncclGroupStart();
    if (failed(state)) return state;
    state = ncclSend(send.data(), count, ncclFloat32, send_to, communicator_, stream);
    if (!failed(state)) state = ncclRecv(receive.data(), count, ncclFloat32, receive_from, communicator_, stream);
    const ncclResult_t ended = ncclGroupEnd();  // closed whatever happened inside it
    return failed(state) ? state : ended;
  });
  if (receive.data() != output.data()) output.copy_(receive);
}

void NcclProcessGroup::broadcast(Tensor& tensor, int root) {
  check_tensor("broadcast", tensor);
  SEQPAR_CHECK(root >= 0 && root < size(), "broadcast on group ", name_, ": root ", root,
               " is not a rank of a group of ", size());
  if (tensor.numel() == 0) return;
  Tensor buffer = tensor.contiguous();
  const size_t count = static_cast<size_t>(buffer.numel());
  run_collective("broadcast", [&](cudaStream_t stream) {
    return ncclBroadcast(buffer.data(), buffer.data(), count, ncclFloat32, root, communicator_,
                         stream);
  });
  if (!tensor.is_contiguous()) tensor.copy_(buffer);
}

// NCCL has no barrier: a one-float all-reduce that every rank must join does it.
void NcclProcessGroup::barrier() {
  run_collective("barrier", [&](cudaStream_t stream) {
    return ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1, ncclFloat32, ncclSum,
                         communicator_, stream);
  });
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group(const std::vector<int>& ranks,
                                                          const std::string& name) {
  const char* operation = "new_group";
  check_usable(operation);
  const std::vector<int> members = checked_member_ranks(ranks, size(), name_);
  const auto position = std::find(members.begin(), members.end(), rank_);
  const bool member = position != members.end();
  std::vector<int> member_world_ranks;
  for (int m : members) member_world_ranks.push_back(global_ranks_[static_cast<size_t>(m)]);
  const std::string group_name =
      name.empty() ? "group[" + rank_list_label(member_world_ranks) + "]" : name;

  cuda::set_device(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  // Every rank of this group calls it; key = our rank keeps the members in order.
  const ncclResult_t split =
      ncclCommSplit(communicator_, member ? 0 : NCCL_SPLIT_NOCOLOR, rank_, &child, &config);
  if (split != ncclSuccess && split != ncclInProgress) abort(operation, describe(split));
  // The split runs as a background job of the parent: wait for the parent first.
  const Clock::time_point deadline = Clock::now() + options_.timeout;
  const ncclResult_t parent_state = wait_until_settled(communicator_, deadline);
  if (parent_state != ncclSuccess) abort(operation, failure_text(parent_state, options_.timeout));
  if (!member) return nullptr;

  SEQPAR_CHECK(load(child) != nullptr, "new_group on group ", name_, ": NCCL returned no communicator for ",
               group_name);
  const ncclResult_t child_state = wait_until_settled(load(child), deadline);
  if (child_state != ncclSuccess) {
    ncclCommAbort(load(child));
    SEQPAR_FAIL("new_group on group ", name_, ": the new group ", group_name,
                " failed to start: ", failure_text(child_state, options_.timeout));
  }
  return std::shared_ptr<NcclProcessGroup>(
      new NcclProcessGroup(load(child), static_cast<int>(position - members.begin()),
                           std::move(member_world_ranks), group_name, device_, options_));
}

}  // namespace seqpar::dist
