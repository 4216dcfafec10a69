// CUDA path of nn/attention.h: the reference's chains (nn/reference/attention.cpp), each
// run by one thread in the reference's order; what runs side by side are independent
// chains.
//
//   forward   block (i, h): the scores of every visible key side by side (a thread a
//             key), then the max and the softmax denominator by one thread in key
//             order, the exponentials side by side, and out_i[d] by a thread per d,
//             its chain over the visible keys ascending.
//   delta     a thread per (h, i): δ_i = g_i · out_i.
//   dq        block (i, h): P_ij and dS_ij for every visible key j side by side, then
//             dq_i[d] by a thread per d, its chain over the keys ascending.
//   dk, dv    block (j, h): P_ij and dS_ij for every query i that sees j side by side,
//             then dk_j[d] and dv_j[d] by a thread each, chains over the queries
//             ascending (the reference's outer loop).
//
// Every rounding is written out (__fmaf_rn, __fmul_rn, __fsub_rn, __fadd_rn, __fdiv_rn:
// nvcc contracts none of them) and the exponential is core/exp.h's, correctly rounded,
// so every value is the reference's bit for bit. Each output element is written by one
// thread: no atomics. A row's scores live in shared memory: S floats a block (2 S in
// the dk/dv kernel), which bounds S by the device's shared memory per block (about
// 58,000 tokens forward and 29,000 backward on an H200); a longer sequence is refused.
//
// These are plain kernels, correct before fast: one query (or key) a block, the serial
// sums by one thread. Tiling several queries a block, as FlashAttention does, keeps
// every chain's order and is the way to make them fast.
#include <cmath>
#include <string>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/exp.h"
#include "nn/cuda/attention.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 128;

// A row of S scores in shared memory takes this many floats: S rounded up to whole
// 16-byte words, and one word more. compute-sanitizer's memcheck saw the forward's
// serial loops read 12 bytes at the row's last element (at S = 1: past a 4-byte row);
// the padding keeps every access the compiler makes inside the allocation.
__host__ __device__ int64_t row_floats(int64_t tokens) { return (tokens + 3) / 4 * 4 + 4; }

// Where each head's token lives in [S, H, D], and which keys each query sees.
struct Layout {
  int tokens, heads, dim;
  bool causal;
  const int64_t* positions;  // null: 0 .. S-1

  __device__ int64_t at(int token, int head) const {
    return (static_cast<int64_t>(token) * heads + head) * dim;
  }
  __device__ bool visible(int query, int key) const {
    if (!causal) return true;
    return positions == nullptr ? key <= query : positions[key] <= positions[query];
  }
  // Keys past this one are hidden from `query` (the ordinary causal mask: i + 1).
  __device__ int key_span(int query) const {
    return causal && positions == nullptr ? query + 1 : tokens;
  }
  // Queries before this one do not see `key`.
  __device__ int first_query(int key) const { return causal && positions == nullptr ? key : 0; }
};

// a · b over d, an fma chain in index order from +0.
__device__ float dot(const float* a, const float* b, int dim) {
  float sum = 0.0f;
  for (int d = 0; d < dim; ++d) sum = __fmaf_rn(a[d], b[d], sum);
  return sum;
}

__device__ float score(const Layout& layout, float scale, const float* q, const float* k, int i,
                       int j, int h) {
  return __fmul_rn(scale, dot(q + layout.at(i, h), k + layout.at(j, h), layout.dim));
}

__global__ void forward_kernel(Layout layout, float scale, const float* q, const float* k,
                               const float* v, float* out, float* row_max, float* row_sum) {
  extern __shared__ float p[];  // p[j]: key j's score, then its exponential
  __shared__ float m_shared, l_shared;
  const int i = blockIdx.x, h = blockIdx.y, span = layout.key_span(i);
  for (int j = threadIdx.x; j < span; j += blockDim.x) {
    if (layout.visible(i, j)) p[j] = score(layout, scale, q, k, i, j, h);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int j = 0; j < span; ++j) {
      if (layout.visible(i, j)) m = p[j] > m ? p[j] : m;
    }
    m_shared = m;
  }
  __syncthreads();
  const float m = m_shared;
  for (int j = threadIdx.x; j < span; j += blockDim.x) {
    if (layout.visible(i, j)) p[j] = correctly_rounded_exp(__fsub_rn(p[j], m));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = 0.0f;
    for (int j = 0; j < span; ++j) {
      if (layout.visible(i, j)) l = __fadd_rn(l, p[j]);
    }
    l_shared = l;
    row_max[static_cast<int64_t>(h) * layout.tokens + i] = m;
    row_sum[static_cast<int64_t>(h) * layout.tokens + i] = l;
  }
  __syncthreads();
  const float l = l_shared;
  for (int d = threadIdx.x; d < layout.dim; d += blockDim.x) {
    float sum = 0.0f;
    bool any = false;
    for (int j = 0; j < span; ++j) {
      if (!layout.visible(i, j)) continue;
      sum = __fmaf_rn(p[j], v[layout.at(j, h) + d], sum);
      any = true;
    }
    out[layout.at(i, h) + d] = any ? __fdiv_rn(sum, l) : 0.0f;  // no visible key: +0
  }
}

__global__ void delta_kernel(Layout layout, const float* g, const float* out, float* delta) {
  const int64_t count = static_cast<int64_t>(layout.heads) * layout.tokens;
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < count;
       n += int64_t{gridDim.x} * blockDim.x) {
    const int h = static_cast<int>(n / layout.tokens), i = static_cast<int>(n % layout.tokens);
    delta[n] = dot(g + layout.at(i, h), out + layout.at(i, h), layout.dim);
  }
}

// The forward's statistics of one head's query i and that query's δ.
struct RowStats {
  const float *row_max, *row_sum, *delta;
  int tokens;
  __device__ int64_t index(int i, int h) const { return static_cast<int64_t>(h) * tokens + i; }
};

// P_ij = fl(exp(s_ij - m_i) / l_i) and dS_ij = fl(P_ij · fl(dP_ij - δ_i)), as the
// reference computes them.
struct ScoreGrad {
  float probability, ds;
};
__device__ ScoreGrad score_grad(const Layout& layout, const RowStats& stats, float scale,
                                const float* q, const float* k, const float* v, const float* g,
                                int i, int j, int h) {
  const int64_t row = stats.index(i, h);
  const float s = score(layout, scale, q, k, i, j, h);
  const float probability =
      __fdiv_rn(correctly_rounded_exp(__fsub_rn(s, stats.row_max[row])), stats.row_sum[row]);
  const float dp = dot(g + layout.at(i, h), v + layout.at(j, h), layout.dim);
  return {probability, __fmul_rn(probability, __fsub_rn(dp, stats.delta[row]))};
}

__global__ void dq_kernel(Layout layout, RowStats stats, float scale, const float* q,
                          const float* k, const float* v, const float* g, float* dq) {
  extern __shared__ float ds[];  // ds[j] for key j
  const int i = blockIdx.x, h = blockIdx.y, span = layout.key_span(i);
  for (int j = threadIdx.x; j < span; j += blockDim.x) {
    if (layout.visible(i, j)) ds[j] = score_grad(layout, stats, scale, q, k, v, g, i, j, h).ds;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < layout.dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < span; ++j) {
      if (layout.visible(i, j)) sum = __fmaf_rn(ds[j], k[layout.at(j, h) + d], sum);
    }
    dq[layout.at(i, h) + d] = __fmul_rn(scale, sum);
  }
}

__global__ void dk_dv_kernel(Layout layout, RowStats stats, float scale, const float* q,
                             const float* k, const float* v, const float* g, float* dk,
                             float* dv) {
  extern __shared__ float shared[];  // P_ij and dS_ij for query i
  float* probability = shared;
  float* ds = shared + row_floats(layout.tokens);
  const int j = blockIdx.x, h = blockIdx.y, first = layout.first_query(j);
  for (int i = first + static_cast<int>(threadIdx.x); i < layout.tokens; i += blockDim.x) {
    if (!layout.visible(i, j)) continue;
    const ScoreGrad terms = score_grad(layout, stats, scale, q, k, v, g, i, j, h);
    probability[i] = terms.probability;
    ds[i] = terms.ds;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * layout.dim; c += blockDim.x) {
    const bool key_side = c >= layout.dim;  // dk_j[d]; else dv_j[d]
    const int d = key_side ? c - layout.dim : c;
    const float* weights = key_side ? ds : probability;
    const float* rows = key_side ? q : g;
    float sum = 0.0f;
    for (int i = first; i < layout.tokens; ++i) {
      if (layout.visible(i, j)) sum = __fmaf_rn(weights[i], rows[layout.at(i, h) + d], sum);
    }
    if (key_side) {
      dk[layout.at(j, h) + d] = __fmul_rn(scale, sum);
    } else {
      dv[layout.at(j, h) + d] = sum;
    }
  }
}

// The mask's positions on the GPU (empty without them) and the layout that reads them.
struct DeviceLayout {
  DeviceBuffer<int64_t> positions;
  Layout layout;
};
DeviceLayout device_layout(const Tensor& q, const AttentionMask& mask) {
  DeviceLayout result;
  if (mask.causal && !mask.positions.empty()) {
    result.positions = DeviceBuffer<int64_t>(static_cast<int64_t>(mask.positions.size()), q.device());
    result.positions.copy_from_host(mask.positions.data(), static_cast<int64_t>(mask.positions.size()));
  }
  result.layout = {static_cast<int>(q.size(0)), static_cast<int>(q.size(1)),
                   static_cast<int>(q.size(2)), mask.causal, result.positions.data()};
  return result;
}

// Shared memory for `rows` rows of S floats, refused past the device's limit.
size_t shared_bytes(const char* op, const Tensor& q, int rows) {
  int limit = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, q.device().index));
  const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(row_floats(q.size(0))) *
                       sizeof(float);
  SEQPAR_CHECK(bytes <= static_cast<size_t>(limit), op, " on ", q.device(), ": S = ", q.size(0),
               " tokens need ", bytes, " bytes of shared memory a block, more than the GPU's ",
               limit, " (the CUDA kernels hold a row of S scores a block); run it on the cpu");
  return bytes;
}

void check_sizes(const Tensor& q) {
  SEQPAR_CHECK(q.size(0) < (int64_t{1} << 31) && q.size(1) < 65536, "attention on CUDA: S = ",
               q.size(0), " tokens and H = ", q.size(1), " heads must fit a grid (S < 2^31, H < 65536)");
}

}  // namespace

AttentionForward attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionMask& mask) {
  check_sizes(q);
  const int device = q.device().index;
  cuda::set_device(device);
  const int64_t tokens = q.size(0), heads = q.size(1);
  AttentionForward result{Tensor::empty(q.shape(), q.device()),
                          Tensor::empty({heads, tokens}, q.device()),
                          Tensor::empty({heads, tokens}, q.device())};
  if (tokens == 0 || heads == 0) return result;
  const DeviceLayout where = device_layout(q, mask);
  const size_t bytes = shared_bytes("attention forward", q, 1);
  cuda::allow_dynamic_shared_memory(forward_kernel, bytes);
  forward_kernel<<<dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads)), kThreads, bytes,
                   cuda::current_stream(device)>>>(
      where.layout, attention_scale(q.size(2)), q.data(), k.data(), v.data(), result.out.data(),
      result.row_max.data(), result.row_sum.data());
  CUDA_LAUNCH_CHECK();
  return result;
}

AttentionGrads attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionForward& forward,
                                       const AttentionMask& mask) {
  check_sizes(q);
  const int device = q.device().index;
  cuda::set_device(device);
  const int64_t tokens = q.size(0), heads = q.size(1);
  AttentionGrads grads{Tensor::empty(q.shape(), q.device()), Tensor::empty(k.shape(), k.device()),
                       Tensor::empty(v.shape(), v.device())};
  if (tokens == 0 || heads == 0) return grads;
  const DeviceLayout where = device_layout(q, mask);
  const cuda::Stream stream = cuda::current_stream(device);
  const float scale = attention_scale(q.size(2));
  const Tensor delta = Tensor::empty({heads, tokens}, q.device());
  delta_kernel<<<cuda::blocks_for(heads * tokens, kThreads, 65536), kThreads, 0, stream>>>(
      where.layout, grad_out.data(), forward.out.data(), delta.data());
  CUDA_LAUNCH_CHECK();
  const RowStats stats{forward.row_max.data(), forward.row_sum.data(), delta.data(),
                       static_cast<int>(tokens)};
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(heads));
  const size_t row_bytes = shared_bytes("attention backward", q, 1);
  cuda::allow_dynamic_shared_memory(dq_kernel, row_bytes);
  dq_kernel<<<grid, kThreads, row_bytes, stream>>>(where.layout, stats, scale, q.data(), k.data(),
                                                   v.data(), grad_out.data(), grads.q.data());
  CUDA_LAUNCH_CHECK();
  const size_t two_rows = shared_bytes("attention backward", q, 2);
  cuda::allow_dynamic_shared_memory(dk_dv_kernel, two_rows);
  dk_dv_kernel<<<grid, kThreads, two_rows, stream>>>(where.layout, stats, scale, q.data(),
                                                     k.data(), v.data(), grad_out.data(),
                                                     grads.k.data(), grads.v.data());
  CUDA_LAUNCH_CHECK();
  return grads;
}

}  // namespace seqpar::nn::detail
