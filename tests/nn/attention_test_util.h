// Shared by the attention tests (attention_test.cpp, attention_split_test.cpp): a call's
// shapes, random inputs, one forward and backward through autograd, and the positions a
// shard holds.
#pragma once

#include <optional>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/attention.h"

namespace seqpar::test {

// A call's shapes: q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D].
struct Shapes {
  int64_t batch, queries, keys, heads, kv_heads, dim;
  Shape q() const { return {batch, queries, heads, dim}; }
  Shape kv() const { return {batch, keys, kv_heads, dim}; }
};

struct Inputs {
  Tensor q, k, v, g;
};

inline Inputs random_inputs(const Shapes& s, uint64_t seed, Device device, float spread = 1.0f) {
  Generator generator(seed);
  return {generator.uniform(s.q(), -spread, spread).to(device), generator.uniform(s.kv(), -spread, spread).to(device),
          generator.randn(s.kv()).to(device), generator.randn(s.q()).to(device)};
}

inline Inputs on(const Inputs& in, Device device) {
  return {in.q.to(device), in.k.to(device), in.v.to(device), in.g.to(device)};
}

// Forward and backward through autograd: out, dq, dk, dv.
inline std::vector<Tensor> run(const Inputs& in, const nn::AttentionMask& mask, std::optional<float> scale = {}) {
  autograd::Variable q(in.q, true), k(in.k, true), v(in.v, true);
  autograd::Variable out = nn::scaled_dot_product_attention(q, k, v, mask, scale);
  out.backward(in.g);
  return {out.data(), q.grad(), k.grad(), v.grad()};
}

// ---------------------------------------------------------------- a float64 attention


inline Shapes square(int64_t batch, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim) {
  return {batch, tokens, tokens, heads, kv_heads, dim};
}

// Rows `positions` of every sequence of a [B, S, H, D] tensor, in that order.
inline Tensor tokens_at(const Tensor& t, const std::vector<int64_t>& positions) {
  Tensor out = Tensor::empty({t.size(0), static_cast<int64_t>(positions.size()), t.size(2), t.size(3)}, t.device());
  for (size_t n = 0; n < positions.size(); ++n) out.narrow(1, static_cast<int64_t>(n), 1).copy_(t.narrow(1, positions[n], 1));
  return out;
}

inline std::vector<int64_t> range(int64_t first, int64_t end) {
  std::vector<int64_t> r;
  for (int64_t t = first; t < end; ++t) r.push_back(t);
  return r;
}

// The positions rank r of C holds: contiguous shards, or zigzag (chunks r and 2C-1-r of
// 2C), each ascending.
inline std::vector<int64_t> shard_positions(int64_t tokens, int ranks, int rank, bool zigzag) {
  if (!zigzag) return range(rank * tokens / ranks, (rank + 1) * tokens / ranks);
  const int64_t chunk = tokens / (2 * ranks);
  std::vector<int64_t> p = range(rank * chunk, (rank + 1) * chunk);
  for (int64_t t : range((2 * ranks - 1 - rank) * chunk, (2 * ranks - rank) * chunk)) p.push_back(t);
  return p;
}


}  // namespace seqpar::test
