// NCCL_CHECK(call, rank): a failed NCCL call throws seqpar::Error naming the call,
// file:line, the (world) rank, NCCL's error string, ncclGetLastError() (NCCL's own
// description of what went wrong, often the only useful part) and the NCCL version.
//
// ncclInProgress is not a failure: a non-blocking communicator answers it while an
// operation is still being set up in the background. NcclProcessGroup then polls
// ncclCommGetAsyncError with a timeout.
#pragma once

#include <nccl.h>

#include <string>

#include "core/error.h"

namespace seqpar::dist::detail {

// "2.28.9" for the library actually loaded, which may differ from the header's.
inline std::string nccl_version_string() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // NCCL_VERSION(): major * 10000 + minor * 100 + patch since 2.9; * 1000 before.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

[[noreturn]] inline void throw_nccl_error(ncclResult_t status, const char* call, int rank,
                                          const char* file, int line) {
  const char* last_error = ncclGetLastError(nullptr);
  ::seqpar::detail::throw_error(
      file, line, nullptr,
      ::seqpar::detail::concat(call, " failed on rank ", rank, ": ", ncclGetErrorString(status),
                               " (last NCCL error: ",
                               last_error && *last_error ? last_error : "none",
                               "; NCCL ", nccl_version_string(), ")"));
}

}  // namespace seqpar::dist::detail

#define NCCL_CHECK(call, rank)                                                              \
  do {                                                                                      \
    const ncclResult_t seqpar_nccl_status_ = (call);                                        \
    if (seqpar_nccl_status_ != ncclSuccess && seqpar_nccl_status_ != ncclInProgress) {      \
      ::seqpar::dist::detail::throw_nccl_error(seqpar_nccl_status_, #call, (rank), __FILE__, \
                                               __LINE__);                                   \
    }                                                                                       \
  } while (0)
