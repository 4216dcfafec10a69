// NcclProcessGroup: one process per GPU, collectives over NCCL. Compiled only when
// NCCL was found (SEQPAR_WITH_NCCL).
//
// Rendezvous: the launcher's environment (dist/environment.h) says this process's
// rank, the world size, its GPU (LOCAL_RANK) and where rank 0 listens. NCCL's
// unique id needs no side channel: with NCCL_COMM_ID=host:port set before
// ncclGetUniqueId, every rank computes the same id, and rank 0 hosts NCCL's own
// bootstrap at that address during ncclCommInitRankConfig.
//
// Sub-groups come from ncclCommSplit on the parent (color: member or not, key: the
// parent rank), collective over the parent like new_group must be.
//
// Never a hang: communicators are created non-blocking (ncclConfig_t.blocking = 0),
// and every wait (init, split, each collective) polls ncclCommGetAsyncError (and
// cudaStreamQuery for a collective) until it finishes, fails, or runs past the
// timeout. On failure or timeout the communicator is aborted (ncclCommAbort stops
// its kernels) and an error names the group and the operation. An aborted group
// refuses further calls.
//
// Collectives run on the device's stream (core/cuda_runtime.h) and return once the
// result is in the tensor: each call waits for its own completion, so a dead peer
// surfaces at the call that needed it.
//
// enqueue() is the exception, for work captured into CUDA graphs: it makes the caller's
// NCCL call on a stream and returns; it neither queries nor waits for the stream, so it
// is legal inside cudaStreamBeginCapture (the call becomes a node of the graph, and
// every replay is a collective call of all ranks). A failure on the device then
// surfaces at the next call that waits: synchronize(stream), or any blocking
// collective on the same stream, each bounded by the timeout. Wait through those, not
// cudaStreamSynchronize, to keep "never a hang" (the same for a replayed graph that
// holds a collective). The benchmarks' captured step adds its digits this way
// (bench/fused/nccl_enqueued.h).
//
// A non-blocking communicator usually answers a collective with ncclInProgress and
// finishes the launch on a thread of its own (NCCL 2.28: one thread per call or
// group); both ways of calling first wait, on the host, until that launch has
// settled, since NCCL refuses the next call on the communicator before then. That
// host wait is part of an eager call's latency; a captured graph pays it once, at
// capture.
//
// Deterministic mode (the default) pins NCCL's choices that change the order in
// which sums are taken: see nccl_process_group.cpp.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "dist/environment.h"
#include "dist/process_group.h"
#include "seqpar/config.h"

namespace seqpar::dist {

struct NcclOptions {
  // How long init, a split or a collective may take before the group is aborted.
  std::chrono::milliseconds timeout{60000};
  // Sets NCCL_NVLS_ENABLE=0 and, for worlds of more than two ranks (where the order
  // of additions depends on NCCL's choice), NCCL_ALGO=Ring and NCCL_PROTO=Simple,
  // unless the user already exported them.
  bool deterministic = true;
};

class NcclProcessGroup final : public ProcessGroup {
 public:
  // Collective over the whole world: every rank of `environment` calls it. Uses
  // cuda:LOCAL_RANK. Throws when the GPU is missing or init fails or times out.
  static std::shared_ptr<NcclProcessGroup> create_world(const LaunchEnvironment& environment,
                                                        NcclOptions options = {});
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }
  std::string name() const override { return name_; }

  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;

  // Stream-ordered and capturable: makes `call` with this group's communicator and
  // `stream` (one NCCL call, or several between ncclGroupStart and ncclGroupEnd) and
  // returns once NCCL has launched it, without waiting for the device; a failure to
  // launch, or a launch that does not settle within the timeout, aborts the group as a
  // blocking call's would, naming `operation`. Every rank must make the same calls in the
  // same order, captured or not alike.
  using NcclCall = std::function<ncclResult_t(ncclComm_t communicator, cudaStream_t stream)>;
  void enqueue(const char* operation, cudaStream_t stream, const NcclCall& call);
  // Waits until everything queued on `stream` has finished, within the timeout;
  // where enqueued collectives report their failures (an NCCL error, a dead peer),
  // aborting the group like a blocking call. Not while `stream` is being captured.
  void synchronize(cudaStream_t stream);
  void all_gather(Tensor& output, const Tensor& input) override;
  // One ncclSend and one ncclRecv per peer between ncclGroupStart and ncclGroupEnd:
  // NCCL has no all-to-all call of its own.
  void all_to_all(Tensor& output, const Tensor& input) override;
  // One ncclSend and one ncclRecv between ncclGroupStart and ncclGroupEnd, so that the
  // ring's sends and receives cannot wait on each other. NCCL cannot see the peers'
  // shapes: a mismatch fails in NCCL (or at the timeout), not with the threads
  // group's message naming both ranks.
  void send_recv(Tensor& output, const Tensor& input, int send_to, int receive_from) override;
  void broadcast(Tensor& tensor, int root = 0) override;
  void barrier() override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          const std::string& name) override;

  Device device() const { return Device::cuda(device_); }
  // The raw communicator, for comparing against direct NCCL calls (benchmarks).
  ncclComm_t communicator() const { return communicator_; }

 protected:
  // ncclInt64 with ncclSum or ncclMax: integer operations, the same bits for every
  // algorithm and protocol NCCL may pick, so nothing needs pinning for these.
  void all_reduce_words(int64_t* words, int64_t count, WordOp op, const DigitsCall& call) override;

 private:
  NcclProcessGroup(ncclComm_t communicator, int rank, std::vector<int> global_ranks,
                   std::string name, int device, NcclOptions options);

  int world_rank() const { return global_ranks_[static_cast<size_t>(rank_)]; }
  void check_usable(const char* operation) const;
  void check_tensor(const char* operation, const Tensor& tensor) const;
  template <typename Launch>
  void run_collective(const char* operation, Launch launch);
  template <typename Launch>
  void launch_and_settle(const char* operation, cudaStream_t stream,
                         std::chrono::steady_clock::time_point deadline, Launch launch);
  void wait_for_stream(const char* operation, cudaStream_t stream,
                       std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void abort(const char* operation, const std::string& reason);

  ncclComm_t communicator_;
  int rank_;
  std::vector<int> global_ranks_;
  std::string name_;
  int device_;
  NcclOptions options_;
  bool aborted_ = false;
  std::string abort_reason_;
  Tensor barrier_buffer_;  // one float on the device, reduced by barrier()
};

}  // namespace seqpar::dist
