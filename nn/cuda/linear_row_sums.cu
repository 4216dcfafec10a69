// Linear's sums over rows on a GPU, dW = dyᵀ x and db = Σ_rows dy: the function that
// nn/linear.cpp's table calls (accumulate_linear_grads_cuda), which launches the dW
// kernel that choose_weight_grad_kernel picks, and the general kernel of these sums,
// binned in exact arithmetic (core/exact_bins.h): the reference's digits, whatever the
// grid. Because the digits of partial sums add as integers, the rows can
// be cut into chunks freely (here: enough chunks to fill the GPU) and the chunks' digits
// meet through integer atomics, whose order cannot change the result. No
// floating-point atomics: the bins are private to a thread.
//
// Layout: a warp owns 32 adjacent columns k of kRowSumsOutputs output rows j and a chunk of
// rows; the block's 8 warps take every 8th row of the chunk. Lanes read adjacent x
// values (one coalesced load per row) and share dy[row, j] (broadcasts). A first pass
// (column_maxima.cu) finds the largest magnitude of every column of x and dy; each warp then skips the
// bins no term of its columns can reach (exact::first_reachable_bin): with the issue's
// data half of them, and the same bits, since those bins would only get +0.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/dependent_launch.cuh"
#include "core/device_buffer.h"
#include "core/exact_bins.cuh"
#include "core/exact_fixed_point.h"
#include "core/exact_sums.h"
#include "nn/cuda/exact_dw_crt.h"
#include "nn/cuda/linear.h"
#include "nn/cuda/linear_row_sums.cuh"
#include "nn/cuda/one_magnitude_dw.cuh"
#include "nn/cuda/one_magnitude_dw_few_outputs.cuh"
#include "nn/cuda/weight_grad_choice.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kWarps = kRowSumsWarps;
constexpr int kThreads = 32 * kWarps;
// Rows per chunk at least: each thread flushes its digits once per chunk. Few enough
// that a sum over few columns (db: out of them) still spreads over many blocks.
constexpr int64_t kMinRowsPerChunk = 64;
constexpr int64_t kTargetBlocks = 1056;  // several blocks per SM of a large GPU; any value gives the same bits

// db when dy had one magnitude f: Σ_rows dy[., j] is f times column j's sign sum (an
// integer), added at f's unit by one thread of the column's first block.
__device__ void add_column_sum_from_signs(const OneMagnitude& magnitude, const int64_t* sign_sums,
                                          int64_t columns, int64_t* digits, int64_t count) {
  const int64_t j = int64_t{blockIdx.x} * 32 + threadIdx.x;
  if (blockIdx.z != 0 || threadIdx.x >= 32 || j >= columns) return;
  // |sign sum| <= rows <= kMaxTerms (2^32) and the significand < 2^24: far below 2^93.
  exact::add_scaled_integer(digits + j, count, exact::Int128{sign_sums[j]} * magnitude.significand,
                            magnitude.exponent);
}

// Block (column block, output group, chunk of rows). kProducts: dW's sums; else db's,
// one per column of b (= dy).
template <bool kProducts>
__global__ void __launch_bounds__(kThreads) row_sums_kernel(ConstRows a, ConstRows b, int64_t rows,
                                                            int64_t outputs, int64_t columns,
                                                            int64_t rows_per_chunk,
                                                            const unsigned int* largest_a,
                                                            const unsigned int* largest_b,
                                                            const unsigned int* one_magnitude_words,
                                                            const int64_t* sign_sums,
                                                            int64_t* digits, int64_t count) {
  cuda::wait_for_prior_grids();  // the factors, their maxima and words
  cuda::allow_dependent_grids();
  // When dy had one magnitude: dW is the fixed-point path's (one_magnitude_dw_few_outputs.cuh), and
  // db comes from dy's sign sums, here.
  if (one_magnitude_words != nullptr) {
    const OneMagnitude magnitude = one_magnitude(one_magnitude_words);
    if (magnitude.holds) {
      if (!kProducts && sign_sums != nullptr) {
        add_column_sum_from_signs(magnitude, sign_sums, columns, digits, count);
      }
      return;
    }
  }
  sum_rows_block<kProducts>(a, b, outputs, columns, int64_t{blockIdx.x} * 32,
                            int64_t{blockIdx.y} * kRowSumsOutputs<kProducts>,
                            int64_t{blockIdx.z} * rows_per_chunk,
                            min(rows, int64_t{blockIdx.z} * rows_per_chunk + rows_per_chunk), largest_a,
                            largest_b, digits, count);
}

// The binned row sums of one launch (row_sums_kernel) into digits[d * stride + i], on
// `stream`, from the factors' column maxima (largest_a: dy's, for dW only; largest_b:
// x's for dW, dy's for db). `one_magnitude_words`: dy's two words where the kernel is
// to leave the work to a one-magnitude path if dy had one magnitude (one launched beside
// it for dW; for db, `sign_sums`, from the pass over dy), else null: it does the work.
template <bool kProducts>
void launch_binned_row_sums(ConstRows a, ConstRows b, int64_t rows, int64_t outputs, int64_t columns,
                            const unsigned int* largest_a, const unsigned int* largest_b,
                            const unsigned int* one_magnitude_words, const int64_t* sign_sums,
                            int64_t* digits, int64_t stride, cudaStream_t stream) {
  exact::check_term_count("linear_backward", rows);
  if (rows == 0 || columns == 0 || outputs == 0) return;
  const int64_t column_blocks = cuda::ceil_div(columns, 32);
  const int64_t output_groups = cuda::ceil_div(outputs, kRowSumsOutputs<kProducts>);
  const int64_t wanted_chunks =
      std::max<int64_t>(1, kTargetBlocks / (column_blocks * output_groups));
  const int64_t rows_per_chunk =
      std::max(kMinRowsPerChunk, cuda::ceil_div(rows, std::min<int64_t>(wanted_chunks, 65535)));
  const int64_t chunks = cuda::ceil_div(rows, rows_per_chunk);
  SEQPAR_CHECK(column_blocks <= 0x7fffffff && output_groups <= 65535 && chunks <= 65535,
               "linear_backward: ", outputs, " x ", columns, " sums over ", rows,
               " rows exceed the row-sum kernel's grid");
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(output_groups),
                  static_cast<unsigned>(chunks));
  cuda::launch_dependent(row_sums_kernel<kProducts>, grid, dim3(kThreads), 0, stream, a, b, rows,
                         outputs, columns, rows_per_chunk, largest_a, largest_b, one_magnitude_words,
                         kProducts ? nullptr : sign_sums, digits, stride);
  CUDA_LAUNCH_CHECK();
}

// Scratch of a launch's own, in one buffer zeroed once (atomic sums and maxima start
// from zeros): dy's sign sums [sign_sums_count], then the maxima's words.
class RowSumsScratch {
 public:
  RowSumsScratch(int64_t words, int64_t sign_sums_count, Device device)
      : sign_sums_count_(sign_sums_count), buffer_(sign_sums_count + (words + 1) / 2, device) {
    buffer_.zero();
  }
  int64_t* sign_sums() { return buffer_.data(); }
  unsigned int* largest() { return reinterpret_cast<unsigned int*>(buffer_.data() + sign_sums_count_); }

 private:
  int64_t sign_sums_count_;
  DeviceBuffer<int64_t> buffer_;
};

// Whether dy had one magnitude, from its two words read back: a wait for the pass over dy.
bool dy_has_one_magnitude(const unsigned int* words, int device) {
  unsigned int host_words[2] = {};
  cuda::copy(host_words, Device::cpu(), words, Device::cuda(device), sizeof(host_words));
  return one_magnitude_of(host_words[0], ~host_words[1]).holds;
}

// Whether the pass over dy must lay out dy's signs: where `choice` may end on the
// many-outputs kernel (it asks for dy's structure first only with many outputs).
bool needs_sign_matrix(const WeightGradChoice& choice) {
  return choice.launch == WeightGradLaunch::ReadDyStructure ||
         choice.kernel == WeightGradKernel::OneMagnitudeManyOutputs;
}

}  // namespace

void accumulate_weight_grad_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                 const unsigned int* x_largest, const ManyOutputsChunks& chunks,
                                 WeightGradKernel* kernel_taken) {
  accumulate_linear_grads_cuda(grad_y, x, sums, true, false, x_largest, chunks, kernel_taken);
}

// dW's and db's exact row sums on the GPU (then rounded by nn/linear.cpp), the CUDA row
// of its table. Every path adds the reference's exact values (nn/reference/linear.h),
// so the bits never depend on which ran. In order:
//
//   1. choose_weight_grad_kernel (nn/cuda/weight_grad_choice.h: the regimes, their
//      thresholds and why): the host decides, from the shape and whether the stream is
//      being captured, before anything is launched.
//   2. The passes over x (unless the forward left x's maxima) and over dy
//      (column_maxima.cu): dy's maxima, its two one-magnitude words, db's sign sums, and
//      dy's signs as bytes where the choice may take the many-outputs kernel.
//   3. Only where the choice says ReadDyStructure (many outputs, eager): the host reads
//      dy's words back, a wait for the pass over dy, and chooses again.
//   4. dW's launch, one switch on the choice: each case launches its kernels directly.
//      DeviceChooses: the binned kernel and a one-magnitude one both, each reading dy's
//      words and returning at once unless it is the one to work.
//   5. db's launch: row_sums_kernel<false>, whose blocks read dy's words: f times each
//      column's sign count where dy has one magnitude, else binned sums of dy.
//
// kernel_taken tells a caller (a test, a diagnosis) which kernel did the work, reading
// the words back (a wait) where the device decided.
void accumulate_linear_grads_cuda(const ConstRows& grad_y, const ConstRows& x, exact::ExactSums& sums,
                                  bool weight, bool bias, const unsigned int* x_largest,
                                  const ManyOutputsChunks& chunks, WeightGradKernel* kernel_taken) {
  if (kernel_taken != nullptr) *kernel_taken = WeightGradKernel::None;
  const int64_t rows = x.rows, in = x.cols, out = grad_y.cols;
  const int64_t weight_count = weight ? out * in : 0;
  SEQPAR_CHECK(grad_y.rows == rows && sums.count() == weight_count + (bias ? out : 0),
               "accumulate_linear_grads_cuda: dy ", grad_y.rows, " x ", out, ", x ", rows, " x ", in,
               ", ", sums.count(), " sums for ", weight ? "dW" : "", weight && bias ? " and " : "",
               bias ? "db" : "");
  if (!weight && !bias) return;
  SEQPAR_CHECK(sums.device().is_cuda(), "accumulate_linear_grads_cuda: the sums must be on a GPU");
  exact::check_term_count("linear_backward", rows);
  if (rows == 0 || out == 0 || (in == 0 && !bias)) return;
  const int device = sums.device().index;
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  const bool capturing = cuda::capturing(stream);
  const WeightGradShape shape{rows, in, out, x.row_stride, grad_y.row_stride};
  const bool dw = weight && in > 0;
  WeightGradChoice choice{WeightGradLaunch::Run, WeightGradKernel::None};
  if (dw) choice = choose_weight_grad_kernel(shape, capturing, DyStructure::Unknown);
  // Scratch: x's column maxima unless the caller has them (dW only), dy's, dy's two
  // one-magnitude words, and dy's sign sums (db only).
  const bool find_x = weight && x_largest == nullptr;
  RowSumsScratch scratch((find_x ? in : 0) + out + 2, bias ? out : 0, sums.device());
  unsigned int* dy_largest = scratch.largest() + (find_x ? in : 0);
  unsigned int* words = dy_largest + out;
  if (find_x) column_maxima_cuda(x, scratch.largest(), nullptr, stream);
  // dy in one pass for both sums: its maxima, its one-magnitude words, db's sign sums,
  // and, where dW may take the many-outputs path, its signs as bytes (a quarter of dy's size).
  const bool lay_out_signs = dw && needs_sign_matrix(choice);
  const int64_t signs_ld = cuda::round_up(rows, kSignRowsMultiple);
  DeviceBuffer<int8_t> sign_bytes(lay_out_signs ? cuda::round_up(out, 32) * signs_ld : 0, sums.device());
  const SignMatrix signs{lay_out_signs ? sign_bytes.data() : nullptr, signs_ld};
  column_maxima_cuda(grad_y, dy_largest, words, stream, bias ? scratch.sign_sums() : nullptr, signs);
  if (dw) {
    const unsigned int* x_maxima = find_x ? scratch.largest() : x_largest;
    int64_t* digits = sums.digits();
    const int64_t stride = sums.count();
    // Host decides, with a wait: with many outputs, eager, the host reads dy's two words
    // back and asks the choice again with what they say.
    if (choice.launch == WeightGradLaunch::ReadDyStructure) {
      const DyStructure dy = dy_has_one_magnitude(words, device) ? DyStructure::OneMagnitude
                                                                 : DyStructure::General;
      choice = choose_weight_grad_kernel(shape, capturing, dy);
    }
    // Where the device decides (DeviceChooses), the binned kernel is launched first with
    // dy's words and returns at once if dy has one magnitude; the one-magnitude kernel
    // beside it returns at once if not. The binned one goes first: its blocks wait,
    // resident, while the pass over dy runs and end as that pass does, where after the
    // one-magnitude kernel, whose blocks fill the SMs, they would start only as those end.
    const bool device_chooses = choice.launch == WeightGradLaunch::DeviceChooses;
    switch (choice.kernel) {
      case WeightGradKernel::OneMagnitudeFewOutputs:  // DeviceChooses: fits was asked by the choice
        launch_binned_row_sums<true>(grad_y, x, rows, out, in, dy_largest, x_maxima, words, nullptr, digits,
                                     stride, stream);
        launch_one_magnitude_dw(grad_y, x, x_maxima, words, digits, stride, stream);
        break;
      case WeightGradKernel::OneMagnitudeManyOutputs:  // Run (dy read back) or DeviceChooses (captured)
        if (device_chooses) {
          launch_binned_row_sums<true>(grad_y, x, rows, out, in, dy_largest, x_maxima, words, nullptr, digits,
                                       stride, stream);
        }
        launch_one_magnitude_dw_many_outputs(grad_y, x, x_maxima, words, signs, digits, stride, stream, chunks);
        break;
      case WeightGradKernel::Crt:
        accumulate_weight_grad_crt_cuda(grad_y, x, sums, x_maxima, {}, dy_largest);
        break;
      case WeightGradKernel::Binned:
        launch_binned_row_sums<true>(grad_y, x, rows, out, in, dy_largest, x_maxima, nullptr, nullptr, digits,
                                     stride, stream);
        break;
      case WeightGradKernel::None:
        SEQPAR_CHECK(false, "accumulate_linear_grads_cuda: no dW kernel was chosen");
    }
    if (kernel_taken != nullptr) {
      if (device_chooses) {
        SEQPAR_CHECK(!capturing, "accumulate_linear_grads_cuda: which kernel ran cannot be "
                     "read back inside a graph capture (kernel_taken must be null there)");
        *kernel_taken = dy_has_one_magnitude(words, device) ? choice.kernel : WeightGradKernel::Binned;
      } else {
        *kernel_taken = choice.kernel;
      }
    }
  }
  if (bias) {
    // db: one launch, whose blocks read dy's words (device decides): f times the sign
    // sums where dy has one magnitude, else the binned row sums.
    launch_binned_row_sums<false>(grad_y, grad_y, rows, 1, out, nullptr, dy_largest, words, scratch.sign_sums(),
                                  sums.digits() + weight_count, sums.count(), stream);
  }
}

// The benchmarks' entry (bench/fused/, bench/src/), not Linear's path: the launches
// that accumulate_linear_grads_cuda makes where the device decides, for a caller that
// has the maxima and words already. The caller's `signs` say many outputs; else the
// few-outputs kernel where it fits (few_outputs_kernel_fits, the choice's own test);
// else the binned kernel alone, which does the work whatever dy holds.
void enqueue_weight_grad_sums(const ConstRows& grad_y, const ConstRows& x, const WeightGradMaxima& maxima,
                              int64_t* digits, int64_t stride, cuda::Stream stream, SignMatrix signs,
                              const ManyOutputsChunks& chunks) {
  SEQPAR_CHECK(grad_y.rows == x.rows && stride >= grad_y.cols * x.cols,
               "enqueue_weight_grad_sums: dy ", grad_y.rows, " x ", grad_y.cols, ", x ", x.rows,
               " x ", x.cols, ", digit stride ", stride);
  if (x.rows == 0 || x.cols == 0 || grad_y.cols == 0) return;  // (the binned launch checks the row count)
  const bool many_outputs = signs.data != nullptr;
  const bool one_magnitude =
      many_outputs || few_outputs_kernel_fits({x.rows, x.cols, grad_y.cols, x.row_stride, grad_y.row_stride});
  launch_binned_row_sums<true>(grad_y, x, x.rows, grad_y.cols, x.cols, maxima.dy_largest, maxima.x_largest,
                               one_magnitude ? maxima.dy_words : nullptr, nullptr, digits, stride, stream);
  if (many_outputs) {
    launch_one_magnitude_dw_many_outputs(grad_y, x, maxima.x_largest, maxima.dy_words, signs, digits, stride,
                                         stream, chunks);
  } else if (one_magnitude) {
    launch_one_magnitude_dw(grad_y, x, maxima.x_largest, maxima.dy_words, digits, stride, stream);
  }
}

}  // namespace seqpar::nn::detail
