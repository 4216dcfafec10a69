#include "core/device_buffer.h"

#include <cstdlib>
#include <cstring>

#ifdef SEQPAR_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace seqpar::detail {

namespace {
constexpr size_t kHostAlignment = 64;  // as Storage's host blocks
}

void* buffer_allocate(size_t bytes, Device device) {
  if (device.is_cuda()) return bytes == 0 ? nullptr : cuda::allocate(bytes, device.index);
  const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  if (rounded == 0) return nullptr;
  void* data = std::aligned_alloc(kHostAlignment, rounded);
  SEQPAR_CHECK(data != nullptr, "out of host memory allocating ", bytes, " bytes");
  return data;
}

void buffer_release(void* data, size_t bytes, Device device) noexcept {
  if (data == nullptr) return;
  if (device.is_cuda()) {
    try {  // a failed free leaves the block to the pool
      cuda::release(data, bytes, device.index);
    } catch (...) {
    }
  } else {
    std::free(data);
  }
}

void buffer_zero(void* data, size_t bytes, Device device) {
  if (bytes == 0) return;
  if (device.is_host()) {
    std::memset(data, 0, bytes);
    return;
  }
#ifdef SEQPAR_WITH_CUDA
  cuda::set_device(device.index);
  CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, cuda::current_stream(device.index)));
#else
  SEQPAR_FAIL("zero on ", device, ": this seqpar was built without CUDA");
#endif
}

void buffer_copy_from_host(void* data, Device device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (device.is_host()) {
    std::memcpy(data, host, bytes);
    return;
  }
  cuda::copy(data, device, host, Device::cpu(), bytes);
}

}  // namespace seqpar::detail
