// Test doubles of a sequence-parallel group, each one mistake, that the exactness tests
// must notice (the tests use them to show that they can fail):
//   SwappedSlices  the real exchange, then the first two ranks' slices of the result
//                  swapped, as if the collective had filed rank 0's data under rank 1 and
//                  the other way round: a layer that passes with it could not tell a
//                  wrong layout from the right one.
//   StaleGathers   all-gathers that, from a given call on, hand back what the same call
//                  of the previous step gathered, as a layer that cached gathered K/V or
//                  Q/dO across steps would see them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

class StaleGathers final : public nn::SequenceGroup {
 public:
  // Call n of all_gather (from 0) gathers for real; from call `first_stale` on, its
  // output is replaced by what call n - `period` gathered (period: the gathers of one
  // step, so the same tensor one step earlier).
  StaleGathers(std::shared_ptr<nn::SequenceGroup> inner, int64_t period, int64_t first_stale)
      : inner_(std::move(inner)), period_(period), first_stale_(first_stale) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name() + " (stale gathers)"; }
  void all_to_all(Tensor& output, const Tensor& input) override { inner_->all_to_all(output, input); }
  void all_gather(Tensor& output, const Tensor& input) override {
    inner_->all_gather(output, input);
    const int64_t call = static_cast<int64_t>(gathered_.size());
    gathered_.push_back(output.clone());
    if (call >= first_stale_ && call >= period_) output.copy_(gathered_[static_cast<size_t>(call - period_)]);
  }

 private:
  std::shared_ptr<nn::SequenceGroup> inner_;
  int64_t period_, first_stale_;
  std::vector<Tensor> gathered_;  // every call's real result
};

}  // namespace seqpar::test
