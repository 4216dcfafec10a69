#include "core/storage.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace seqpar {

// Host blocks are 64-byte aligned: a cache line, and enough for any vector load.
static constexpr size_t kHostAlignment = 64;

Storage::Storage(size_t elements, Device device) : elements_(elements), device_(device) {
  SEQPAR_CHECK(elements <= (SIZE_MAX - kHostAlignment) / sizeof(float), "storage of ", elements,
               " floats: the size in bytes overflows");
  const size_t bytes = elements * sizeof(float);
  if (device.is_cuda()) {
    data_ = static_cast<float*>(cuda::allocate(bytes, device.index));
    return;
  }
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (rounded == 0) return;
  data_ = static_cast<float*>(std::aligned_alloc(kHostAlignment, rounded));
  SEQPAR_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
}

Storage::~Storage() {
  if (device_.is_cuda()) {
    // A destructor must not throw; a failed free leaves the block to the pool.
    try {
      cuda::release(data_, elements_ * sizeof(float), device_.index);
    } catch (...) {
    }
  } else {
    std::free(data_);
  }
}

}  // namespace seqpar
