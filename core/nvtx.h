// NVTX ranges: named spans of host time that Nsight Systems shows on its timeline
// (`nsys profile --trace=cuda,nvtx,osrt seqpar-repro`), so a step reads as forward,
// backward, all-reduce and optimizer instead of a stream of anonymous kernels.
//
//   SEQPAR_NVTX_RANGE("adamw step");            // until the end of the scope
//   SEQPAR_NVTX_RANGE_TEXT("policy " + name);   // a name built at run time
//
// CUDA builds use NVTX 3, header-only (CUDA::nvtx3), which costs a branch per range
// unless a profiler is attached. CPU builds compile the ranges away entirely.
#pragma once

#include <string>

#include "seqpar/config.h"

#ifdef SEQPAR_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace seqpar {

class NvtxRange {
 public:
#ifdef SEQPAR_WITH_NVTX
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  explicit NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) {}
  explicit NvtxRange(const std::string&) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace seqpar

#define SEQPAR_NVTX_CONCAT_INNER(a, b) a##b
#define SEQPAR_NVTX_CONCAT(a, b) SEQPAR_NVTX_CONCAT_INNER(a, b)
#ifdef SEQPAR_WITH_NVTX
#define SEQPAR_NVTX_RANGE(name) \
  const ::seqpar::NvtxRange SEQPAR_NVTX_CONCAT(seqpar_nvtx_range_, __LINE__)(name)
#define SEQPAR_NVTX_RANGE_TEXT(text) SEQPAR_NVTX_RANGE(text)
#else
// Nothing is evaluated, not even a name built at run time.
#define SEQPAR_NVTX_RANGE(name) static_cast<void>(0)
#define SEQPAR_NVTX_RANGE_TEXT(text) static_cast<void>(0)
#endif
