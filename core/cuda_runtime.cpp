#include "core/cuda_runtime.h"

#include "core/error.h"

#ifdef SEQPAR_WITH_CUDA

#include <cstdint>
#include <mutex>
#include <vector>

#include "core/cuda_check.h"

namespace seqpar::cuda {

bool built() { return true; }

int device_count() {
  // cudaGetDeviceCount fails when there is no driver or it is too old; that is a
  // machine with zero usable devices, not an error. Asked once: the answer is fixed
  // for the life of the process.
  static const int count = [] {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky error left by the failed query
      return 0;
    }
    return devices;
  }();
  return count;
}

static void check_device_index(int device) {
  const int count = device_count();
  SEQPAR_CHECK(device >= 0 && device < count, "cuda:", device, " requested but this machine has ",
               count, " CUDA device(s)");
}

void set_device(int device) {
  check_device_index(device);
  CUDA_CHECK(cudaSetDevice(device));
}

namespace {

// One stream per device, and the device's memory pool configured on first use.
struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  int multiprocessors = 0;
};

DeviceState& state_of(int device) {
  static std::vector<DeviceState> states(static_cast<size_t>(device_count()));
  check_device_index(device);
  DeviceState& state = states[static_cast<size_t>(device)];
  std::call_once(state.once, [&] {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaDeviceGetAttribute(&state.multiprocessors, cudaDevAttrMultiProcessorCount, device));
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t keep_everything = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  });
  return state;
}

}  // namespace

Stream current_stream(int device) { return state_of(device).stream; }

int multiprocessor_count(int device) { return state_of(device).multiprocessors; }

void* allocate(size_t bytes, int device) {
  cudaStream_t stream = state_of(device).stream;
  CUDA_CHECK(cudaSetDevice(device));
  void* pointer = nullptr;
  if (bytes > 0) CUDA_CHECK(cudaMallocAsync(&pointer, bytes, stream));
  return pointer;
}

void release(void* pointer, int device) {
  if (pointer == nullptr) return;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaFreeAsync(pointer, state_of(device).stream));
}

void copy(void* destination, Device destination_device, const void* source, Device source_device,
          size_t bytes) {
  if (bytes == 0) return;
  if (destination_device.is_cuda() && source_device.is_cuda() &&
      destination_device.index != source_device.index) {
    synchronize(source_device.index);
    cudaStream_t stream = state_of(destination_device.index).stream;
    CUDA_CHECK(cudaMemcpyPeerAsync(destination, destination_device.index, source,
                                   source_device.index, bytes, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  const int device = destination_device.is_cuda() ? destination_device.index : source_device.index;
  cudaStream_t stream = state_of(device).stream;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream));
  // Host memory on either side may be pageable and reused as soon as we return.
  if (destination_device.is_cpu() || source_device.is_cpu()) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
}

void synchronize(int device) {
  cudaStream_t stream = state_of(device).stream;
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace seqpar::cuda

#else  // CPU-only build

namespace seqpar::cuda {

[[noreturn]] static void no_cuda(const char* what) {
  SEQPAR_FAIL(what, ": this seqpar was built without CUDA (configure with -DSEQPAR_CUDA=ON "
                    "on a machine with the CUDA toolkit)");
}

bool built() { return false; }
int device_count() { return 0; }
void set_device(int) { no_cuda("set_device"); }
Stream current_stream(int) { no_cuda("current_stream"); }
int multiprocessor_count(int) { no_cuda("multiprocessor_count"); }
void* allocate(size_t, int) { no_cuda("allocate"); }
void release(void*, int) {}
void copy(void*, Device, const void*, Device, size_t) { no_cuda("copy to or from a CUDA device"); }
void synchronize(int) { no_cuda("synchronize"); }

}  // namespace seqpar::cuda

#endif
