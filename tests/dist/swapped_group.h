// A test double of a sequence-parallel group: the real exchange, then the first two
// ranks' slices of the result swapped, as if the collective had filed rank 0's data under
// rank 1 and the other way round. A layer whose exactness test passes with it could not
// tell a wrong layout from the right one: the tests use it to show that they can fail.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "nn/sequence_group.h"

namespace seqpar::test {

class SwappedSlices final : public nn::SequenceGroup {
 public:
  enum class Which { AllToAll, AllGather };  // the collective whose result is swapped

  SwappedSlices(std::shared_ptr<nn::SequenceGroup> inner, Which which) : inner_(std::move(inner)), which_(which) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name() + " (slices swapped)"; }
  void all_to_all(Tensor& output, const Tensor& input) override {
    inner_->all_to_all(output, input);
    if (which_ == Which::AllToAll) swap_first_two(output);
  }
  void all_gather(Tensor& output, const Tensor& input) override {
    inner_->all_gather(output, input);
    if (which_ == Which::AllGather) swap_first_two(output);
  }

 private:
  void swap_first_two(Tensor& output) const {
    const int64_t slice = output.size(0) / size();
    const Tensor first = output.narrow(0, 0, slice).clone();
    output.narrow(0, 0, slice).copy_(output.narrow(0, slice, slice));
    output.narrow(0, slice, slice).copy_(first);
  }

  std::shared_ptr<nn::SequenceGroup> inner_;
  Which which_;
};

}  // namespace seqpar::test
