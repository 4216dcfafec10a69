// CURAND_CHECK: wraps every cuRAND call (host and device generators alike); a failure
// throws seqpar::Error naming the call, file:line and cuRAND's status code.
#pragma once

#include <curand.h>

#include "core/error.h"

#define CURAND_CHECK(call)                                                         \
  do {                                                                             \
    const curandStatus_t seqpar_status_ = (call);                                  \
    SEQPAR_CHECK(seqpar_status_ == CURAND_STATUS_SUCCESS, #call,                   \
                 " failed with curandStatus_t ", static_cast<int>(seqpar_status_)); \
  } while (0)
