// CUDA path of nn/attention.h: the reference's chains (nn/reference/attention.cpp), each
// run by one thread in the reference's order; what runs side by side are independent
// chains. Tensors are contiguous [B, S, H, D]; query head h reads kv head h / R
// (R = Hq / Hkv) in place, with no repeated copy of K and V.
//
//   forward   block (query i, query head h, sequence b): the scores of every visible
//             key side by side (a thread a key), then the max and the softmax
//             denominator by one thread in key order, the exponentials side by side,
//             and out_i[d] by a thread per d, its chain over the visible keys in order.
//   delta     a thread per (b, h, i): δ_i = g_i · out_i, laid out as row_max.
//   dq        block (query i, query head h, sequence b): P_ij and dS_ij for every
//             visible key j side by side, then dq_i[d] by a thread per d, its chain
//             over the keys in order, times the scale.
//   dk, dv    block (key j, kv head, sequence b): for each of the R query heads that
//             read the kv head in turn, P_ij and dS_ij for every query i that sees j
//             side by side, then that head's dk_j[d] and dv_j[d] by a thread each, chains
//             over the queries in order (the reference's outer loop), kept in shared
//             memory; then each (d, part) by the thread that made its R chains: the
//             exact sum of the R values rounded once (core/exact_rounding.h), or with
//             R = 1 the one head's value, as the reference does.
//
// The mask is AttentionMask::Table copied to the GPU (positions and documents, -1 for a
// padded key) with the same visible() test. A row's visible tokens lie between its first
// and last visible one; the serial loops walk only that span, still testing visible()
// inside it, so skipping what lies outside changes no value.
//
// Every rounding is written out (__fmaf_rn, __fmul_rn, __fsub_rn, __fadd_rn, __fdiv_rn:
// nvcc contracts none of them into a different operation) and the exponential is
// core/exp.h's, correctly rounded, so every value is the reference's bit for bit. Each
// output element is written by one thread: no float atomics. A row's scores live in
// shared memory: Sk floats a block forward and in dq, two rows of Sq floats (and the R
// heads' chains of one key) in the dk/dv kernel, which bounds Sk and Sq by the device's
// shared memory per block; a longer call is refused, naming its S.
//
// These are plain kernels, correct before fast: one query (or key) a block, the serial
// sums by one thread. Tiling several queries a block, as FlashAttention does, keeps
// every chain's order and is the way to make them fast.
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/exact_rounding.h"
#include "core/exp.h"
#include "nn/cuda/attention.h"

namespace seqpar::nn::detail {

namespace {

constexpr int kThreads = 128;
// A grid's y and z dims (heads and sequences) hold at most this many blocks.
constexpr int64_t kMaxGridYZ = 65535;

// A row of S scores in shared memory takes this many floats: S rounded up to whole
// 16-byte words, and one word more. compute-sanitizer's memcheck saw the forward's
// serial loops read 12 bytes at the row's last element (at S = 1: past a 4-byte row);
// the padding keeps every access the compiler makes inside the allocation.
__host__ __device__ int64_t row_floats(int64_t tokens) { return (tokens + 3) / 4 * 4 + 4; }

// Where each head vector of one call lives in its contiguous [B, S, H, D] tensors, and
// where a row's statistics live in [B, Hq, Sq].
struct Shapes {
  int batch, queries, keys;  // B, Sq, Sk
  int heads, kv_heads, group;  // Hq, Hkv and R = Hq / Hkv
  int dim;

  __device__ int64_t query_at(int b, int i, int h) const {
    return ((int64_t{b} * queries + i) * heads + h) * dim;
  }
  __device__ int64_t key_at(int b, int j, int kv) const {
    return ((int64_t{b} * keys + j) * kv_heads + kv) * dim;
  }
  __device__ int64_t row(int b, int h, int i) const { return (int64_t{b} * heads + h) * queries + i; }
};

// AttentionMask::Table on the GPU: the same arrays and the same test.
struct Mask {
  bool causal;
  int queries, keys;
  const int64_t* query_position;  // [Sq]
  const int64_t* key_position;    // [Sk]
  const int64_t* query_document;  // [B * Sq]
  const int64_t* key_document;    // [B * Sk]; -1: a padded key, in no query's document

  __device__ bool visible(int b, int i, int j) const {
    return key_document[int64_t{b} * keys + j] == query_document[int64_t{b} * queries + i] &&
           (!causal || key_position[j] <= query_position[i]);
  }
};

// The tokens [first, end) that hold every visible token of a row; empty: {0, 0}.
struct Span {
  int first = INT_MAX, end = 0;
  __device__ void add(int token) {
    first = token < first ? token : first;
    end = token + 1 > end ? token + 1 : end;
  }
};

// The block's span from each thread's own. Integer min and max give the same span
// whatever order the threads arrive in. Synchronizes the block (so what the threads
// wrote to shared memory before it is visible after it); called once a kernel, as its
// shared words are not reset between calls.
__device__ Span block_span(const Span& mine) {
  __shared__ int first, end;
  if (threadIdx.x == 0) {
    first = INT_MAX;
    end = 0;
  }
  __syncthreads();
  atomicMin(&first, mine.first);
  atomicMax(&end, mine.end);
  __syncthreads();
  Span span;
  if (first < end) {
    span.first = first;
    span.end = end;
  } else {
    span.first = 0;  // no visible token: loops from `first` start inside int's range
  }
  return span;
}

// a · b over d, an fma chain in index order from +0.
__device__ float dot(const float* a, const float* b, int dim) {
  float sum = 0.0f;
  for (int d = 0; d < dim; ++d) sum = __fmaf_rn(a[d], b[d], sum);
  return sum;
}

__global__ void forward_kernel(Shapes shapes, Mask mask, float scale, const float* q,
                               const float* k, const float* v, float* out, float* row_max,
                               float* row_sum) {
  extern __shared__ float p[];  // p[j]: key j's score, then its exponential
  __shared__ float m_shared, l_shared;
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / shapes.group;
  const float* q_i = q + shapes.query_at(b, i, h);
  Span mine;
  for (int j = threadIdx.x; j < shapes.keys; j += blockDim.x) {
    if (!mask.visible(b, i, j)) continue;
    p[j] = __fmul_rn(scale, dot(q_i, k + shapes.key_at(b, j, kv), shapes.dim));
    mine.add(j);
  }
  const Span span = block_span(mine);
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int j = span.first; j < span.end; ++j) {
      if (mask.visible(b, i, j)) m = p[j] > m ? p[j] : m;
    }
    m_shared = m;
  }
  __syncthreads();
  const float m = m_shared;
  for (int j = span.first + static_cast<int>(threadIdx.x); j < span.end; j += blockDim.x) {
    if (mask.visible(b, i, j)) p[j] = correctly_rounded_exp(__fsub_rn(p[j], m));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float l = 0.0f;
    for (int j = span.first; j < span.end; ++j) {
      if (mask.visible(b, i, j)) l = __fadd_rn(l, p[j]);
    }
    l_shared = l;
    row_max[shapes.row(b, h, i)] = m;
    row_sum[shapes.row(b, h, i)] = l;
  }
  __syncthreads();
  const float l = l_shared;
  const bool any = span.first < span.end;
  for (int d = threadIdx.x; d < shapes.dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int j = span.first; j < span.end; ++j) {
      if (mask.visible(b, i, j)) sum = __fmaf_rn(p[j], v[shapes.key_at(b, j, kv) + d], sum);
    }
    out[shapes.query_at(b, i, h) + d] = any ? __fdiv_rn(sum, l) : 0.0f;  // no visible key: +0
  }
}

// δ of every row, in row_max's layout [B, Hq, Sq].
__global__ void delta_kernel(Shapes shapes, const float* g, const float* out, float* delta) {
  const int64_t count = int64_t{shapes.batch} * shapes.heads * shapes.queries;
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < count;
       n += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(n % shapes.queries);
    const int64_t head_row = n / shapes.queries;  // b * Hq + h
    const int h = static_cast<int>(head_row % shapes.heads), b = static_cast<int>(head_row / shapes.heads);
    delta[n] = dot(g + shapes.query_at(b, i, h), out + shapes.query_at(b, i, h), shapes.dim);
  }
}

// The forward's statistics of each row and its δ, all [B, Hq, Sq].
struct Rows {
  const float *row_max, *row_sum, *delta;
};

// P_ij = fl(exp(s_ij - m_i) / l_i) and dS_ij = fl(P_ij · fl(dP_ij - δ_i)) of query i,
// key j and query head h of sequence b, as the reference computes them.
struct ScoreGrad {
  float probability, ds;
};
__device__ ScoreGrad score_grad(const Shapes& shapes, const Rows& rows, float scale,
                                const float* q, const float* k, const float* v, const float* g,
                                int b, int i, int j, int h) {
  const int kv = h / shapes.group;
  const int64_t row = shapes.row(b, h, i);
  const float s = __fmul_rn(scale, dot(q + shapes.query_at(b, i, h), k + shapes.key_at(b, j, kv), shapes.dim));
  const float probability =
      __fdiv_rn(correctly_rounded_exp(__fsub_rn(s, rows.row_max[row])), rows.row_sum[row]);
  const float dp = dot(g + shapes.query_at(b, i, h), v + shapes.key_at(b, j, kv), shapes.dim);
  return {probability, __fmul_rn(probability, __fsub_rn(dp, rows.delta[row]))};
}

__global__ void dq_kernel(Shapes shapes, Mask mask, Rows rows, float scale, const float* q,
                          const float* k, const float* v, const float* g, float* dq) {
  extern __shared__ float ds[];  // ds[j] for key j
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / shapes.group;
  Span mine;
  for (int j = threadIdx.x; j < shapes.keys; j += blockDim.x) {
    if (!mask.visible(b, i, j)) continue;
    ds[j] = score_grad(shapes, rows, scale, q, k, v, g, b, i, j, h).ds;
    mine.add(j);
  }
  const Span span = block_span(mine);
  for (int d = threadIdx.x; d < shapes.dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int j = span.first; j < span.end; ++j) {
      if (mask.visible(b, i, j)) sum = __fmaf_rn(ds[j], k[shapes.key_at(b, j, kv) + d], sum);
    }
    dq[shapes.query_at(b, i, h) + d] = __fmul_rn(scale, sum);
  }
}

// Dynamic shared memory of the dk/dv kernel, in floats: P and dS of one query head by
// query (a row of Sq each), then the R heads' chains of the block's key, 2 D each.
__host__ __device__ int64_t dk_dv_floats(int64_t queries, int64_t group, int64_t dim) {
  return 2 * row_floats(queries) + group * 2 * dim;
}

__global__ void dk_dv_kernel(Shapes shapes, Mask mask, Rows rows, float scale, const float* q,
                             const float* k, const float* v, const float* g, float* dk,
                             float* dv) {
  extern __shared__ float shared[];
  float* probability = shared;                             // P_ij of one query head, by i
  float* ds = shared + row_floats(shapes.queries);         // dS_ij of that head, by i
  float* chains = ds + row_floats(shapes.queries);         // [R][2 D]: dv_j[d], then dk_j[d]
  const int j = blockIdx.x, kv = blockIdx.y, b = blockIdx.z;
  const int channels = 2 * shapes.dim;  // channel c < D: dv_j[c]; c >= D: dk_j[c - D]
  // Which queries see key j does not depend on the head.
  Span mine;
  for (int i = threadIdx.x; i < shapes.queries; i += blockDim.x) {
    if (mask.visible(b, i, j)) mine.add(i);
  }
  const Span span = block_span(mine);
  for (int r = 0; r < shapes.group; ++r) {
    const int h = kv * shapes.group + r;
    for (int i = span.first + static_cast<int>(threadIdx.x); i < span.end; i += blockDim.x) {
      if (!mask.visible(b, i, j)) continue;
      const ScoreGrad terms = score_grad(shapes, rows, scale, q, k, v, g, b, i, j, h);
      probability[i] = terms.probability;
      ds[i] = terms.ds;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
      const bool key_side = c >= shapes.dim;
      const int d = key_side ? c - shapes.dim : c;
      const float* weights = key_side ? ds : probability;
      const float* terms = key_side ? q : g;
      float sum = 0.0f;
      for (int i = span.first; i < span.end; ++i) {
        if (mask.visible(b, i, j)) sum = __fmaf_rn(weights[i], terms[shapes.query_at(b, i, h) + d], sum);
      }
      // The reference scales each head's dk chain before the heads meet.
      chains[r * channels + c] = key_side ? __fmul_rn(scale, sum) : sum;
    }
    __syncthreads();  // the next head overwrites P and dS
  }
  // Channel c's R values were written by this same thread (the loops above give c to
  // the same thread for every head). Their exact sum does not depend on the heads'
  // order; one head has nothing to add.
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    const float value =
        shapes.group == 1 ? chains[c] : exact::rounded_exact_sum(chains + c, shapes.group, channels);
    if (c >= shapes.dim) {
      dk[shapes.key_at(b, j, kv) + (c - shapes.dim)] = value;
    } else {
      dv[shapes.key_at(b, j, kv) + c] = value;
    }
  }
}

// The call's sizes, refused where they do not fit the grids: the tokens go in x (up to
// 2^31 - 1 blocks), the heads in y and the sequences in z.
Shapes check_shapes(const Tensor& q, const Tensor& k) {
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2);
  const int64_t keys = k.size(1), kv_heads = k.size(2), dim = q.size(3);
  SEQPAR_CHECK(queries <= INT_MAX && keys <= INT_MAX, "attention on CUDA: Sq = ", queries,
               " query tokens and Sk = ", keys, " key tokens must each be at most ", INT_MAX,
               " (a grid's x dim)");
  SEQPAR_CHECK(batch <= kMaxGridYZ && heads <= kMaxGridYZ, "attention on CUDA: B = ", batch,
               " sequences and Hq = ", heads, " query heads must each be at most ", kMaxGridYZ,
               " (a grid's z and y dims)");
  return Shapes{static_cast<int>(batch),    static_cast<int>(queries),  static_cast<int>(keys),
                static_cast<int>(heads),    static_cast<int>(kv_heads), static_cast<int>(heads / kv_heads),
                static_cast<int>(dim)};
}

// AttentionMask::Table's four arrays in one device buffer, and the Mask that reads them.
struct DeviceMask {
  DeviceBuffer<int64_t> arrays;
  Mask mask;
};
DeviceMask device_mask(const AttentionMask& mask, const Shapes& shapes, Device device) {
  const AttentionMask::Table table = mask.table(shapes.batch, shapes.queries, shapes.keys);
  std::vector<int64_t> host;
  for (const std::vector<int64_t>* part :
       {&table.query_position, &table.key_position, &table.query_document, &table.key_document}) {
    host.insert(host.end(), part->begin(), part->end());
  }
  DeviceMask result;
  result.arrays = DeviceBuffer<int64_t>(static_cast<int64_t>(host.size()), device);
  result.arrays.copy_from_host(host.data(), static_cast<int64_t>(host.size()));
  const int64_t* query_position = result.arrays.data();
  const int64_t* key_position = query_position + shapes.queries;
  const int64_t* query_document = key_position + shapes.keys;
  const int64_t* key_document = query_document + int64_t{shapes.batch} * shapes.queries;
  result.mask = {table.causal, shapes.queries,  shapes.keys, query_position,
                 key_position, query_document, key_document};
  return result;
}

// Bytes of `floats` floats of dynamic shared memory for `kernel`, refused past what a
// block of the device holds beside the kernel's own shared variables. `need` opens the
// message: what the rows are for.
template <typename... Parameters>
size_t shared_bytes(void (*kernel)(Parameters...), int64_t floats, Device device, const std::string& need) {
  int limit = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device.index));
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
  const size_t available = static_cast<size_t>(limit) - attributes.sharedSizeBytes;
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  SEQPAR_CHECK(bytes <= available, need, " need ", bytes, " bytes of shared memory a block, more than the ",
               available, " that ", device, " gives; run it on the cpu");
  cuda::allow_dynamic_shared_memory(kernel, bytes);
  return bytes;
}

dim3 grid(int tokens, int heads, int batch) {
  return dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

}  // namespace

AttentionForward attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionMask& mask, float scale) {
  const Shapes shapes = check_shapes(q, k);
  const Device device = q.device();
  cuda::set_device(device.index);
  const size_t bytes = shared_bytes(forward_kernel, row_floats(shapes.keys), device,
                                    "attention forward on CUDA: a row of Sk = " + std::to_string(shapes.keys) +
                                        " key scores");
  const Shape rows{shapes.batch, shapes.heads, shapes.queries};
  AttentionForward result{Tensor::empty(q.shape(), device), Tensor::empty(rows, device),
                          Tensor::empty(rows, device)};
  const DeviceMask where = device_mask(mask, shapes, device);
  forward_kernel<<<grid(shapes.queries, shapes.heads, shapes.batch), kThreads, bytes,
                   cuda::current_stream(device.index)>>>(shapes, where.mask, scale, q.data(), k.data(),
                                                         v.data(), result.out.data(),
                                                         result.row_max.data(), result.row_sum.data());
  CUDA_LAUNCH_CHECK();
  return result;
}

AttentionGrads attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionForward& forward,
                                       const AttentionMask& mask, float scale, bool queries,
                                       bool keys) {
  const Shapes shapes = check_shapes(q, k);
  const Device device = q.device();
  cuda::set_device(device.index);
  AttentionGrads grads;
  if (!queries && !keys) return grads;
  // Both refusals before any work, so a call that cannot run does none of it.
  const size_t dq_bytes =
      queries ? shared_bytes(dq_kernel, row_floats(shapes.keys), device,
                             "attention backward (dq) on CUDA: a row of Sk = " + std::to_string(shapes.keys) +
                                 " key scores")
              : 0;
  const size_t dk_dv_bytes =
      keys ? shared_bytes(dk_dv_kernel, dk_dv_floats(shapes.queries, shapes.group, shapes.dim), device,
                          "attention backward (dk, dv) on CUDA: two rows of Sq = " +
                              std::to_string(shapes.queries) + " query values and the chains of " +
                              std::to_string(shapes.group) + " query heads of D = " +
                              std::to_string(shapes.dim))
           : 0;
  const DeviceMask where = device_mask(mask, shapes, device);
  const cuda::Stream stream = cuda::current_stream(device.index);
  const Tensor delta = Tensor::empty({shapes.batch, shapes.heads, shapes.queries}, device);
  const int64_t row_count = int64_t{shapes.batch} * shapes.heads * shapes.queries;
  delta_kernel<<<cuda::blocks_for(row_count, kThreads, 65536), kThreads, 0, stream>>>(
      shapes, grad_out.data(), forward.out.data(), delta.data());
  CUDA_LAUNCH_CHECK();
  const Rows rows{forward.row_max.data(), forward.row_sum.data(), delta.data()};
  if (queries) {
    grads.q = Tensor::empty(q.shape(), device);
    dq_kernel<<<grid(shapes.queries, shapes.heads, shapes.batch), kThreads, dq_bytes, stream>>>(
        shapes, where.mask, rows, scale, q.data(), k.data(), v.data(), grad_out.data(), grads.q.data());
    CUDA_LAUNCH_CHECK();
  }
  if (keys) {
    grads.k = Tensor::empty(k.shape(), device);
    grads.v = Tensor::empty(v.shape(), device);
    dk_dv_kernel<<<grid(shapes.keys, shapes.kv_heads, shapes.batch), kThreads, dk_dv_bytes, stream>>>(
        shapes, where.mask, rows, scale, q.data(), k.data(), v.data(), grad_out.data(), grads.k.data(),
        grads.v.data());
    CUDA_LAUNCH_CHECK();
  }
  return grads;
}

}  // namespace seqpar::nn::detail
