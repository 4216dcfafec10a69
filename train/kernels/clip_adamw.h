// Gradient clipping and AdamW in one kernel launch, for the small models of a
// captured training step on float numerics (train/linear_l1_step.h): with 10,256
// parameters the step's optimizer tail is all launch latency, and a CUDA graph replays
// whatever scalars it captured, so here
//   - every block computes the total norm itself, in one fixed order (the same bits
//     in every block: no second launch, no atomics on floats), as
//     torch.nn.utils.clip_grad_norm_ forms it (per-tensor float norms, then the norm
//     of the norms), and applies min(1, max_norm / (norm + 1e-6)) to the gradient it
//     feeds AdamW (the stored gradients stay unclipped: other blocks are still
//     reading them);
//   - AdamW's scalars come from a device table indexed by a device step counter that
//     the last block to finish advances (an integer atomic counts the blocks), so a
//     replayed graph takes step 1, 2, 3, ... with the bias corrections of each. The
//     table holds the host's adamw_step_scalars, the values the eager paths use.
//   - the element update is optim/adamw_update.cuh, shared with the AdamW kernel.
// The exact step (train/exact_l1_step.h) clips and updates in its own finishing kernel
// (train/kernels/exact_step.h), where its exact norm is formed.
#pragma once

#include <cstdint>

#include "core/cuda_runtime.h"
#include "optim/adamw.h"

namespace seqpar::train::kernels {

using optim::detail::AdamWStepScalars;
using optim::detail::AdamWTensors;

#ifdef SEQPAR_WITH_CUDA

// Device memory owned by the caller.
struct ClipAdamWState {
  const AdamWStepScalars* table;  // table[i]: the scalars of some step base + i
  int* step_slot;                 // index into table of this step; advanced by one per launch
  unsigned* blocks_done;          // zero between launches
  float* total_norm;              // the total norm before clipping: written
};

// At most this many elements over all tensors (every block reads every gradient), in
// at most one TensorTable (multi_tensor.cuh): the fused path is for small models.
bool clip_adamw_fits(const std::vector<int64_t>& sizes);

void clip_adamw_step_cuda(const AdamWTensors& tensors, float max_norm,
                          const ClipAdamWState& state, cuda::Stream stream);

#endif

}  // namespace seqpar::train::kernels
