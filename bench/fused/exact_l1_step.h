// ExactL1Step: the whole training step (y = x Wᵀ + b, L1 loss, backward, the
// gradients combined across ranks, clip_grad_norm, AdamW) as a few launches on the
// exact numerics of docs/numerics.md. Its loss, gradients, norm and parameters are the
// bits the public API gives (nn::linear, nn::l1_loss, backward, optim::clip_grad_norm,
// optim::AdamW) on the GPU and on the CPU, and, with the ranks' digits combined, the
// bits of one rank training on all their rows.
//
// The launches of a step (buffers allocated once; run eagerly, or captured into one
// CUDA graph per batch and replayed), each a dependent launch of the one before:
//   1. y = x Wᵀ + b by nn's forward (one fma chain per output: a row's y is the same
//      bits in any batch), which also finds x's column maxima (dW's fixed-point
//      windows) in its pass over x when the Linear is narrow (a pass of their own
//      otherwise);
//   2. the L1 loss from y (bench/fused/kernels/exact_l1.cuh): the loss's digits, dy, db's digits (every
//      nonzero dy is ±s, so db is s times a count of signs) and dy's maxima; in the
//      few-outputs forward's epilogue, from the y its threads hold, where x's rows allow
//      that kernel (16-byte aligned, in % 4 == 0), else a launch that reads y back
//      (bench/fused/kernels/exact_step.h);
//   3. dW's digits by nn's exact row sums (the fixed-point sums on the int8 tensor cores
//      when dy has one magnitude, which an L1 loss's dy has unless it holds a NaN),
//      taking dy's signs as step 2 laid them out for the tensor cores;
//   -  the ranks' digits added (exact::CrossRankSums), if the step has ranks;
//   4. the gradients and the loss rounded once, the exact norm, the clip coefficient and
//      AdamW, in one launch whose blocks meet once, all rows and ranks summed, to take
//      the norm; the digits and maxima zeroed for the next step as they are read (no
//      zeroing of their own).
// Every sum over rows is an integer sum of digits, so no grid, atomic order, split of
// the rows or NCCL algorithm changes a bit. Nothing in a step allocates, waits for the
// host or reads a value back.
//
// What the step leaves: the parameters (updated in place), loss() and total_norm() as
// device scalars, and the gradients before clipping in grad_weight() / grad_bias()
// (views of gradients()), which are also the parameters' .grad().
//
// Over NCCL, one process per GPU, each rank on its rows of the batch, captured:
//   fused::NcclEnqueuedSums sums(group);  // adds the digits inside the graph (nccl_enqueued.h)
//   fused::ExactL1Step step(model, {{x_shard, target_shard}},
//                           nn::Reduction::sum_divided_by(all_rows * out), adamw, max_norm, &sums);
//   step.run();       // NCCL connects on the first collective, outside the capture
//   step.capture();
//   for (...) step.replay();  // every rank holds one-rank training's bits
// (seqpar-bench --nproc 2 runs this and checks it against one rank on all rows.)
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/device_buffer.h"
#include "core/exact_sums.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "bench/fused/fused_step.h"
#include "bench/fused/kernels/exact_step.h"

namespace seqpar::fused {

class ExactL1Step : public detail::FusedL1Step {
 public:
  // `across`: how the ranks add their gradients' digits (e.g. dist::GroupSums over the
  // group that splits the rows, or fused::NcclEnqueuedSums), or null for one rank. With
  // ranks, each one's loss is its share of the global loss (Reduction::sum_divided_by
  // the global element count), and combine() is called once a step with the gradients'
  // digits. A step can be captured only without ranks or when the combiner only
  // enqueues stream-ordered work (CrossRankSums::only_enqueues).
  ExactL1Step(const nn::Linear& model, std::vector<Batch> batches, nn::Reduction reduction,
              const optim::AdamWOptions& adamw, double max_norm,
              exact::CrossRankSums* across = nullptr);
  ~ExactL1Step() override;

  // run(), capture(), replay() and the results: detail::FusedL1Step.

 private:
  void enqueue_step(size_t batch) override;
  const char* capture_refusal() const override;

  exact::CrossRankSums* across_;
  Tensor y_, grad_y_;
  exact::ExactSums gradient_sums_;  // dW's out * in sums, then db's out
  // One zeroing a step: the loss's digits (one sum), the norm's (two sums, W's and b's
  // squares, digit-major), then the maxima dW's sums read (unsigned words).
  DeviceBuffer<int64_t> step_words_;
  DeviceBuffer<unsigned> finish_counts_;  // the finishing kernel's counts of blocks
  kernels::ExactFinishGrid finish_grid_;
  DeviceBuffer<uint8_t> sign_fragments_;  // dy's signs for dW's sums (empty past 16 outputs)
  // Whether the digits and step words are known to be zero: the finishing kernel, the
  // step's last, zeroes them once read. A step that threw before it was
  // enqueued (a combine across ranks that failed) leaves them to the next step, which
  // zeroes them first.
  bool zeroed_ = true;
};

}  // namespace seqpar::fused
