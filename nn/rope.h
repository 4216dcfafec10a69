// Rotary position embedding (RoPE) with explicit global positions.
//
//   x         [S, H, D] or [B, S, H, D] float32 (batch first, as nn/attention.h), D even
//   positions one per token: S of them (every sequence of the batch at the same
//             positions) or B·S (each sequence its own, sequence after sequence). A
//             shard of the sequence passes its tokens' global indices, never
//             0..S/P-1; packed documents pass each token's position in its document
//             (document_positions below)
//   pairs     (x[m], x[m + D/2]) for m < D/2 (the "rotate half" layout of GPT-NeoX and
//             Hugging Face's Llama)
//   angle     a_tm = pos_t · θ_m,  θ_m = base^(-2m/D)
//   out[m]        = fl(fl(x[m] · cos) - fl(x[m + D/2] · sin))
//   out[m + D/2]  = fl(fl(x[m + D/2] · cos) + fl(x[m] · sin))
// The backward is the transposed rotation, in the same form:
//   dx[m]         = fl(fl(g[m] · cos) + fl(g[m + D/2] · sin))
//   dx[m + D/2]   = fl(fl(g[m + D/2] · cos) - fl(g[m] · sin))
//
// The cos/sin table is built once on the host (RopeTable; docs/numerics.md, "RoPE",
// states how) and copied to the device, so every device rotates by the same bits.
//
// Dispatch (nn/rope.cpp): reference and cpu run nn/reference/rope.cpp's loops (one
// pass of four multiplies an element pair: nothing to gain from another path); cuda
// runs nn/cuda/rope.cu, a thread an element pair with the same roundings.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "core/device.h"
#include "core/tensor.h"

namespace seqpar::nn {

// cos and sin of every (token, frequency) angle, [S, D/2] each, on `device`.
class RopeTable {
 public:
  RopeTable(const std::vector<int64_t>& positions, int64_t head_dim, float base = 10000.0f,
            Device device = Device::cpu());

  const Tensor& cos() const { return cos_; }
  const Tensor& sin() const { return sin_; }
  int64_t tokens() const { return cos_.size(0); }
  int64_t head_dim() const { return 2 * cos_.size(1); }
  Device device() const { return cos_.device(); }

 private:
  Tensor cos_, sin_;
};

// Positions that restart at each packed document: position p becomes p - c_k, where
// c_k <= p < c_k+1 are the boundaries of its document (ascending from 0, as
// AttentionMask::documents takes them). RoPE then sees each document from 0, as if it
// were alone; the attention mask is what keeps documents apart.
std::vector<int64_t> document_positions(const std::vector<int64_t>& boundaries,
                                        const std::vector<int64_t>& positions);

// ---- compute, no autograd ----
Tensor rope_forward(const Tensor& x, const RopeTable& table);
Tensor rope_backward(const Tensor& grad_out, const RopeTable& table);

// ---- differentiable (in x) ----
autograd::Variable rope(const autograd::Variable& x, const RopeTable& table);
// Builds the table for x's head dim on x's device (positions: S or B·S of them, as
// above), then as above.
autograd::Variable rope(const autograd::Variable& x, const std::vector<int64_t>& positions,
                        float base = 10000.0f);

}  // namespace seqpar::nn
