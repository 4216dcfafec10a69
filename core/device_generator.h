// cuRAND's device generator (Philox4x32-10 running on the GPU), with the seed and
// offset semantics of seqpar::Generator: a draw of n values reads Philox positions
// [offset, offset + n).
//
// seqpar does not initialize with it: Generator computes values on the host and
// copies them, so CPU and GPU runs start from identical bits whatever the device's
// math library does. These functions exist so that a test can compare the two
// generators (tests/core/device_generator_test.cpp records what it found: uniform
// values agree bitwise; normal values may differ in the last bits).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "seqpar/config.h"

namespace seqpar {

#ifdef SEQPAR_WITH_CUDA
// Standard normal values, drawn on `device`'s current stream.
Tensor randn_on_device(uint64_t seed, uint64_t offset, const Shape& shape, int device);
// Uniform values in (0, 1], as Generator::uniform(shape, 0, 1) gives them.
Tensor uniform_on_device(uint64_t seed, uint64_t offset, const Shape& shape, int device);
#endif

}  // namespace seqpar
