// SequenceGroup: what nn's sequence-parallel layers need of the ranks that share a
// sequence: their number, this rank's place, and an equal-split all-to-all.
//
// nn sits below dist (scripts/check-layering.sh: nn sees autograd and core only), so it
// cannot name dist::ProcessGroup. It names this seam instead, as core's
// exact::CrossRankSums lets dist add exact sums without core knowing dist. Any group
// with rank(), size(), name(), all_to_all(output, input) and all_gather(output, input)
// fits (dist::ProcessGroup has them):
//
//   auto group = nn::sequence_group(mesh_groups.sp_group);   // a shared dist::ProcessGroup
//   nn::UlyssesAttention attention(group);
//
// all_to_all keeps dist/all_to_all.h's contract: input and output [size() * n, ...];
// chunk j of the input goes to rank j, and rank i's chunk for this rank lands in chunk i
// of the output; bytes move unchanged; equal splits only. It is collective: every rank
// of the group calls it, in the same order.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace seqpar::nn {

class SequenceGroup {
 public:
  virtual ~SequenceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // for messages ("sp[0-3]")
  virtual void all_to_all(Tensor& output, const Tensor& input) = 0;
  // output [size() * n, ...] for inputs of [n, ...]; rank r's input lands in slice r
  // (dist::ProcessGroup's contract). What context parallelism gathers K and V with. By
  // default an all-to-all of size() copies of the input, for groups (test doubles)
  // that have only all_to_all: the same result, at size() times the bytes sent.
  virtual void all_gather(Tensor& output, const Tensor& input);
};

// A group with those four methods, seen as a SequenceGroup; it shares the group's
// ownership, so the layers that hold it keep the group alive.
template <typename Group>
class SequenceGroupOf final : public SequenceGroup {
 public:
  explicit SequenceGroupOf(std::shared_ptr<Group> group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::string name() const override { return group_->name(); }
  void all_to_all(Tensor& output, const Tensor& input) override { group_->all_to_all(output, input); }
  void all_gather(Tensor& output, const Tensor& input) override { group_->all_gather(output, input); }

 private:
  std::shared_ptr<Group> group_;
};

template <typename Group>
std::shared_ptr<SequenceGroup> sequence_group(std::shared_ptr<Group> group) {
  return std::make_shared<SequenceGroupOf<Group>>(std::move(group));
}

// The group of one rank, for a model that runs without sequence parallelism: its
// all-to-all copies the input to the output.
std::shared_ptr<SequenceGroup> single_rank_group();

}  // namespace seqpar::nn
