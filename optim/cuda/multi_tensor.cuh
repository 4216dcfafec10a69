// Multi-tensor launches, as PyTorch's multi_tensor_apply: one kernel launch covers
// many tensors (every parameter of a model) instead of one launch per tensor.
//
// Each tensor is cut into chunks of kChunkElements; each block of the launch owns one
// (tensor, chunk) pair. The tensors' pointers and sizes, and the block -> (tensor,
// chunk) map, travel by value in the kernel's parameters (TensorTable), so a launch
// needs no device-side table, no host-to-device copy, and can be captured in a CUDA
// graph. Kernel parameters are limited to 4 KB, so one table holds at most
// kMaxTensors tensors and kMaxBlocks blocks; a longer list becomes several launches
// (the issue model's two parameters take one).
//
// The map depends only on the sizes, so a reduction built on it (clip.cu) adds in
// the same order on every run.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/cuda_check.h"

namespace seqpar::optim::detail {

constexpr int64_t kChunkElements = 4096;
constexpr int kMultiTensorThreads = 256;

// The chunk of a launch over `elements` elements in all on a device of `sms` SMs:
// `largest` for a large model, and for a small one less, down to one element a thread,
// so that its blocks cover the SMs about twice. (The issue's 10,256 parameters in
// chunks of 4096 made 4 blocks, whose threads each walked 10 elements in turn while
// 128 SMs idled.) The chunk moves no bit: each element's update is its own, and the
// reductions built on the tables add integers.
inline int64_t chunk_elements_for(int64_t elements, int sms, int64_t largest = kChunkElements) {
  const int64_t blocks = 2 * int64_t{sms > 1 ? sms : 1};
  const int64_t chunk = cuda::round_up(cuda::ceil_div(elements, blocks), kMultiTensorThreads);
  return chunk < kMultiTensorThreads ? kMultiTensorThreads : chunk < largest ? chunk : largest;
}

// kLists parallel lists of tensors (for AdamW: params, grads, exp_avgs, exp_avg_sqs).
template <int kLists, typename Pointer = float*>
struct TensorTable {
  static constexpr int kMaxTensors = 24;
  static constexpr int kMaxBlocks = 320;
  Pointer pointers[kLists][kMaxTensors];
  int64_t sizes[kMaxTensors];
  unsigned char block_tensor[kMaxBlocks];  // a slot of pointers / sizes
  int block_chunk[kMaxBlocks];
};
static_assert(sizeof(TensorTable<4>) <= 4000, "kernel parameters are limited to 4 KB");

// The element range [begin, end) that block `block` of a launch over `table` owns,
// and its tensor's slot.
struct BlockWork {
  int slot;
  int64_t begin, end;
};
// chunk_elements: the launcher's chunk size (kChunkElements unless it chose another).
template <typename Table>
__device__ __forceinline__ BlockWork block_work(const Table& table, int block,
                                                int64_t chunk_elements = kChunkElements) {
  const int slot = table.block_tensor[block];
  const int64_t begin = int64_t{table.block_chunk[block]} * chunk_elements;
  const int64_t end = begin + chunk_elements < table.sizes[slot] ? begin + chunk_elements
                                                                 : table.sizes[slot];
  return {slot, begin, end};
}

// Fills tables for the non-empty tensors in order and calls
// launch(table, block_count, first_block) once per full table; first_block counts the
// blocks of earlier launches, so block b of a launch is block first_block + b overall.
template <int kLists, typename Pointer, typename Launch>
void for_each_tensor_table(const std::array<std::vector<Pointer>, kLists>& lists,
                           const std::vector<int64_t>& sizes, Launch&& launch,
                           int64_t chunk_elements = kChunkElements) {
  using Table = TensorTable<kLists, Pointer>;
  Table table{};
  int tensors = 0, blocks = 0;
  int64_t first_block = 0;
  size_t last_added = sizes.size();  // the tensor in slot tensors - 1
  auto flush = [&] {
    if (blocks > 0) launch(table, blocks, first_block);
    first_block += blocks;
    tensors = 0;
    blocks = 0;
  };
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t chunks = cuda::ceil_div(sizes[t], chunk_elements);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      if (blocks == Table::kMaxBlocks) flush();
      if (tensors == 0 || last_added != t) {
        if (tensors == Table::kMaxTensors) flush();
        for (int list = 0; list < kLists; ++list) table.pointers[list][tensors] = lists[list][t];
        table.sizes[tensors] = sizes[t];
        last_added = t;
        ++tensors;
      }
      table.block_tensor[blocks] = static_cast<unsigned char>(tensors - 1);
      table.block_chunk[blocks] = static_cast<int>(chunk);
      ++blocks;
    }
  }
  flush();
}

}  // namespace seqpar::optim::detail
