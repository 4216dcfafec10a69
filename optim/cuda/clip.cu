// CUDA path of optim/clip.h: the total gradient norm and the clipping, with no host
// round trip and no floating-point atomics.
//
// The norm is the exact definition of optim/clip.h, bitwise the CPU's:
//   1. squares:  one multi-tensor launch; each thread keeps an exact::BinnedSum of the
//                squares (double)g * (double)g of its share of a (tensor, chunk) and
//                moves it into int64 digits; the block adds its threads' digits with
//                integer operations and adds them into that tensor's sum (one per
//                tensor) with one integer atomic per digit.
//   2. total:    the last block of the launches to finish (an integer count), in one
//                thread, rounds each tensor's sum to double once, takes the float
//                norm, sums the norms' squares exactly and rounds once:
//                total = (float)sqrt(round_to_double(Σ norm_i²)).
// Integer addition is associative (the flags are or-ed), so no grid, chunk, schedule or
// order of atomics changes a bit.
//
// Clipping reads total where it lives: each block computes the coefficient
// min(1, max_norm / (total + 1e-6)) itself and scales its chunk, one launch over all
// gradients. Like PyTorch, gradients are multiplied even when the coefficient is 1,
// and the coefficient is formed as PyTorch forms it: reciprocal(total + 1e-6) * max_norm,
// with the CPU's float operations (optim/cuda/step_math.cuh), each rounded once.
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/device_buffer.h"
#include "core/exact_bins.h"
#include "core/exact_bins.cuh"
#include "core/exact_sums.h"
#include "optim/clip.h"
#include "optim/cuda/clip.h"
#include "optim/cuda/step_math.cuh"
#include "optim/cuda/multi_tensor.cuh"

namespace seqpar::optim::detail {

namespace {

using ReadTable = TensorTable<1, const float*>;
using WriteTable = TensorTable<1, float*>;

// Elements per block of the squares launch for a large model: 64 a thread, well below
// kTermsPerFlush, so each thread flushes once, at the end. A small model's blocks take
// fewer (chunk_elements_for).
constexpr int64_t kSquaresChunk = 16384;
static_assert(kSquaresChunk / kMultiTensorThreads <= exact::kTermsPerFlush,
              "a thread's terms must fit in its bins between flushes");
static_assert(kMultiTensorThreads % 32 == 0 && kMultiTensorThreads >= exact::kDigits,
              "add_block_digits needs whole warps and a thread per digit");

// Which sum of the digits each slot of a table adds into.
struct SumIndices {
  int64_t index[ReadTable::kMaxTensors];
};

// Where the squares go, and the count that finds the last block of all launches.
struct NormScratch {
  int64_t* digits;        // `count` sums, digit-major (zero first)
  int64_t count;          // one sum per tensor
  unsigned* blocks_done;  // zero first
  unsigned blocks;        // over all launches
  float* total;
};

// The total from the tensors' digits, as grad_norm's CPU path: each tensor's float
// norm, then the norm of the norms (one thread). The digits are read from L2 (__ldcg):
// other blocks' atomics wrote them.
__device__ void total_norm(const NormScratch& n) {
  int64_t local[exact::kDigits] = {};
  exact::BinnedSum sum;
  sum.clear();
  int64_t pending = 0;  // terms in the bins since the last flush
  for (int64_t i = 0; i < n.count; ++i) {
    int64_t digits[exact::kDigits];
    for (int d = 0; d < exact::kDigits; ++d) digits[d] = __ldcg(n.digits + d * n.count + i);
    const float norm = __double2float_rn(sqrt(exact::round_to_double(digits)));
    sum.add(__dmul_rn(static_cast<double>(norm), static_cast<double>(norm)));
    if (++pending == exact::kTermsPerFlush) {
      sum.flush(local);
      pending = 0;
    }
  }
  sum.flush(local);
  *n.total = __double2float_rn(sqrt(exact::round_to_double(local)));
}

// The squares of a chunk into its tensor's digits; the last block of all launches to
// finish (an integer count: every block fenced its atomics first) takes the total.
__global__ void __launch_bounds__(kMultiTensorThreads)
    exact_sum_of_squares_kernel(ReadTable table, SumIndices sums, int64_t chunk, NormScratch n) {
  const BlockWork work = block_work(table, blockIdx.x, chunk);
  const float* grad = table.pointers[0][work.slot];
  exact::BinnedSum sum;
  sum.clear();
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    const double value = grad[i];
    sum.add(__dmul_rn(value, value));  // exact: a float's square has 48 significant bits
  }
  int64_t local[exact::kDigits] = {};
  sum.flush(local);
  exact::add_block_digits(local, n.digits + sums.index[work.slot], n.count);
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(n.blocks_done, 1u) == n.blocks - 1;
  __syncthreads();
  if (last && threadIdx.x == 0) total_norm(n);
}

__global__ void __launch_bounds__(kMultiTensorThreads)
    scale_by_clip_coefficient_kernel(WriteTable table, int64_t chunk, float max_norm,
                                     const float* total_norm) {
  const float coefficient = clip_coefficient(*total_norm, max_norm);
  const BlockWork work = block_work(table, blockIdx.x, chunk);
  float* grad = table.pointers[0][work.slot];
  for (int64_t i = work.begin + threadIdx.x; i < work.end; i += blockDim.x) {
    grad[i] = __fmul_rn(grad[i], coefficient);
  }
}

void check_total_norm(const char* op, const Tensor& total_norm, int device) {
  SEQPAR_CHECK(total_norm.defined() && total_norm.numel() == 1 &&
                   total_norm.device() == Device::cuda(device),
               op, ": total_norm must be one element on cuda:", device);
}

}  // namespace

void grad_norm_cuda(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                    const Tensor& total_norm, int device) {
  SEQPAR_CHECK(grads.size() == sizes.size(), "grad_norm_cuda: ", grads.size(), " grads but ",
               sizes.size(), " sizes");
  check_total_norm("grad_norm_cuda", total_norm, device);
  const int64_t tensors = static_cast<int64_t>(sizes.size());
  exact::check_term_count("grad_norm", tensors);
  for (int64_t size : sizes) exact::check_term_count("grad_norm", size);
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  // The tensors' digits and the count of finished blocks, zeroed at once.
  DeviceBuffer<int64_t> scratch(exact::kDigits * tensors + 1, total_norm.device());
  scratch.zero();
  int64_t elements = 0;
  for (int64_t size : sizes) elements += size;
  const int64_t chunk =
      chunk_elements_for(elements, cuda::multiprocessor_count(device), kSquaresChunk);

  // for_each_tensor_table skips empty tensors (their sums stay an exact zero) and fills
  // each table's slots with consecutive non-empty tensors, slot 0 being the tensor of
  // the launch's first block: so slot s of a launch is non-empty tensor owner + s.
  std::vector<int64_t> non_empty, first_block;
  int64_t blocks = 0;
  for (int64_t t = 0; t < tensors; ++t) {
    if (sizes[t] == 0) continue;
    non_empty.push_back(t);
    first_block.push_back(blocks);
    blocks += cuda::ceil_div(sizes[t], chunk);
  }
  if (blocks == 0) {  // no elements: the norm is an exact +0
    total_norm.fill_(0.0f);
    return;
  }
  const NormScratch n{scratch.data(), tensors,
                      reinterpret_cast<unsigned*>(scratch.data() + exact::kDigits * tensors),
                      static_cast<unsigned>(blocks), total_norm.data()};
  for_each_tensor_table<1>(
      std::array<std::vector<const float*>, 1>{grads}, sizes,
      [&](const ReadTable& table, int count, int64_t first) {
        // The non-empty tensor that owns block `first`.
        const size_t owner = static_cast<size_t>(
            std::upper_bound(first_block.begin(), first_block.end(), first) - first_block.begin() -
            1);
        SumIndices indices{};
        for (size_t slot = 0; slot < static_cast<size_t>(ReadTable::kMaxTensors) &&
                              owner + slot < non_empty.size();
             ++slot) {
          indices.index[slot] = non_empty[owner + slot];
        }
        for (int b = 0; b < count; ++b) {  // the map above, checked against the table
          const int slot = table.block_tensor[b];
          SEQPAR_CHECK(owner + slot < non_empty.size() &&
                           table.sizes[slot] == sizes[non_empty[owner + slot]] &&
                           table.pointers[0][slot] == grads[non_empty[owner + slot]],
                       "grad_norm_cuda: the launch table does not map to the tensors");
        }
        exact_sum_of_squares_kernel<<<count, kMultiTensorThreads, 0, stream>>>(table, indices,
                                                                              chunk, n);
        CUDA_LAUNCH_CHECK();
      },
      chunk);
}

void clip_grads_cuda(const std::vector<float*>& grads, const std::vector<int64_t>& sizes,
                     float max_norm, const Tensor& total_norm, int device) {
  SEQPAR_CHECK(grads.size() == sizes.size(), "clip_grads_cuda: ", grads.size(), " grads but ",
               sizes.size(), " sizes");
  check_total_norm("clip_grads_cuda", total_norm, device);
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  int64_t elements = 0;
  for (int64_t size : sizes) elements += size;
  const int64_t chunk = chunk_elements_for(elements, cuda::multiprocessor_count(device));
  for_each_tensor_table<1>(
      std::array<std::vector<float*>, 1>{grads}, sizes,
      [&](const WriteTable& table, int count, int64_t /*first_block*/) {
        scale_by_clip_coefficient_kernel<<<count, kMultiTensorThreads, 0, stream>>>(
            table, chunk, max_norm, total_norm.data());
        CUDA_LAUNCH_CHECK();
      },
      chunk);
}

}  // namespace seqpar::optim::detail
