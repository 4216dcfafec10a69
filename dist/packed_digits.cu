// CUDA paths of dist/packed_digits.h: one block per chunk of sums, one thread per sum of
// the chunk, so a word's digits are read and written side by side.
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/exact_bins.h"
#include "dist/packed_digits.h"

namespace seqpar::dist::detail {

namespace {

constexpr int kThreads = static_cast<int>(kSumsPerChunk);
using exact::kDigits;

__global__ void find_digit_spans_kernel(const int64_t* digits, int64_t count, int64_t* spans) {
  __shared__ int first, last;
  if (threadIdx.x == 0) {
    first = kDigits;
    last = -1;
  }
  __syncthreads();
  const int64_t sum = blockIdx.x * kSumsPerChunk + threadIdx.x;
  if (sum < count) {
    int mine_first = kDigits, mine_last = -1;
    for (int word = 0; word < kDigits; ++word) {
      if (digits[word * count + sum] != 0) {
        mine_first = min(mine_first, word);
        mine_last = word;
      }
    }
    if (mine_last >= 0) {
      atomicMin(&first, mine_first);
      atomicMax(&last, mine_last);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    spans[kSpanWords * blockIdx.x] = kDigits - first;
    spans[kSpanWords * blockIdx.x + 1] = last + 1;
  }
}

// Moves the chunk's hull words from the digits into the packed block (kToPacked) or
// back.
template <bool kToPacked>
__global__ void move_packed_kernel(int64_t* digits, int64_t count, const int64_t* table,
                                   int64_t* packed) {
  const int64_t chunk = blockIdx.x;
  const int64_t first = table[3 * chunk], words = table[3 * chunk + 1], offset = table[3 * chunk + 2];
  const int64_t begin = chunk * kSumsPerChunk;
  const int64_t sums = min(kSumsPerChunk, count - begin);
  const int64_t j = threadIdx.x;
  if (j >= sums) return;
  for (int64_t w = 0; w < words; ++w) {
    int64_t& digit = digits[(first + w) * count + begin + j];
    int64_t& word = packed[offset + w * sums + j];
    if (kToPacked) {
      word = digit;
    } else {
      digit = word;
    }
  }
}

int chunk_blocks(int64_t count) { return static_cast<int>(digit_chunks(count)); }

}  // namespace

void find_digit_spans_cuda(const int64_t* digits, int64_t count, int64_t* spans, int device) {
  cuda::set_device(device);
  find_digit_spans_kernel<<<chunk_blocks(count), kThreads, 0, cuda::current_stream(device)>>>(
      digits, count, spans);
  CUDA_LAUNCH_CHECK();
}

void pack_digits_cuda(const int64_t* digits, int64_t count, const int64_t* table, int64_t* packed,
                      int device) {
  cuda::set_device(device);
  // The kernel only reads the digits in this direction.
  move_packed_kernel<true><<<chunk_blocks(count), kThreads, 0, cuda::current_stream(device)>>>(
      const_cast<int64_t*>(digits), count, table, packed);
  CUDA_LAUNCH_CHECK();
}

void unpack_digits_cuda(int64_t* digits, int64_t count, const int64_t* table, const int64_t* packed,
                        int device) {
  cuda::set_device(device);
  // The kernel only reads the packed words in this direction.
  move_packed_kernel<false><<<chunk_blocks(count), kThreads, 0, cuda::current_stream(device)>>>(
      digits, count, table, const_cast<int64_t*>(packed));
  CUDA_LAUNCH_CHECK();
}

}  // namespace seqpar::dist::detail
