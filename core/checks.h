// Small host-side checks that several layers share.
#pragma once

#include "core/device.h"
#include "core/error.h"

namespace seqpar {

// For an op's host paths in a build without CUDA: fails unless `device` is the CPU or
// the reference, with "<op>: <what> are on <device> but this seqpar was built without CUDA".
// `what` names the op's tensors: "tensors", "gradients", "parameters".
inline void require_host(const char* op, Device device, const char* what = "tensors") {
  SEQPAR_CHECK(device.is_host(), op, ": ", what, " are on ", device,
               " but this seqpar was built without CUDA");
}

}  // namespace seqpar
