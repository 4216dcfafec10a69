// CUDA path of nn/attention.h: the reference's chains (nn/reference/attention.cpp) in
// tiles, as FlashAttention schedules them, with one difference that keeps the bits: a
// chain is never split. Every sum over tokens is one thread's fma chain, continued tile
// after tile in the call's token order; what runs side by side are independent chains.
// Tensors are contiguous [B, S, H, D]; query head h reads kv head h / R (R = Hq / Hkv)
// in place, with no repeated copy of K and V.
//
// Tiles are 64 tokens; a block of 256 threads is a 16 x 16 grid, thread (tx, ty) owning
// rows ty*4 .. ty*4+3 of every 64-row tile it computes and columns tx*4 .. tx*4+3 of
// every 64 columns. Two kinds of tile product, both over shared memory:
//
//   over d      a 64 x 64 tile of scores (q_i · k_j) or of dP (g_i · v_j): each of the
//               thread's 16 elements an fma chain over d in order, from +0, as `dot` in
//               the reference. The row operand stays in shared memory for the whole
//               block; the column operand comes in transposed chunks of 64 d.
//   over tokens out (P·V), dq (dS·K), dv (Pᵀ·dO) and dk (dSᵀ·Q): each of the thread's
//               elements continues its chain with the tile's 64 tokens in order. A term
//               the mask hides is skipped, not added as 0 (an fma with 0 can turn -0
//               into +0, and 0 · inf is NaN).
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
//             [B, Sk, Hq, D] buffer and a last kernel gives
//             each kv element the exact sum of its R heads' values, rounded once
//             (core/exact_bins.h), as the reference does.
//
// Skipping. AttentionMask::Table (positions, documents, -1 for a padded key) is copied
// to the GPU with, for each 64-token tile, its positions' and documents' least and
// greatest values. A pair of tiles is hidden (skipped: it holds no visible pair) when
// their documents cannot meet or, causal, every key lies after every query; full (no
// test inside) when all of them share one document and, causal, every key lies at or
// before every query; otherwise each pair is tested as visible() does. A skipped tile
// adds no term, exactly as the reference adds none for a hidden key.
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

namespace seqpar::nn::detail {

namespace {

constexpr int kTile = 64;       // tokens a tile, and d a chunk
constexpr int kThreads = 256;   // a 16 x 16 grid, 4 x 4 elements each
constexpr int kStage = 68;      // row stride of a staged 64 x 64 tile: 16-byte rows, no bank conflicts
constexpr int64_t kMaxGridYZ = 65535;  // a grid's y and z dims (heads, sequences)

// Where each head vector of one call lives in its contiguous [B, S, H, D] tensors, and
// where a row's statistics live in [B, Hq, Sq].
struct Shapes {
  int batch, queries, keys;    // B, Sq, Sk
  int heads, kv_heads, group;  // Hq, Hkv and R = Hq / Hkv
  int dim;
  bool vectors;  // D a multiple of 4 and every tensor 16-byte aligned: float4 loads

  __host__ __device__ int64_t query_at(int b, int i, int h) const {
    return ((int64_t{b} * queries + i) * heads + h) * dim;
  }
  __host__ __device__ int64_t key_at(int b, int j, int kv) const {
    return ((int64_t{b} * keys + j) * kv_heads + kv) * dim;
  }
  __device__ int64_t row(int b, int h, int i) const { return (int64_t{b} * heads + h) * queries + i; }
};

// The least and greatest position and document of a tile's tokens.
struct TileRange {
  int64_t position_min, position_max, document_min, document_max;
};

// AttentionMask::Table on the GPU: the same arrays and the same test, and each tile's
// range, [B][tiles] for the queries and for the keys.
struct Mask {
  bool causal;
  int queries, keys;
  const int64_t* query_position;  // [Sq]
  const int64_t* key_position;    // [Sk]
  const int64_t* query_document;  // [B * Sq]
  const int64_t* key_document;    // [B * Sk]; -1: a padded key, in no query's document
  const TileRange* query_tiles;   // [B * ceil(Sq / 64)]
  const TileRange* key_tiles;     // [B * ceil(Sk / 64)]
};

__host__ __device__ int tiles(int tokens) { return (tokens + kTile - 1) / kTile; }

enum class Cover { kHidden, kPartial, kFull };

// How the mask covers query tile qt and key tile kt of sequence b; a tile cut short by
// the end of the sequence is partial, so the full path needs no bounds.
__device__ Cover cover(const Mask& mask, int b, int qt, int kt) {
  const TileRange q = mask.query_tiles[int64_t{b} * tiles(mask.queries) + qt];
  const TileRange k = mask.key_tiles[int64_t{b} * tiles(mask.keys) + kt];
  if (k.document_max < q.document_min || k.document_min > q.document_max) return Cover::kHidden;
  if (mask.causal && k.position_min > q.position_max) return Cover::kHidden;
  const bool whole = (qt + 1) * kTile <= mask.queries && (kt + 1) * kTile <= mask.keys;
  const bool one_document = q.document_min == q.document_max && k.document_min == k.document_max &&
                            q.document_min == k.document_min;
  if (whole && one_document && (!mask.causal || k.position_max <= q.position_min)) return Cover::kFull;
  return Cover::kPartial;
}

// One tile's positions and documents in shared memory; a token past the sequence's end
// gets a document no other token has, so visible() hides it.
struct TileMask {
  int64_t position[kTile], document[kTile];
};
constexpr int64_t kNoQuery = -3, kNoKey = -2;

__device__ void stage_mask(TileMask& tile, const int64_t* position, const int64_t* document, int first,
                           int count, int64_t absent) {
  for (int t = threadIdx.x; t < kTile; t += blockDim.x) {
    tile.position[t] = t < count ? position[first + t] : 0;
    tile.document[t] = t < count ? document[first + t] : absent;
  }
}

__device__ bool visible(bool causal, const TileMask& queries, int i, const TileMask& keys, int j) {
  return keys.document[j] == queries.document[i] && (!causal || keys.position[j] <= queries.position[i]);
}

__device__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ float part(const float4& v, int n) { return n == 0 ? v.x : n == 1 ? v.y : n == 2 ? v.z : v.w; }

// Loads rows [first, first + count) of a [tokens, stride] matrix, columns
// [col, col + width) (width <= 64), into a staged tile: `transposed` puts token t's
// element d at stage[d * 68 + t], else at stage[t * 68 + d]. What lies outside is 0.
__device__ void stage(float* tile, const float* src, int64_t stride, int count, int width, bool transposed,
                      bool vectors) {
  if (vectors) {
    // Consecutive threads read consecutive float4 of a row (row-major) or the same
    // float4 of consecutive rows (transposed), so that their shared stores do not
    // collide.
    for (int n = threadIdx.x; n < kTile * (kTile / 4); n += blockDim.x) {
      const int t = transposed ? n % kTile : n / (kTile / 4);
      const int d = 4 * (transposed ? n / kTile : n % (kTile / 4));
      float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < count && d < width) value = load4(src + t * stride + d);  // width is a multiple of 4
      if (transposed) {
        for (int e = 0; e < 4; ++e) tile[(d + e) * kStage + t] = part(value, e);
      } else {
        *reinterpret_cast<float4*>(tile + t * kStage + d) = value;
      }
    }
  } else {
    for (int n = threadIdx.x; n < kTile * kTile; n += blockDim.x) {
      const int t = transposed ? n % kTile : n / kTile, d = transposed ? n / kTile : n % kTile;
      const float value = t < count && d < width ? src[t * stride + d] : 0.0f;
      tile[transposed ? d * kStage + t : t * kStage + d] = value;
    }
  }
}

// Rows [first, first + count) of a [tokens, stride] matrix, all D columns, into a
// resident [64][width_stride] array; missing rows are 0.
__device__ void stage_rows(float* rows, int row_stride, const float* src, int64_t stride, int count, int dim,
                           bool vectors) {
  const int per_row = vectors ? dim / 4 : dim;
  for (int n = threadIdx.x; n < kTile * per_row; n += blockDim.x) {
    const int t = n / per_row, d = (n % per_row) * (vectors ? 4 : 1);
    if (vectors) {
      const float4 value = t < count ? load4(src + t * stride + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      *reinterpret_cast<float4*>(rows + t * row_stride + d) = value;
    } else {
      rows[t * row_stride + d] = t < count ? src[t * stride + d] : 0.0f;
    }
  }
}

// The first row and the first column of the thread's 4 x 4 elements in a 64 x 64 tile.
__device__ int thread_row() { return static_cast<int>(threadIdx.x >> 4) * 4; }
__device__ int thread_col() { return static_cast<int>(threadIdx.x & 15) * 4; }

// acc[a][c] continues the chain over d of row thread_row()+a of `rows` (resident, from
// column `first`) times column thread_col()+c of a transposed staged chunk, d < width.
__device__ __forceinline__ void product_over_d(float (&acc)[4][4], const float* rows, int row_stride, int first,
                                               const float* chunk, int width) {
  const float* w = rows + thread_row() * row_stride + first;
  const float* t = chunk + thread_col();
  int d = 0;
  for (; d + 4 <= width; d += 4) {
    float4 weights[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) weights[a] = load4(w + a * row_stride + d);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float4 terms = load4(t + (d + e) * kStage);
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][c] = __fmaf_rn(part(weights[a], e), part(terms, c), acc[a][c]);
      }
    }
  }
  for (; d < width; ++d) {
    const float4 terms = load4(t + d * kStage);
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const float x = w[a * row_stride + d];
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][c] = __fmaf_rn(x, part(terms, c), acc[a][c]);
    }
  }
}

// acc = the chains over d of the resident rows times the rows [0, count) of a
// [tokens, stride] matrix `src` (its 64 tokens as columns), staged a chunk of 64 d at a
// time. Synchronizes the block first, so what was written to shared memory before is
// seen by every thread.
template <int kChunks>
__device__ __forceinline__ void tile_over_d(float (&acc)[4][4], const float* rows, int row_stride, float* staged,
                                            const float* src, int64_t stride, int count, const Shapes& shapes) {
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[a][c] = 0.0f;
  }
#pragma unroll
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    if (chunk * kTile >= shapes.dim) break;
    const int width = min(kTile, shapes.dim - chunk * kTile);
    __syncthreads();  // the staged tile is free, and earlier shared writes are seen
    stage(staged, src + chunk * kTile, stride, count, width, true, shapes.vectors);
    __syncthreads();
    product_over_d(acc, rows, row_stride, chunk * kTile, staged, width);
  }
}

// acc[a][4 chunk + c] continues its chain over the tile's tokens t < count in order:
// weights[row thread_row()+a][t] (a staged tile by row and token) times terms[t][column
// thread_col()+c] (a staged row-major chunk). kMasked: a pair visible() hides adds no term.
template <bool kMasked, int N, typename Visible>
__device__ __forceinline__ void product_over_tokens(float (&acc)[4][N], int chunk, const float* weights,
                                                    const float* terms, int count, const Visible& visible) {
  const int row = thread_row();
  const float* w = weights + row * kStage;
  const float* t = terms + thread_col();
  const auto step = [&](int token, const float4& term, const float (&weight)[4]) {
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      if (kMasked && !visible(row + a, token)) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc[a][4 * chunk + c] = __fmaf_rn(weight[a], part(term, c), acc[a][4 * chunk + c]);
      }
    }
  };
  int token = 0;
  for (; token + 4 <= count; token += 4) {
    float4 weights4[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) weights4[a] = load4(w + a * kStage + token);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float weight[4] = {part(weights4[0], e), part(weights4[1], e), part(weights4[2], e),
                               part(weights4[3], e)};
      step(token + e, load4(t + (token + e) * kStage), weight);
    }
  }
  for (; token < count; ++token) {
    const float weight[4] = {w[token], w[kStage + token], w[2 * kStage + token], w[3 * kStage + token]};
    step(token, load4(t + token * kStage), weight);
  }
}

// acc continues its chains with the tile's tokens: `weights` (staged by row and token)
// times rows [0, count) of the [tokens, stride] matrix `src`, staged a chunk of 64
// columns at a time. Synchronizes the block first, as tile_over_d does.
template <int kChunks, int N, typename Visible>
__device__ __forceinline__ void tile_over_tokens(float (&acc)[4][N], const float* weights, float* staged,
                                                 const float* src, int64_t stride, int count, const Shapes& shapes,
                                                 Cover how, const Visible& visible) {
#pragma unroll
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    if (chunk * kTile >= shapes.dim) break;
    const int width = min(kTile, shapes.dim - chunk * kTile);
    __syncthreads();
    stage(staged, src + chunk * kTile, stride, count, width, false, shapes.vectors);
    __syncthreads();
    if (how == Cover::kFull) {
      product_over_tokens<false>(acc, chunk, weights, staged, kTile, visible);
    } else {
      product_over_tokens<true>(acc, chunk, weights, staged, count, visible);
    }
  }
}

// Writes a 4 x 4 block of values to a staged tile at (thread_row() + a, thread_col() + c).
__device__ void store_tile(float* tile, const float (&values)[4][4]) {
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    *reinterpret_cast<float4*>(tile + (thread_row() + a) * kStage + thread_col()) =
        make_float4(values[a][0], values[a][1], values[a][2], values[a][3]);
  }
}

// Writes row `row` of a thread's accumulators (columns thread_col() + c of each chunk),
// times `factor` if given, to dst[d] for d < D.
template <int N, typename Value>
__device__ void store_row(float* dst, const float (&acc)[N], const Shapes& shapes, const Value& value) {
#pragma unroll
  for (int chunk = 0; chunk < N / 4; ++chunk) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int d = chunk * kTile + thread_col() + c;
      if (d < shapes.dim) dst[d] = value(acc[4 * chunk + c]);
    }
  }
}

template <int kDimMax>
constexpr int resident_stride() {
  return kDimMax + 4;
}

// Shared memory of each kernel, in floats: resident 64-row operands, then two staged tiles.
template <int kDimMax>
constexpr int64_t shared_floats(int resident) {
  return int64_t{resident} * kTile * resident_stride<kDimMax>() + 2 * kTile * kStage;
}

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
