// ExactGradientSync: the gradient sync of data- and sequence-parallel training that gives
// every rank one-rank training's gradients, bit for bit, however the rows were split over
// ranks and micro-batches.
//
// It owns the three steps of nn/exact_gradients.h: it records the exact row sums of the
// backward passes, adds them over the group (an integer all-reduce), and rounds each
// total once into its parameter's .grad(). A training loop on each rank:
//
//   nn::ExactGradientSync sync(model.parameters(), group);  // a shared dist::ProcessGroup
//   for (...) {
//     optimizer.zero_grad();
//     sync.backward(loss);   // once per micro-batch: loss.backward(), recorded
//     sync.synchronize();    // each .grad(): the total over every rank's rows
//     optimizer.step();
//   }
//
// Where the backward is called elsewhere, a Recording scope records it instead:
//
//   {
//     const nn::ExactGradientSync::Recording recording(sync);
//     loss.backward();
//   }
//
// Misuse is an error that names it, never gradients that quietly differ between ranks.
// A backward pass outside a recording leaves in .grad() this rank's partial gradient,
// rounded, with no exact sums to add: synchronize() would add nothing and each rank would
// step with its own gradient, the outcome of the DeepSpeed bug in docs/deepspeed-6868.md.
// So synchronize(), and a Recording as it begins, refuse:
//   - a parameter that received a gradient outside a recording (seen through
//     Variable::grad_accumulations);
//   - a sync of nothing while a parameter holds a gradient (from before the sync was made,
//     or set by hand);
//   - a parameter that received its gradient inside a recording from an op that keeps no
//     exact sums (only Linear keeps them), which could only be added in float;
//   - recorded sums of a parameter that is not one of the sync's.
// Every rank runs the same program, so every rank refuses the same way, before any
// collective.
//
// nn sits below dist (scripts/check-layering.sh), so the group is any type with
// all_reduce_sums(exact::ExactSums&) and name(), as dist::ProcessGroup has: the same seam
// as nn/sequence_group.h.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/exact_sums.h"
#include "nn/exact_gradients.h"

namespace seqpar::nn {

class ExactGradientSync {
 public:
  // `parameters` (each defined) over `ranks`, named `group_name` in errors. Collective
  // only in synchronize(): every rank of the group makes one with the same parameters.
  ExactGradientSync(std::vector<autograd::Variable> parameters, std::shared_ptr<exact::CrossRankSums> ranks,
                    std::string group_name);
  // Over a group with all_reduce_sums and name() (a dist::ProcessGroup); the sync shares
  // the group's ownership.
  template <typename Group>
  ExactGradientSync(std::vector<autograd::Variable> parameters, std::shared_ptr<Group> group);

  ExactGradientSync(const ExactGradientSync&) = delete;
  ExactGradientSync& operator=(const ExactGradientSync&) = delete;

  // While alive, backward passes on this thread record their exact sums into `sync`
  // (scopes nest; the innermost wins). Refuses, as it begins, a gradient received outside
  // a recording since the last one.
  class Recording {
   public:
    explicit Recording(ExactGradientSync& sync);
    ~Recording();
    Recording(const Recording&) = delete;
    Recording& operator=(const Recording&) = delete;

   private:
    ExactGradientSync& sync_;
    ExactGradients::Recording recording_;
  };

  // loss.backward() inside a Recording.
  void backward(const autograd::Variable& loss);

  // Collective over the group: checks what was recorded (the refusals above), adds the
  // recorded sums over the group and rounds each parameter's total once into its .grad(),
  // replacing the partial gradient backward left there. Then it is ready for the next
  // step. A parameter no backward reached keeps its .grad() as it was.
  void synchronize();

  const std::vector<autograd::Variable>& parameters() const { return parameters_; }

 private:
  // A group's all_reduce_sums as an exact::CrossRankSums.
  template <typename Group>
  class GroupSums final : public exact::CrossRankSums {
   public:
    explicit GroupSums(std::shared_ptr<Group> group) : group_(std::move(group)) {}
    void combine(exact::ExactSums& sums) override { group_->all_reduce_sums(sums); }

   private:
    std::shared_ptr<Group> group_;
  };

  std::vector<uint64_t> accumulations() const;
  // Refuses a parameter whose count moved since `seen_`: a backward outside a recording.
  void check_nothing_outside(const char* when) const;
  [[noreturn]] void refuse(size_t parameter, const std::string& what) const;
  // The check a Recording makes before it starts recording; returns *this.
  ExactGradientSync& begin_recording();

  std::vector<autograd::Variable> parameters_;
  std::shared_ptr<exact::CrossRankSums> ranks_;
  std::string group_name_;
  ExactGradients exact_;
  // Each parameter's grad_accumulations: as the last synchronize() left it (or the sync
  // was made), and as the last recording left it.
  std::vector<uint64_t> at_sync_, seen_;
};

template <typename Group>
ExactGradientSync::ExactGradientSync(std::vector<autograd::Variable> parameters, std::shared_ptr<Group> group)
    : ExactGradientSync(std::move(parameters),
                        group ? std::make_shared<GroupSums<Group>>(group) : nullptr,  // refused there
                        group ? group->name() : std::string()) {}

}  // namespace seqpar::nn
