// Asynchronous shared-memory pipelines on sm_80+ (cp.async) and sm_90 (mbarrier
// parity waits): the few PTX instructions the producer/consumer kernels use, each
// wrapped once with what it guarantees.
//
//   copy_async16 / copy_async4   global -> shared without a register round trip; the
//                                copy completes in the background (the _or_zero forms
//                                write zeros instead when told not to copy, the _prefix
//                                form zeros after the bytes it copies).
//   commit_copies / wait_copies  a thread's copies since its last commit form a group;
//                                wait_copies<N> returns once at most N of the thread's
//                                groups are still in flight. The data is then visible
//                                to the thread itself; other threads need a barrier.
//   Barrier (mbarrier)           a phase completes after `count` arrivals; waiters
//                                spin on the parity of the phase they expect. An
//                                arrival releases the arriving thread's earlier writes
//                                (cp.async data it waited for included), a completed
//                                wait acquires them: the two sides of a ring buffer
//                                slot. arrive_when_copied() arrives once the thread's
//                                copies so far have landed: a barrier that says "the
//                                data is in shared memory".
#pragma once

#include <cstdint>

namespace seqpar::cuda {

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// 16 bytes, both addresses 16-byte aligned; .cg: cached in L2 only.
__device__ __forceinline__ void copy_async16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)),
               "l"(global)
               : "memory");
}

// 4 bytes, both addresses 4-byte aligned.
__device__ __forceinline__ void copy_async4(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(shared)),
               "l"(global)
               : "memory");
}

// As copy_async16 / copy_async4, but when `copy` is false nothing is read and the
// destination is filled with zeros (cp.async's src-size operand); `global` must still
// be a valid address. The destination as a pointer or as a shared-memory address
// (shared_address), which a kernel can work out once and offset.
// The first `bytes` (0 to 16) of the 16 copied, the rest zeros: a row's last, partial
// 16 bytes without reading past it.
__device__ __forceinline__ void copy_async16_prefix(unsigned shared, const void* global, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void copy_async16_or_zero(unsigned shared, const void* global, bool copy) {
  copy_async16_prefix(shared, global, copy ? 16u : 0u);
}
__device__ __forceinline__ void copy_async16_or_zero(void* shared, const void* global, bool copy) {
  copy_async16_or_zero(shared_address(shared), global, copy);
}
__device__ __forceinline__ void copy_async4_or_zero(unsigned shared, const void* global, bool copy) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global),
               "r"(copy ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async4_or_zero(void* shared, const void* global, bool copy) {
  copy_async4_or_zero(shared_address(shared), global, copy);
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kInFlight>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight) : "memory");
}

// An mbarrier in shared memory. init() by one thread, then a __syncthreads() before
// anyone else uses it.
struct Barrier {
  uint64_t word;

  __device__ __forceinline__ void init(unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(&word)),
                 "r"(count)
                 : "memory");
  }
  // Release semantics at block scope (the default of mbarrier.arrive).
  __device__ __forceinline__ void arrive() {
    asm volatile(
        "{\n\t.reg .b64 state;\n\t"
        "mbarrier.arrive.shared::cta.b64 state, [%0];\n\t}\n" ::"r"(shared_address(&word))
        : "memory");
  }
  // An arrival made when all of this thread's earlier cp.async copies have landed
  // (counts as one of the phase's `count` arrivals): the waiters then see the data.
  __device__ __forceinline__ void arrive_when_copied() {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(&word))
                 : "memory");
  }
  // Returns once the phase with this parity has completed (acquire semantics). Phase
  // n of a barrier has parity n % 2; a waiter must not fall two phases behind.
  __device__ __forceinline__ void wait(unsigned parity) {
    unsigned done = 0;
    do {
      asm volatile(
          "{\n\t.reg .pred complete;\n\t"
          "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n\t"
          "selp.u32 %0, 1, 0, complete;\n\t}\n"
          : "=r"(done)
          : "r"(shared_address(&word)), "r"(parity)
          : "memory");
    } while (done == 0);
  }
};

}  // namespace seqpar::cuda
