#include "core/cuda_runtime.h"

#include "core/error.h"

#ifdef SEQPAR_WITH_CUDA

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
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

// Freed blocks kept for the next allocation of the same size on the device. Every
// allocation and every kernel of a device's memory is ordered by its one stream, so a
// block freed by the host can be handed out again at once: whatever the stream still
// does with it comes before what the new owner enqueues. This is the pool's own rule
// for cudaFreeAsync on one stream; the cache only skips the driver's two calls, which
// were most of an eager op's allocation cost. A
// training step allocates the same sizes every step, so sizes match exactly (rounded
// up to kGranule). Blocks above kLargestCached go back to the pool (their kernels
// outweigh the calls), as does what would take the cache past kMostCached.
//
// While the stream is being captured into a graph, blocks come from and go to the
// pool: the graph must own what it allocates (cudaMallocAsync in a capture makes a
// node), and a block it allocated is freed to the pool, never cached, even after the
// capture (the graph may still use it on replay).
class BlockCache {
 public:
  static constexpr size_t kGranule = 512;
  static constexpr size_t kLargestCached = size_t{16} << 20;
  static constexpr size_t kMostCached = size_t{1} << 30;

  static size_t rounded(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }

  // A cached block of `bytes` (rounded), or null.
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(bytes);
    if (found == free_.end() || found->second.empty()) return nullptr;
    void* pointer = found->second.back();
    found->second.pop_back();
    cached_bytes_ -= bytes;
    return pointer;
  }
  // Whether the cache keeps the block (else the caller frees it).
  bool keep(void* pointer, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!graph_owned_.empty() && graph_owned_.erase(pointer) > 0) return false;
    if (bytes > kLargestCached || cached_bytes_ + bytes > kMostCached) return false;
    free_[bytes].push_back(pointer);
    cached_bytes_ += bytes;
    return true;
  }
  // A block allocated during a capture is the graph's: noted until it is freed, by the
  // graph itself (a free node, also during the capture) or later (then not cached).
  void note_graph_owned(void* pointer) {
    std::lock_guard<std::mutex> lock(mutex_);
    graph_owned_.insert(pointer);
  }
  void forget_graph_owned(void* pointer) {
    std::lock_guard<std::mutex> lock(mutex_);
    graph_owned_.erase(pointer);
  }
  // Every cached block, handed back (to free them to the pool).
  std::vector<void*> drain() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<void*> all;
    for (auto& [bytes, blocks] : free_) all.insert(all.end(), blocks.begin(), blocks.end());
    free_.clear();
    cached_bytes_ = 0;
    return all;
  }
  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // by rounded size
  std::unordered_set<void*> graph_owned_;
  size_t cached_bytes_ = 0;
};

// One stream per device, the device's memory pool configured on first use, and its
// block cache.
struct DeviceState {
  std::once_flag once;
  cudaStream_t stream = nullptr;
  int multiprocessors = 0;
  BlockCache cache;
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

bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

int multiprocessor_count(int device) { return state_of(device).multiprocessors; }

void* allocate(size_t bytes, int device) {
  if (bytes == 0) return nullptr;
  DeviceState& state = state_of(device);
  const size_t size = BlockCache::rounded(bytes);
  const bool in_capture = capturing(state.stream);
  if (!in_capture) {
    if (void* cached = state.cache.take(size)) return cached;
  }
  CUDA_CHECK(cudaSetDevice(device));
  void* pointer = nullptr;
  cudaError_t status = cudaMallocAsync(&pointer, size, state.stream);
  if (status == cudaErrorMemoryAllocation && !in_capture && state.cache.cached_bytes() > 0) {
    (void)cudaGetLastError();  // the failed allocation's error; retry after emptying the cache
    release_cached(device);
    status = cudaMallocAsync(&pointer, size, state.stream);
  }
  CUDA_CHECK(status);
  if (in_capture) state.cache.note_graph_owned(pointer);
  return pointer;
}

void release(void* pointer, size_t bytes, int device) {
  if (pointer == nullptr) return;
  DeviceState& state = state_of(device);
  if (capturing(state.stream)) {
    state.cache.forget_graph_owned(pointer);  // the graph frees it: no note left behind
  } else if (state.cache.keep(pointer, BlockCache::rounded(bytes))) {
    return;
  }
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaFreeAsync(pointer, state.stream));
}

void release_cached(int device) {
  DeviceState& state = state_of(device);
  const std::vector<void*> blocks = state.cache.drain();
  if (blocks.empty()) return;
  CUDA_CHECK(cudaSetDevice(device));
  for (void* block : blocks) CUDA_CHECK(cudaFreeAsync(block, state.stream));
}

size_t cached_bytes(int device) { return state_of(device).cache.cached_bytes(); }

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
  if (destination_device.is_host() || source_device.is_host()) {
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
bool capturing(Stream) { return false; }
int multiprocessor_count(int) { no_cuda("multiprocessor_count"); }
void* allocate(size_t, int) { no_cuda("allocate"); }
void release(void*, size_t, int) {}
void release_cached(int) {}
size_t cached_bytes(int) { return 0; }
void copy(void*, Device, const void*, Device, size_t) { no_cuda("copy to or from a CUDA device"); }
void synchronize(int) { no_cuda("synchronize"); }

}  // namespace seqpar::cuda

#endif
