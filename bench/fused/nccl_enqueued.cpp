#include "bench/fused/nccl_enqueued.h"

#include <nccl.h>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace seqpar::fused {

void all_reduce_sums_enqueue(dist::NcclProcessGroup& group, exact::ExactSums& sums,
                             cudaStream_t stream) {
  static_assert(sizeof(long long) == sizeof(int64_t), "ncclInt64 is a 64-bit integer");
  const char* operation = "all_reduce_sums_enqueue";
  SEQPAR_CHECK(sums.device() == group.device(), operation, " on group ", group.name(),
               ": the sums are on ", sums.device(), " but the group's GPU is ", group.device());
  if (sums.count() == 0) return;  // every rank has the same count, so every rank skips
  group.enqueue(operation, stream, [&](ncclComm_t communicator, cudaStream_t s) {
    return ncclAllReduce(sums.digits(), sums.digits(), static_cast<size_t>(sums.words()), ncclInt64,
                         ncclSum, communicator, s);
  });
}

void NcclEnqueuedSums::combine(exact::ExactSums& sums) {
  all_reduce_sums_enqueue(group_, sums, cuda::current_stream(group_.device().index));
}

}  // namespace seqpar::fused
