// The tile machinery of nn/cuda/attention.cu: shapes and masks on the device, staging
// of 64-token tiles in shared memory, and the two kinds of tile product every kernel of
// that file is made of. It is a header only so that the kernels read as their steps;
// attention.cu is its one includer.
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
// Skipping. AttentionMask::Table (positions, documents, -1 for a padded key) is copied
// to the GPU with, for each 64-token tile, its positions' and documents' least and
// greatest values. A pair of tiles is hidden (skipped: it holds no visible pair) when
// their documents cannot meet or, causal, every key lies after every query; full (no
// test inside) when all of them share one document and, causal, every key lies at or
// before every query; otherwise each pair is tested as visible() does. A skipped tile
// adds no term, exactly as the reference adds none for a hidden key.
#pragma once

#include <climits>
#include <cstdint>

#include "core/cuda_util.cuh"

namespace seqpar::nn::detail::attention_tiles {

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

__host__ __device__ inline int tiles(int tokens) { return (tokens + kTile - 1) / kTile; }

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

}  // namespace seqpar::nn::detail::attention_tiles
