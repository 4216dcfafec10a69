// The captured step's all-reduce over NCCL: the digits of exact sums added over a group
// inside a CUDA graph. Built only with NCCL (seqpar::fused_nccl), for seqpar-bench
// --nproc and its checks (tests/dist/nccl_test_main.cpp).
//
// A captured all-reduce's size is fixed when the graph is captured, so this one carries
// every word of the digits, as one ncclInt64 ncclSum: integer additions, the same bits
// for every algorithm NCCL may pick. (The blocking ProcessGroup::all_reduce_sums carries
// only the words some rank needs, which it learns by a collective of its own first: a
// size that changes with the data, which a replayed graph cannot have.)
#pragma once

#include <cuda_runtime.h>

#include "core/exact_sums.h"
#include "dist/nccl_process_group.h"

namespace seqpar::fused {

// Enqueues the in-place integer all-reduce of every word of `sums` on `stream` and
// returns once NCCL has launched it (dist::NcclProcessGroup::enqueue): capturable.
// Failures surface where the stream is next waited for (NcclProcessGroup::synchronize).
void all_reduce_sums_enqueue(dist::NcclProcessGroup& group, exact::ExactSums& sums,
                             cudaStream_t stream);

// An NCCL group as the combiner of a captured ExactL1Step's sums
// (bench/fused/exact_l1_step.h): combine() only enqueues all_reduce_sums_enqueue on the
// group's GPU's current stream, so a CUDA graph can capture it.
class NcclEnqueuedSums final : public exact::CrossRankSums {
 public:
  explicit NcclEnqueuedSums(dist::NcclProcessGroup& group) : group_(group) {}
  void combine(exact::ExactSums& sums) override;
  bool only_enqueues() const override { return true; }

 private:
  dist::NcclProcessGroup& group_;
};

}  // namespace seqpar::fused
