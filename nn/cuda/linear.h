// The CUDA path of Linear: the launchers of its kernels (nn/cuda/linear.cu for y and
// dx, nn/cuda/linear_row_sums.cu for dW and db), bitwise the reference's: the plain
// loops of nn/reference/linear.cpp define every bit (nn/reference/linear.h). Declarations
// only, so that any build can include it: the CUDA row of nn/linear.cpp's table calls
// them, and the files of nn/cuda/ define them.
#pragma once

#include <cstdint>
#include <memory>

#include "core/cuda_runtime.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/one_magnitude.h"
#include "nn/rows.h"
#include "nn/cuda/weight_grad_choice.h"

namespace seqpar::nn::detail {

// What the CUDA row of nn/linear.cpp keeps from a forward for its backward, opaque to
// the op: x's column maxima, found in the forward's pass over x, so that the exact dW
// need not read x once more for them (nn/cuda/linear.cu defines it).
struct LinearBackendState;
// The forward, keeping that state (the op asks for it when W takes a gradient).
std::shared_ptr<LinearBackendState> linear_forward_cuda_keeping_state(const Tensor& x, const Tensor& weight,
                                                                      const Tensor& bias, const Tensor& y);
// x's column maxima that the forward kept in `state`, for accumulate_linear_grads_cuda's
// x_largest (null: no state, so none kept).
const unsigned int* kept_x_maxima(const LinearBackendState* state);

// How the many-outputs one-magnitude dW (one_magnitude_dw_many_outputs.cu) cuts the rows: rows converted
// and multiplied at a time, rows between folds of its int32 products into the digits,
// and how many elements outside their windows a chunk lists before it scans for them
// instead. 0: its own choice (chunks of about 512 MB of scratch, folds every 2^23 rows,
// 65,536 listed); the tests choose small ones to reach every edge. Any choice gives the
// same bits.
struct ManyOutputsChunks {
  int64_t rows_per_chunk = 0, rows_per_fold = 0, outside_capacity = 0;
};

// dW's sums on the GPU (nn/cuda/linear_row_sums.cu), into sums on the device, on the
// kernel that choose_weight_grad_kernel picks (nn/cuda/weight_grad_choice.h): for the
// tests and benchmarks, accumulate_linear_grads_cuda without db.
// x_largest: x's column maxima if the caller has them, as column_maxima_cuda finds them
// (the forward's pass leaves them: linear_forward_cuda's x_largest); else found here.
// kernel_taken: if not null, set to the path that ran (waits for the device).
void accumulate_weight_grad_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                 const unsigned int* x_largest = nullptr, const ManyOutputsChunks& chunks = {},
                                 WeightGradKernel* kernel_taken = nullptr);
// dW's sums and db's (`weight`, `bias`: which) from one pass over dy: its column maxima
// and one-magnitude words serve dW, and the same pass counts each column's signs, which
// are db when dy has one magnitude (f times the count: no second read of dy, no binned
// sums). Into one ExactSums: dW's out * in sums first (when `weight`), then db's out
// (when `bias`), so that one allocation, one zeroing, one combine across ranks and one
// rounding serve both. The CUDA row of nn/linear.cpp's table: its steps, decisions and
// waits are listed at its definition and in docs/paths.md.
void accumulate_linear_grads_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                  bool weight, bool bias, const unsigned int* x_largest = nullptr,
                                  const ManyOutputsChunks& chunks = {}, WeightGradKernel* kernel_taken = nullptr);
// m's signs (+1, -1, or 0 for zeros, NaNs and the padding) as int8, column by column:
// sign of m[row, c] at data[c * ld + row], for every c below m.cols rounded up to 32 and
// every row below m.rows rounded up to kSignRowsMultiple (ld at least that, a multiple
// of 16). What the many-outputs one-magnitude dW multiplies on the tensor cores.
struct SignMatrix {
  int8_t* data = nullptr;
  int64_t ld = 0;
};
constexpr int64_t kSignRowsMultiple = 256;
// The pass over a matrix before its exact sums (column_maxima.cu):
// largest[c] = bits of the largest |m[., c]| (NaN passed over); with `magnitudes`, also
// the largest |m| bits overall (NaN above infinity) and the complement of the smallest
// nonzero, over all of m; with `sign_sums` (int64, zeroed), also each column's count of
// positive elements less its count of negative ones; with `signs`, m's signs as above.
// One pass over m for all of them.
void column_maxima_cuda(const ConstRows& m, unsigned int* largest, unsigned int* magnitudes,
                        cuda::Stream stream, int64_t* sign_sums = nullptr, SignMatrix signs = {});
// dW's sums where the device chooses the kernel: a one-magnitude kernel and the binned
// one are both launched, and each reads dy's words and returns at once unless it is
// the one to work (the few-outputs one-magnitude kernel where it fits; with `signs`,
// as column_maxima_cuda wrote them, the many-outputs one, cut as `chunks` says; where
// neither applies, the binned kernel alone, doing the work whatever dy holds). What
// accumulate_linear_grads_cuda launches inside a graph capture or with few outputs, for
// a caller that finds the maxima itself (the benchmarks' fused step): each as
// column_maxima_cuda finds it. Adds into digits[d * stride + j * in + k] (stride >= out
// * in: dW may be the first sums of a larger set). Never waits, so a CUDA graph can
// capture it; allocates only the many-outputs kernel's scratch, stream-ordered.
struct WeightGradMaxima {
  const unsigned int* x_largest;   // [in]
  const unsigned int* dy_largest;  // [out]
  const unsigned int* dy_words;    // dy's two one-magnitude words (one_magnitude_dw.cuh)
};
void enqueue_weight_grad_sums(const ConstRows& grad_y, const ConstRows& x, const WeightGradMaxima& maxima,
                              int64_t* digits, int64_t stride, cuda::Stream stream, SignMatrix signs = {},
                              const ManyOutputsChunks& chunks = {});

// The CUDA launchers (nn/cuda/linear.cu). Arguments are checked and shaped by the dispatchers in
// nn/linear.cpp: x is [n, in] with unit column stride and row stride x.stride(0); weight
// [out, in], bias [out], y / grad_y [n, out] contiguous. Outputs are written whole
// (never accumulated into). y by the few-outputs kernel where it fits, else by a GEMM kernel;
// dx by a GEMM kernel. With x_largest, the forward also leaves x's column maxima there,
// as column_maxima_cuda finds them (zero it first): in the few-outputs kernel's own pass over
// x where it runs, else in a pass of their own; the backward's exact dW takes them back
// (accumulate_linear_grads_cuda's x_largest) instead of reading x once more for them.
void linear_forward_cuda(const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& y, unsigned int* x_largest = nullptr);
void linear_grad_input_cuda(const Tensor& grad_y, const Tensor& weight, const Tensor& grad_x);
// dx, dW and db (each where defined) of CUDA tensors, rounded from this rank's rows alone:
// the CUDA row of nn/linear.cpp's table, for the tests and benchmarks that reach the kernels
// directly.
void linear_backward_cuda(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                          const Tensor& grad_x, const Tensor& grad_weight,
                          const Tensor& grad_bias, const unsigned int* x_largest = nullptr);

// For the tests, which reach each GEMM kernel on purpose by shape: whether a product
// runs on the 128 x 128 kernel (nn/cuda/gemm_tile128.h), else on the 64 x 64 one. `left`,
// `right` and `result` as the launchers take them: Output y = x Wᵀ (x, weight, y),
// GradInput dx = dy W (grad_y, weight, grad_x).
enum class LinearProduct { Output, GradInput };
bool linear_uses_gemm128(LinearProduct product, const Tensor& left, const Tensor& right,
                            const Tensor& result);

// The forward of a Linear with few outputs (linear_forward_few_outputs.cu): out <= 16 and in <= 768, a few
// threads a row; the forward takes it whenever it fits. weight [out, in] with its row
// stride, y with its own. With x_largest, also x's column maxima into it, as
// column_maxima_cuda finds them (zero it first), in the same pass over x where the
// kernel allows. outputs_per_thread (4, 8 or 16; 0: the default, 8, or 4 where 8 would
// leave SMs without a block) changes the speed, never the bits: the benchmark measures
// each.
bool few_outputs_forward_fits(const ConstRows& x, int64_t out);
void few_outputs_forward_cuda(const ConstRows& x, const float* weight, int64_t weight_row_stride,
                         const float* bias, int64_t out, float* y, int64_t y_row_stride,
                         int device, unsigned int* x_largest = nullptr,
                         int outputs_per_thread = 0);


// The same sums for a dy of many outputs (at least kManyOutputsMin; one_magnitude_dw_many_outputs.cu): x converted
// once to int8, then int8 GEMMs with dy's signs (`signs`, as column_maxima_cuda writes
// them in its pass over dy) on the tensor cores. Allocates its scratch stream-ordered,
// which a capture records as the graph's own allocations (core/cuda_runtime.cpp): so
// accumulate_linear_grads_cuda takes it eager, once the host has read dy's words, and
// inside a capture too, launched beside the binned kernel with the device deciding
// (choose_weight_grad_kernel's table).
void launch_one_magnitude_dw_many_outputs(const ConstRows& grad_y, const ConstRows& x,
                                     const unsigned int* x_largest, const unsigned int* words,
                                     SignMatrix signs, int64_t* digits, int64_t stride,
                                     cuda::Stream stream, const ManyOutputsChunks& chunks);

}  // namespace seqpar::nn::detail
