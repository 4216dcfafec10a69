// ExactGradients: gradients whose sums over rows stay exact and unrounded until every
// rank's rows are in, then are rounded once: one-rank training's gradient, bit for bit,
// however the rows were split over ranks and micro-batches.
//
// Linear's dW and db are sums over rows. Rounded on each rank and then added across
// ranks, they would depend on where the rows were cut (docs/numerics.md). So while a
// Recording is alive, Linear's backward also keeps its exact row sums (the digits of
// core/exact_sums.h) here, one ExactSums per Linear, in the order backward first makes
// them. The caller then adds them across ranks, in plain sight, and rounds once:
//
//   nn::ExactGradients exact;
//   {
//     const nn::ExactGradients::Recording recording(exact);  // this thread, as NoGradGuard
//     loss.backward();                                       // once per micro-batch
//   }
//   for (exact::ExactSums* sums : exact.sums()) group.all_reduce_sums(*sums);  // integers
//   exact.round_into_grads();                  // each .grad(): the exact total, rounded once
//
// Passes over the same parameters add into the same sums, so micro-batches accumulate
// exactly too. round_into_grads() replaces each recorded parameter's .grad() with its
// total (what backward accumulated there in float meanwhile is this rank's partial
// gradient, superseded) and forgets the sums, ready for the next step. Every rank makes
// the same passes over the same graph, so the lists line up rank by rank.
//
// This is the mechanism. A training loop uses nn::ExactGradientSync
// (nn/exact_gradient_sync.h), which owns the three steps above and refuses their misuse.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "core/exact_sums.h"

namespace seqpar::nn {

class ExactGradients {
 public:
  // Where part of an ExactSums goes: `parameter`'s gradient is sums [first, first + numel).
  struct Target {
    autograd::Variable parameter;
    int64_t first;
  };

  // While alive, ops on this thread record their row sums in `gradients` (scopes nest;
  // the innermost wins).
  class Recording {
   public:
    explicit Recording(ExactGradients& gradients);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

   private:
    ExactGradients* previous_;
  };

  // The recorded sums, one per op that recorded, in the order they were first recorded.
  std::vector<exact::ExactSums*> sums();
  // Each target's gradient rounded once from its sums, into its parameter's .grad();
  // then the sums are forgotten.
  void round_into_grads();
  bool empty() const { return entries_.empty(); }
  // Every parameter the recorded sums hold a gradient of, in the order of sums().
  std::vector<autograd::Variable> recorded_parameters() const;

  // For ops: adds `sums` into the current recording's sums for the same targets, or
  // keeps them (moved in, no copy) as new ones. False, and nothing kept, outside a
  // Recording.
  static bool record(exact::ExactSums&& sums, std::vector<Target> targets);

 private:
  struct Entry {
    std::vector<Target> targets;
    exact::ExactSums sums;
  };
  std::vector<Entry> entries_;
};

}  // namespace seqpar::nn
