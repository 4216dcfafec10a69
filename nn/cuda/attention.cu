// CUDA path of nn/attention.h: the reference's chains (nn/reference/attention.cpp) in
// tiles, as FlashAttention schedules them, with one difference that keeps the bits: a
// chain is never split. Every sum over tokens is one thread's fma chain, continued tile
// after tile in the call's token order; what runs side by side are independent chains.
// Tensors are contiguous [B, S, H, D]; query head h reads kv head h / R (R = Hq / Hkv)
// in place, with no repeated copy of K and V.
//
// The tiles, their staging, the two kinds of tile product and the masks' tile ranges
// are in nn/cuda/attention_tiles.cuh; this file is the kernels made of them.
//
// The kernels:
//   forward   block (query tile, query head, sequence). Pass 1 walks the key tiles for
//             each row's max (the first key in order holding it, so that ±0 ties give
//             the reference's sign: a max has no order otherwise). Pass 2 walks them
//             again: the same scores, p = exp(s - m), l by one thread a row in key
//             order, out += p · v. Then out = out / l, or +0 for a row with no visible
//             key.
//   delta     a thread per (b, h, i): δ_i = g_i · out_i, laid out as row_max.
//   dq        block (query tile, query head, sequence): key tiles in order; P, dS of
//             the tile, then dq += dS · K; times the scale at the end.
//   dk, dv    block (key tile, query head, sequence): query tiles in order; Pᵀ of the
//             tile, dv += Pᵀ · dO, then dSᵀ, dk += dSᵀ · Q; dk times the scale. With
//             R = 1 these are dk and dv; with R > 1 each query head's go to a
//             [B, Sk, Hq, D] buffer and a last kernel gives each kv element the exact
//             sum of its R heads' values, rounded once (core/exact_bins.h), as the
//             reference does.
//
// Every rounding is written out (__fmaf_rn, __fmul_rn, __fsub_rn, __fadd_rn, __fdiv_rn:
// nvcc contracts none of them into a different operation) and the exponential is
// core/exp.h's, correctly rounded, so every value is the reference's bit for bit. Each
// output element is written by one thread: no float atomics. Shared memory holds tiles,
// not rows, so S is bounded by the device's memory only.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/cuda_util.cuh"
#include "core/device_buffer.h"
#include "core/error.h"
#include "core/exact_bins.h"
#include "core/exp.h"
#include "nn/cuda/attention.h"
#include "nn/cuda/attention_tiles.cuh"

namespace seqpar::nn::detail {

namespace {

using namespace attention_tiles;

template <int kDimMax>
__global__ void __launch_bounds__(kThreads) forward_kernel(Shapes shapes, Mask mask, float scale, const float* q,
                                                           const float* k, const float* v, float* out,
                                                           float* row_max, float* row_sum) {
  constexpr int kRowStride = resident_stride<kDimMax>(), kChunks = kDimMax / kTile, kN = kDimMax / 16;
  extern __shared__ float4 shared_words[];
  float* q_rows = reinterpret_cast<float*>(shared_words);  // [64][kRowStride]
  float* staged = q_rows + kTile * kRowStride;            // K or V chunks
  float* p_tile = staged + kTile * kStage;                // p by (query, key)
  __shared__ TileMask query_mask, key_mask;
  __shared__ float m_row[kTile], l_row[kTile];
  __shared__ int any_row[kTile];

  const int qt = gridDim.x - 1 - blockIdx.x;  // the causal mask's longest rows start first
  const int h = blockIdx.y, b = blockIdx.z, kv = h / shapes.group;
  const int first = qt * kTile, count = min(kTile, shapes.queries - first);
  const int64_t q_stride = int64_t{shapes.heads} * shapes.dim, kv_stride = int64_t{shapes.kv_heads} * shapes.dim;
  stage_rows(q_rows, kRowStride, q + shapes.query_at(b, first, h), q_stride, count, shapes.dim, shapes.vectors);
  stage_mask(query_mask, mask.query_position, mask.query_document + int64_t{b} * shapes.queries, first, count,
             kNoQuery);
  const int row = thread_row(), col = thread_col();
  const auto seen = [&](int i, int j) { return visible(mask.causal, query_mask, i, key_mask, j); };

  // The scores of key tile kt, scaled, with the key mask staged where a test is needed.
  const auto scores = [&](int kt, Cover how, float (&s)[4][4]) {
    const int key_count = min(kTile, shapes.keys - kt * kTile);
    __syncthreads();  // the previous tile's readers of key_mask are done
    if (how == Cover::kPartial) {
      stage_mask(key_mask, mask.key_position, mask.key_document + int64_t{b} * shapes.keys, kt * kTile,
                 key_count, kNoKey);
    }
    tile_over_d<kChunks>(s, q_rows, kRowStride, staged, k + shapes.key_at(b, kt * kTile, kv), kv_stride,
                         key_count, shapes);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[a][c] = __fmul_rn(scale, s[a][c]);
    }
  };

  // Pass 1: each row's max, and the first key in order that holds it.
  float best[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int best_key[4] = {INT_MAX, INT_MAX, INT_MAX, INT_MAX}, any[4] = {0, 0, 0, 0};
  for (int kt = 0; kt < tiles(shapes.keys); ++kt) {
    const Cover how = cover(mask, b, qt, kt);
    if (how == Cover::kHidden) continue;
    float s[4][4];
    scores(kt, how, s);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (how != Cover::kFull && !seen(row + a, col + c)) continue;
        const int key = kt * kTile + col + c;
        any[a] = 1;
        if (s[a][c] > best[a] || (s[a][c] == best[a] && key < best_key[a])) {
          best[a] = s[a][c];
          best_key[a] = key;
        }
      }
    }
  }
  // The 16 threads of a row (lanes differing in their low 4 bits) agree on it; the
  // order of the comparisons does not matter, the key breaks ties.
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    for (int lane = 1; lane < 16; lane <<= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best[a], lane);
      const int other_key = __shfl_xor_sync(0xffffffffu, best_key[a], lane);
      any[a] |= __shfl_xor_sync(0xffffffffu, any[a], lane);
      if (other > best[a] || (other == best[a] && other_key < best_key[a])) {
        best[a] = other;
        best_key[a] = other_key;
      }
    }
    if (col == 0) {
      m_row[row + a] = best[a];
      any_row[row + a] = any[a];
    }
  }

  // Pass 2: p, l by the thread of its row (threads 0..63), out += p · v.
  float acc[4][kN] = {};
  float l = 0.0f;
  for (int kt = 0; kt < tiles(shapes.keys); ++kt) {
    const Cover how = cover(mask, b, qt, kt);
    if (how == Cover::kHidden) continue;
    const int key_count = min(kTile, shapes.keys - kt * kTile);
    float s[4][4];
    scores(kt, how, s);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool shown = how == Cover::kFull || seen(row + a, col + c);
        s[a][c] = shown ? correctly_rounded_exp(__fsub_rn(s[a][c], m_row[row + a])) : 0.0f;
      }
    }
    store_tile(p_tile, s);
    __syncthreads();
    if (threadIdx.x < kTile) {
      const int i = static_cast<int>(threadIdx.x);
      const float* p_row = p_tile + i * kStage;
      if (how == Cover::kFull) {
        // The row's 64 values come in 16 loads issued ahead of the chain, which the
        // other warps of the block wait for at the next barrier.
#pragma unroll
        for (int j = 0; j < kTile; j += 4) {
          const float4 p = load4(p_row + j);
          l = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(l, p.x), p.y), p.z), p.w);
        }
      } else {
        for (int j = 0; j < key_count; ++j) {
          if (seen(i, j)) l = __fadd_rn(l, p_row[j]);
        }
      }
    }
    tile_over_tokens<kChunks>(acc, p_tile, staged, v + shapes.key_at(b, kt * kTile, kv), kv_stride, key_count,
                              shapes, how, seen);
  }
  if (threadIdx.x < kTile) l_row[threadIdx.x] = l;
  __syncthreads();
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int i = row + a;
    if (i >= count) continue;
    const bool shown = any_row[i] != 0;
    const float denominator = l_row[i];
    store_row(out + shapes.query_at(b, first + i, h), acc[a], shapes,
              [&](float sum) { return shown ? __fdiv_rn(sum, denominator) : 0.0f; });  // no visible key: +0
  }
  if (static_cast<int>(threadIdx.x) < count) {
    row_max[shapes.row(b, h, first + threadIdx.x)] = m_row[threadIdx.x];
    row_sum[shapes.row(b, h, first + threadIdx.x)] = l_row[threadIdx.x];
  }
}

// a · b over d, an fma chain in index order from +0.
__device__ float dot(const float* a, const float* b, int dim) {
  float sum = 0.0f;
  for (int d = 0; d < dim; ++d) sum = __fmaf_rn(a[d], b[d], sum);
  return sum;
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

// P = fl(exp(s - m) / l) and dS = fl(P · fl(dP - δ)) of one pair, as the reference
// computes them from the scaled score s and dP.
__device__ float probability(float s, float m, float l) { return __fdiv_rn(correctly_rounded_exp(__fsub_rn(s, m)), l); }
__device__ float score_grad(float probability, float dp, float delta) {
  return __fmul_rn(probability, __fsub_rn(dp, delta));
}

// Row statistics of query tile `first` for head h into shared memory.
__device__ void stage_rows_statistics(const Shapes& shapes, const Rows& rows, int b, int h, int first, int count,
                                      float* m, float* l, float* delta) {
  for (int t = threadIdx.x; t < count; t += blockDim.x) {
    const int64_t n = shapes.row(b, h, first + t);
    m[t] = rows.row_max[n];
    l[t] = rows.row_sum[n];
    delta[t] = rows.delta[n];
  }
}

template <int kDimMax>
__global__ void __launch_bounds__(kThreads) dq_kernel(Shapes shapes, Mask mask, Rows rows, float scale,
                                                      const float* q, const float* k, const float* v,
                                                      const float* g, float* dq) {
  constexpr int kRowStride = resident_stride<kDimMax>(), kChunks = kDimMax / kTile, kN = kDimMax / 16;
  extern __shared__ float4 shared_words[];
  float* q_rows = reinterpret_cast<float*>(shared_words);
  float* g_rows = q_rows + kTile * kRowStride;
  float* staged = g_rows + kTile * kRowStride;
  float* ds_tile = staged + kTile * kStage;  // dS by (query, key)
  __shared__ TileMask query_mask, key_mask;
  __shared__ float m_row[kTile], l_row[kTile], delta_row[kTile];

  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, kv = h / shapes.group;
  const int first = qt * kTile, count = min(kTile, shapes.queries - first);
  const int64_t q_stride = int64_t{shapes.heads} * shapes.dim, kv_stride = int64_t{shapes.kv_heads} * shapes.dim;
  stage_rows(q_rows, kRowStride, q + shapes.query_at(b, first, h), q_stride, count, shapes.dim, shapes.vectors);
  stage_rows(g_rows, kRowStride, g + shapes.query_at(b, first, h), q_stride, count, shapes.dim, shapes.vectors);
  stage_mask(query_mask, mask.query_position, mask.query_document + int64_t{b} * shapes.queries, first, count,
             kNoQuery);
  stage_rows_statistics(shapes, rows, b, h, first, count, m_row, l_row, delta_row);
  const int row = thread_row(), col = thread_col();
  const auto seen = [&](int i, int j) { return visible(mask.causal, query_mask, i, key_mask, j); };

  float acc[4][kN] = {};
  for (int kt = 0; kt < tiles(shapes.keys); ++kt) {
    const Cover how = cover(mask, b, qt, kt);
    if (how == Cover::kHidden) continue;
    const int key_count = min(kTile, shapes.keys - kt * kTile);
    const int64_t key = shapes.key_at(b, kt * kTile, kv);
    __syncthreads();
    if (how == Cover::kPartial) {
      stage_mask(key_mask, mask.key_position, mask.key_document + int64_t{b} * shapes.keys, kt * kTile,
                 key_count, kNoKey);
    }
    float s[4][4], dp[4][4];
    tile_over_d<kChunks>(s, q_rows, kRowStride, staged, k + key, kv_stride, key_count, shapes);
    tile_over_d<kChunks>(dp, g_rows, kRowStride, staged, v + key, kv_stride, key_count, shapes);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = row + a;
        const bool shown = how == Cover::kFull || seen(i, col + c);
        s[a][c] = shown ? score_grad(probability(__fmul_rn(scale, s[a][c]), m_row[i], l_row[i]), dp[a][c],
                                     delta_row[i])
                        : 0.0f;
      }
    }
    store_tile(ds_tile, s);
    tile_over_tokens<kChunks>(acc, ds_tile, staged, k + key, kv_stride, key_count, shapes, how, seen);
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    if (row + a >= count) continue;
    store_row(dq + shapes.query_at(b, first + row + a, h), acc[a], shapes,
              [&](float sum) { return __fmul_rn(scale, sum); });
  }
}

// dk and dv of key tile blockIdx.x for query head blockIdx.y of sequence blockIdx.z:
// the chains over the query tiles in order. `per_head` (R > 1): write them at
// [B, Sk, Hq, D] for the heads' exact sum, else they are the results. A block a query
// head, not a kv head, so that GQA's R heads run side by side: a key tile's work is the
// longest in the grid (key tile 0 meets every query tile), and R of them in a row would
// bound the whole call.
//
// At most two sets of accumulators live at once: Pᵀ goes to shared memory as soon as it
// is computed and dv takes it, and only then is dP computed; dS is then formed from the
// Pᵀ still in shared memory. So at D up to 128 two blocks fit an SM's registers.
template <int kDimMax>
__global__ void __launch_bounds__(kThreads, kDimMax <= 128 ? 2 : 1)
    dk_dv_kernel(Shapes shapes, Mask mask, Rows rows, float scale, const float* q, const float* k, const float* v,
                 const float* g, float* dk, float* dv, bool per_head) {
  constexpr int kRowStride = resident_stride<kDimMax>(), kChunks = kDimMax / kTile, kN = kDimMax / 16;
  extern __shared__ float4 shared_words[];
  float* k_rows = reinterpret_cast<float*>(shared_words);
  float* v_rows = k_rows + kTile * kRowStride;
  float* staged = v_rows + kTile * kRowStride;
  float* w_tile = staged + kTile * kStage;  // Pᵀ, then dSᵀ, by (key, query)
  __shared__ TileMask query_mask, key_mask;
  __shared__ float m_row[kTile], l_row[kTile], delta_row[kTile];

  const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z, kv = h / shapes.group;
  const int first_key = kt * kTile, key_count = min(kTile, shapes.keys - first_key);
  const int64_t q_stride = int64_t{shapes.heads} * shapes.dim, kv_stride = int64_t{shapes.kv_heads} * shapes.dim;
  stage_rows(k_rows, kRowStride, k + shapes.key_at(b, first_key, kv), kv_stride, key_count, shapes.dim,
             shapes.vectors);
  stage_rows(v_rows, kRowStride, v + shapes.key_at(b, first_key, kv), kv_stride, key_count, shapes.dim,
             shapes.vectors);
  stage_mask(key_mask, mask.key_position, mask.key_document + int64_t{b} * shapes.keys, first_key, key_count,
             kNoKey);
  const int row = thread_row(), col = thread_col();
  // Rows of these tiles are keys, columns and tokens queries.
  const auto seen = [&](int j, int i) { return visible(mask.causal, query_mask, i, key_mask, j); };

  float dk_acc[4][kN] = {}, dv_acc[4][kN] = {};
  for (int qt = 0; qt < tiles(shapes.queries); ++qt) {
    const Cover how = cover(mask, b, qt, kt);
    if (how == Cover::kHidden) continue;
    const int first = qt * kTile, count = min(kTile, shapes.queries - first);
    const int64_t query = shapes.query_at(b, first, h);
    __syncthreads();  // the previous tile's readers of the query mask and statistics are done
    stage_mask(query_mask, mask.query_position, mask.query_document + int64_t{b} * shapes.queries, first, count,
               kNoQuery);
    stage_rows_statistics(shapes, rows, b, h, first, count, m_row, l_row, delta_row);
    {
      float s[4][4];
      tile_over_d<kChunks>(s, k_rows, kRowStride, staged, q + query, q_stride, count, shapes);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = col + c;
          const bool shown = how == Cover::kFull || seen(row + a, i);
          s[a][c] = shown ? probability(__fmul_rn(scale, s[a][c]), m_row[i], l_row[i]) : 0.0f;
        }
      }
      store_tile(w_tile, s);
    }
    tile_over_tokens<kChunks>(dv_acc, w_tile, staged, g + query, q_stride, count, shapes, how, seen);
    // tile_over_d's first barrier: every thread is done with Pᵀ as weights, so each may
    // replace its own elements of it by dSᵀ.
    float dp[4][4];
    tile_over_d<kChunks>(dp, v_rows, kRowStride, staged, g + query, q_stride, count, shapes);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float4 p = load4(w_tile + (row + a) * kStage + col);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = col + c;
        const bool shown = how == Cover::kFull || seen(row + a, i);
        dp[a][c] = shown ? score_grad(part(p, c), dp[a][c], delta_row[i]) : 0.0f;
      }
    }
    store_tile(w_tile, dp);
    tile_over_tokens<kChunks>(dk_acc, w_tile, staged, q + query, q_stride, count, shapes, how, seen);
  }
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int j = first_key + row + a;
    if (row + a >= key_count) continue;
    const int64_t at =
        per_head ? ((int64_t{b} * shapes.keys + j) * shapes.heads + h) * shapes.dim : shapes.key_at(b, j, kv);
    // The reference scales each head's dk chain before the heads meet.
    store_row(dk + at, dk_acc[a], shapes, [&](float sum) { return __fmul_rn(scale, sum); });
    store_row(dv + at, dv_acc[a], shapes, [](float sum) { return sum; });
  }
}

// dk, dv [B, Sk, Hkv, D] from the R heads' values [B, Sk, Hq, D]: each element the exact
// sum of its R values, rounded once; the sum does not depend on the heads' order.
__global__ void head_sum_kernel(Shapes shapes, const float* dk_heads, const float* dv_heads, float* dk,
                                float* dv) {
  const int64_t count = int64_t{shapes.batch} * shapes.keys * shapes.kv_heads * shapes.dim;
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < count;
       n += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = n % shapes.dim, key_head = n / shapes.dim;  // (b * Sk + j) * Hkv + kv
    const int64_t kv = key_head % shapes.kv_heads, key = key_head / shapes.kv_heads;
    const int64_t at = (key * shapes.heads + kv * shapes.group) * shapes.dim + d;
    dk[n] = exact::rounded_exact_sum(dk_heads + at, shapes.group, shapes.dim);
    dv[n] = exact::rounded_exact_sum(dv_heads + at, shapes.group, shapes.dim);
  }
}

bool aligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The call's sizes, refused where they do not fit the grids: the tiles go in x, the
// heads in y and the sequences in z.
Shapes check_shapes(const Tensor& q, const Tensor& k, std::initializer_list<const Tensor*> tensors) {
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2);
  const int64_t keys = k.size(1), kv_heads = k.size(2), dim = q.size(3);
  SEQPAR_CHECK(queries <= INT_MAX - kTile && keys <= INT_MAX - kTile, "attention on CUDA: Sq = ", queries,
               " query tokens and Sk = ", keys, " key tokens must each be at most ", INT_MAX - kTile);
  SEQPAR_CHECK(batch <= kMaxGridYZ && heads <= kMaxGridYZ, "attention on CUDA: B = ", batch,
               " sequences and Hq = ", heads, " query heads must each be at most ", kMaxGridYZ,
               " (a grid's z and y dims)");
  bool vectors = dim % 4 == 0;
  for (const Tensor* t : tensors) vectors = vectors && aligned(t->data());
  return Shapes{static_cast<int>(batch),    static_cast<int>(queries),  static_cast<int>(keys),
                static_cast<int>(heads),    static_cast<int>(kv_heads), static_cast<int>(heads / kv_heads),
                static_cast<int>(dim),      vectors};
}

// Each tile's least and greatest position and document, for `batch` sequences of `tokens`.
void append_tile_ranges(std::vector<int64_t>& out, const std::vector<int64_t>& position,
                        const std::vector<int64_t>& document, int64_t batch, int64_t tokens) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t first = 0; first < tokens; first += kTile) {
      TileRange range{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN};
      for (int64_t t = first; t < std::min(tokens, first + kTile); ++t) {
        range.position_min = std::min(range.position_min, position[t]);
        range.position_max = std::max(range.position_max, position[t]);
        range.document_min = std::min(range.document_min, document[b * tokens + t]);
        range.document_max = std::max(range.document_max, document[b * tokens + t]);
      }
      out.insert(out.end(), {range.position_min, range.position_max, range.document_min, range.document_max});
    }
  }
}

// AttentionMask::Table's four arrays and the tiles' ranges in one device buffer, and the
// Mask that reads them.
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
  const size_t query_tiles_at = host.size();
  append_tile_ranges(host, table.query_position, table.query_document, shapes.batch, shapes.queries);
  const size_t key_tiles_at = host.size();
  append_tile_ranges(host, table.key_position, table.key_document, shapes.batch, shapes.keys);
  DeviceMask result;
  result.arrays = DeviceBuffer<int64_t>(std::max<int64_t>(1, static_cast<int64_t>(host.size())), device);
  result.arrays.copy_from_host(host.data(), static_cast<int64_t>(host.size()));
  const int64_t* base = result.arrays.data();
  const int64_t* query_position = base;
  const int64_t* key_position = query_position + shapes.queries;
  const int64_t* query_document = key_position + shapes.keys;
  const int64_t* key_document = query_document + int64_t{shapes.batch} * shapes.queries;
  result.mask = {table.causal,
                 shapes.queries,
                 shapes.keys,
                 query_position,
                 key_position,
                 query_document,
                 key_document,
                 reinterpret_cast<const TileRange*>(base + query_tiles_at),
                 reinterpret_cast<const TileRange*>(base + key_tiles_at)};
  return result;
}

// Bytes of `floats` floats of dynamic shared memory for `kernel`, refused past what a
// block of the device holds beside the kernel's own shared variables.
template <typename... Parameters>
size_t shared_bytes(void (*kernel)(Parameters...), int64_t floats, Device device, const Shapes& shapes) {
  int limit = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device.index));
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
  const size_t available = static_cast<size_t>(limit) - attributes.sharedSizeBytes;
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  SEQPAR_CHECK(bytes <= available, "attention on CUDA: tiles of 64 tokens at D = ", shapes.dim, " need ", bytes,
               " bytes of shared memory a block, more than the ", available, " that ", device,
               " gives; run it on the cpu");
  cuda::allow_dynamic_shared_memory(kernel, bytes);
  return bytes;
}

dim3 grid(int tokens, int heads, int batch) {
  return dim3(static_cast<unsigned>(tiles(tokens)), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

// The kernels' tile code is compiled for D up to 64, 128 and 256 (the accumulators
// live in registers, so their count is fixed at compile time); a call takes the
// smallest that holds its D.
template <typename Run>
void with_dim_max(int dim, const Run& run) {
  if (dim <= 64) {
    run(std::integral_constant<int, 64>{});
  } else if (dim <= 128) {
    run(std::integral_constant<int, 128>{});
  } else {
    run(std::integral_constant<int, 256>{});
  }
}

}  // namespace

AttentionForward attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionMask& mask, float scale) {
  const Device device = q.device();
  cuda::set_device(device.index);
  const Shape rows{q.size(0), q.size(2), q.size(1)};
  AttentionForward result{Tensor::empty(q.shape(), device), Tensor::empty(rows, device),
                          Tensor::empty(rows, device)};
  const Shapes shapes = check_shapes(q, k, {&q, &k, &v, &result.out});
  const DeviceMask where = device_mask(mask, shapes, device);
  with_dim_max(shapes.dim, [&](auto dim_max) {
    constexpr int kDimMax = decltype(dim_max)::value;
    const size_t bytes = shared_bytes(forward_kernel<kDimMax>, shared_floats<kDimMax>(1), device, shapes);
    forward_kernel<kDimMax><<<grid(shapes.queries, shapes.heads, shapes.batch), kThreads, bytes,
                              cuda::current_stream(device.index)>>>(
        shapes, where.mask, scale, q.data(), k.data(), v.data(), result.out.data(), result.row_max.data(),
        result.row_sum.data());
    CUDA_LAUNCH_CHECK();
  });
  return result;
}

AttentionGrads attention_backward_cuda(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionForward& forward,
                                       const AttentionMask& mask, float scale, bool queries,
                                       bool keys) {
  const Device device = q.device();
  cuda::set_device(device.index);
  AttentionGrads grads;
  if (!queries && !keys) return grads;
  if (queries) grads.q = Tensor::empty(q.shape(), device);
  if (keys) {
    grads.k = Tensor::empty(k.shape(), device);
    grads.v = Tensor::empty(v.shape(), device);
  }
  const Shapes shapes = check_shapes(q, k, {&grad_out, &q, &k, &v, &forward.out});
  const DeviceMask where = device_mask(mask, shapes, device);
  const cuda::Stream stream = cuda::current_stream(device.index);
  const Tensor delta = Tensor::empty({shapes.batch, shapes.heads, shapes.queries}, device);
  const int64_t row_count = int64_t{shapes.batch} * shapes.heads * shapes.queries;
  delta_kernel<<<cuda::blocks_for(row_count, 128, 65536), 128, 0, stream>>>(shapes, grad_out.data(),
                                                                          forward.out.data(), delta.data());
  CUDA_LAUNCH_CHECK();
  const Rows rows{forward.row_max.data(), forward.row_sum.data(), delta.data()};
  with_dim_max(shapes.dim, [&](auto dim_max) {
    constexpr int kDimMax = decltype(dim_max)::value;
    if (queries) {
      const size_t bytes = shared_bytes(dq_kernel<kDimMax>, shared_floats<kDimMax>(2), device, shapes);
      dq_kernel<kDimMax><<<grid(shapes.queries, shapes.heads, shapes.batch), kThreads, bytes, stream>>>(
          shapes, where.mask, rows, scale, q.data(), k.data(), v.data(), grad_out.data(), grads.q.data());
      CUDA_LAUNCH_CHECK();
    }
    if (keys) {
      const size_t bytes = shared_bytes(dk_dv_kernel<kDimMax>, shared_floats<kDimMax>(2), device, shapes);
      const bool per_head = shapes.group > 1;
      const Shape heads_shape{shapes.batch, shapes.keys, shapes.heads, shapes.dim};
      const Tensor dk_heads = per_head ? Tensor::empty(heads_shape, device) : grads.k;
      const Tensor dv_heads = per_head ? Tensor::empty(heads_shape, device) : grads.v;
      dk_dv_kernel<kDimMax><<<grid(shapes.keys, shapes.heads, shapes.batch), kThreads, bytes, stream>>>(
          shapes, where.mask, rows, scale, q.data(), k.data(), v.data(), grad_out.data(), dk_heads.data(),
          dv_heads.data(), per_head);
      CUDA_LAUNCH_CHECK();
      if (per_head) {
        head_sum_kernel<<<cuda::blocks_for(grads.k.numel(), 128, 65536), 128, 0, stream>>>(
            shapes, dk_heads.data(), dv_heads.data(), grads.k.data(), grads.v.data());
        CUDA_LAUNCH_CHECK();
      }
    }
  });
  return grads;
}

}  // namespace seqpar::nn::detail
