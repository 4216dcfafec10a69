// LinearL1Step: the whole training step -- y = x Wᵀ + b, L1 loss, backward,
// gradient synchronization, clip_grad_norm, AdamW -- as three kernel launches over
// buffers allocated once, run eagerly or captured into one CUDA graph per batch and
// replayed. It is the fast path for a skinny Linear (out_features <= 64)
// on one GPU, or on one GPU per rank with the all-reduce of the gradients captured
// in the same graph (GradientSync::stream_ordered, NcclProcessGroup::all_reduce_enqueue;
// seqpar-bench --nproc 2); the public API (autograd, nn::linear, nn::l1_loss,
// optim::AdamW) stays the readable reference, and the tests hold the two to the same
// numbers. The step keeps the older float numerics of its kernels (train/kernels/: fp32
// sums in their own order, dW and db from per-chunk partials), not the exact ones of
// nn's Linear (docs/numerics.md), so it matches the public API to float32 rounding and
// is not split-invariant: train/exact_l1_step.h is the same step on the exact numerics,
// about twice the time (bench/RESULTS.md). Checks, buffers, AdamW's scalars and the
// graphs are detail::FusedL1Step's (train/fused_step.h).
//
// The launches (train/kernels/skinny.h, train/kernels/clip_adamw.h):
//   1. one pass over x (in_features <= 1024): forward, |y - target|, dy = scale *
//      sign(y - target) and the dW and db partials of each chunk of rows, with x
//      staged through shared memory (y and dy never reach global memory);
//   2. the partials added in chunk order; the loss finished;
//   -  the gradient synchronization, if any (an all-reduce of the gradients across
//      ranks: see GradientSync);
//   3. norm, clip coefficient and AdamW in one launch.
// Wider inputs take the two-pass route, one launch more: the forward fused with the
// loss (writing sign), then dW and db over x again. Both routes give the same bits.
// Nothing in a step allocates, synchronizes with the host or reads a value back:
// AdamW's bias corrections come from a device table indexed by a device step counter
// (the host refreshes the table between launches every kTableSteps steps), and the
// clip coefficient never leaves the GPU. Same inputs, same bits: eager or replayed,
// run after run.
//
// What the step leaves: the parameters (updated in place, so the model sees them),
// loss() and total_norm() as device scalars, and the gradients before clipping in
// grad_weight() / grad_bias() (views of one buffer, gradients()), which are also the
// parameters' .grad().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/device_buffer.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "train/fused_step.h"

namespace seqpar::train {

// How a step makes its gradients the same on every rank: a hook called between the
// backward and the clip with the step's gradients, dW and db flattened into one
// buffer of out * in + out floats (grad_weight() and grad_bias() are views of it, so
// one all-reduce synchronizes both, as a DDP gradient bucket does), reduced in place;
// and what kind of work the hook does, which decides whether the step can be captured:
//
//   GradientSync{}                  no hook: one rank, nothing to synchronize.
//   GradientSync::on_host(hook)     the hook may meet its peers on the host (a threads
//                                   group's all_reduce, NcclProcessGroup::all_reduce,
//                                   which waits for the device): run() only, since a
//                                   graph cannot replay a host rendezvous.
//   GradientSync::stream_ordered(hook)
//                                   the hook only enqueues device work on the device's
//                                   current stream (cuda::current_stream) and never
//                                   waits for it or reads anything back, e.g.
//                                   NcclProcessGroup::all_reduce_enqueue: capture()
//                                   records that work into the step's graph.
// run() calls the hook once per step; capture() calls it once per batch, inside the
// capture, and replay() repeats the device work it enqueued, not its host code.
//
// Stream-ordered with NCCL, each rank:
//   auto sync = train::GradientSync::stream_ordered([&](Tensor& gradients) {
//     group.all_reduce_enqueue({gradients}, dist::ReduceOp::Sum, cuda::current_stream(device));
//   });
struct GradientSync {
  using Hook = std::function<void(Tensor& gradients)>;
  static GradientSync on_host(Hook hook) { return {std::move(hook), false}; }
  static GradientSync stream_ordered(Hook hook) { return {std::move(hook), true}; }

  Hook hook;                   // empty: no synchronization
  bool only_enqueues = false;  // the hook only enqueues stream-ordered work

  // Whether a step with this synchronization can be captured into a CUDA graph.
  bool capturable() const { return !hook || only_enqueues; }
};

class LinearL1Step : public detail::FusedL1Step {
 public:
  LinearL1Step(const nn::Linear& model, std::vector<Batch> batches, nn::Reduction reduction,
               const optim::AdamWOptions& adamw, double max_norm, GradientSync sync = {});
  ~LinearL1Step() override;

  // run(), capture(), replay() and the results: detail::FusedL1Step. capture() records
  // the synchronization when it is stream-ordered, and is refused for
  // GradientSync::on_host: a threads group meets its peers on the host, which a graph
  // cannot replay.

 private:
  void enqueue_gradients(size_t batch) override;
  const char* capture_refusal() const override;

  GradientSync sync_;
  struct OnePass;                   // nn's plan for the one-pass kernel (linear_l1_step.cpp)
  std::unique_ptr<OnePass> one_pass_;  // its .supported: the one-pass route
  Tensor sign_, weight_partials_;
  DeviceBuffer<double> loss_partials_, bias_partials_;
  int64_t loss_partial_count_ = 0;
};

}  // namespace seqpar::train
