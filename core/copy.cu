// CUDA paths of core/copy.h: fill and strided copy.
#include "core/copy.h"

#include <cuda.h>  // the driver API's types, for cuMemsetD32Async (found at run time)
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstring>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"

namespace seqpar::detail {

namespace {

constexpr int kThreads = 256;

// Launch at most this many blocks; grid-stride loops cover the rest.
constexpr int64_t kMaxBlocks = 65536;

__global__ void fill_kernel(float* data, int64_t count, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] = value;
  }
}

// Shapes and strides travel by value in the kernel's parameters.
struct CopyLayout {
  int rank;
  int64_t shape[kMaxCopyDims];
  int64_t destination_strides[kMaxCopyDims];
  int64_t source_strides[kMaxCopyDims];
};

__global__ void strided_copy_kernel(float* destination, const float* source, int64_t count,
                                    CopyLayout layout) {
  for (int64_t linear = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; linear < count;
       linear += int64_t{gridDim.x} * blockDim.x) {
    int64_t remaining = linear, destination_at = 0, source_at = 0;
    for (int d = layout.rank - 1; d >= 0; --d) {
      const int64_t index = remaining % layout.shape[d];
      remaining /= layout.shape[d];
      destination_at += index * layout.destination_strides[d];
      source_at += index * layout.source_strides[d];
    }
    destination[destination_at] = source[source_at];
  }
}

// The driver's cuMemsetD32Async, looked up once through the runtime (no link against
// libcuda), or null where the driver does not give it.
PFN_cuMemsetD32Async_v3020 memset_d32() {
  static PFN_cuMemsetD32Async_v3020 function = [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuMemsetD32Async", &found, 3020, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuMemsetD32Async_v3020>(nullptr);
    }
    return reinterpret_cast<PFN_cuMemsetD32Async_v3020>(found);
  }();
  return function;
}

}  // namespace

void fill_cuda(float* data, int64_t count, float value, int device) {
  if (count == 0) return;
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  // A fill is a memset of the value's 32 bits (any value: -0, NaN payloads and
  // subnormals are bits like any other), which costs the host about a third of a kernel
  // launch; zero_grad, Tensor::zeros and ones fill at every step of an eager loop.
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if (bits == 0) {
    CUDA_CHECK(cudaMemsetAsync(data, 0, sizeof(float) * static_cast<size_t>(count), stream));
    return;
  }
  if (const PFN_cuMemsetD32Async_v3020 memset32 = memset_d32()) {
    const CUresult result = memset32(reinterpret_cast<CUdeviceptr>(data), bits,
                                     static_cast<size_t>(count), stream);
    SEQPAR_CHECK(result == CUDA_SUCCESS, "cuMemsetD32Async of ", count, " floats on cuda:", device,
                 " failed with CUresult ", static_cast<int>(result));
    return;
  }
  fill_kernel<<<cuda::blocks_for(count, kThreads, kMaxBlocks), kThreads, 0, stream>>>(data, count, value);
  CUDA_LAUNCH_CHECK();
}

void strided_copy_cuda(float* destination, const Shape& destination_strides, const float* source,
                       const Shape& source_strides, const Shape& shape, int device) {
  CopyLayout layout{};
  layout.rank = static_cast<int>(shape.size());
  for (int d = 0; d < layout.rank; ++d) {
    layout.shape[d] = shape[d];
    layout.destination_strides[d] = destination_strides[d];
    layout.source_strides[d] = source_strides[d];
  }
  const int64_t count = shape_numel(shape);
  cuda::set_device(device);
  strided_copy_kernel<<<cuda::blocks_for(count, kThreads, kMaxBlocks), kThreads, 0, cuda::current_stream(device)>>>(
      destination, source, count, layout);
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::detail
