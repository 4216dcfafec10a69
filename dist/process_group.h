// ProcessGroup: the collectives a training step needs, over a fixed set of ranks.
//
// Two implementations share this interface:
//   LocalProcessGroup  N ranks as threads of one process, on the CPU or sharing one
//                      GPU; one thread combines the ranks' contributions.
//   NcclProcessGroup   one process per GPU, over NCCL.
// Sums are exact (ReduceOp below), so both give every rank the same bits, and the same
// bits as each other.
//
// Like torch.distributed, every collective and every new_group() is called by every
// rank of the group, in the same order.
//
// Failures: a rank that dies, throws, or never arrives makes the others fail with a
// seqpar::Error that names the group and the operation ("all_reduce on group
// sp[0-3]: ..."), within the group's timeout. Never a hang.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/exact_sums.h"
#include "core/tensor.h"

namespace seqpar::dist {

// Sum is exact and rounded once (docs/numerics.md): each rank's values become exact
// sums (core/exact_sums.h), the ranks' digits are added as integers (all_reduce_sums)
// and the total is rounded to float32 once. So the result depends on the set of the
// ranks' values alone: not on their order, the group's algorithm or the placement.
// Avg is that sum divided by the group size (one IEEE division). Max is exact anyway.
enum class ReduceOp { Sum, Avg, Max };
const char* reduce_op_name(ReduceOp op);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;  // this process's (thread's) rank within the group
  virtual int size() const = 0;
  // The world ranks this group holds, in group-rank order.
  virtual const std::vector<int>& global_ranks() const = 0;
  // A name for messages ("world", "sp[0-3]", ...).
  virtual std::string name() const = 0;

  // In place: every rank ends with the reduction over the group of its `tensor`.
  virtual void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // In place: every rank ends with the digit-wise sum over the group of its exact sums
  // (integer additions, in any order the same bits). Every rank passes the same count.
  // Carries only the words some rank holds a nonzero digit in (dist/packed_digits.h).
  void all_reduce_sums(exact::ExactSums& sums) { all_reduce_digits(sums, nullptr, "all_reduce_sums"); }
  // The same sum in its plain form: every word of the sums, added in one integer
  // all-reduce. What defines all_reduce_sums's result (its packed words must leave the
  // same digits, word for word: tests/dist/exact_all_reduce_test.cpp), at the cost of
  // carrying every word.
  void all_reduce_sums_plain(exact::ExactSums& sums);
  // output is [size() * n, ...] for inputs of [n, ...]; rank r's input lands in slice r.
  virtual void all_gather(Tensor& output, const Tensor& input) = 0;
  // Equal-split all-to-all (dist/all_to_all.h): input and output are [size() * n, ...];
  // chunk j of the input goes to rank j, and rank i's chunk for this rank lands in chunk
  // i of the output. Bytes move unchanged. Uneven splits are not supported.
  virtual void all_to_all(Tensor& output, const Tensor& input) = 0;
  // Point to point, as one step of a ring: this rank's `input` goes to group rank
  // `send_to`, and `output` receives what group rank `receive_from` sent it. Collective:
  // every rank of the group calls it at once, and the pairs must match (rank r sends to
  // t exactly when t receives from r), so the sends are a permutation of the ranks (a
  // rank may send to itself). Every rank passes one shape, output the input's. Bytes
  // move unchanged. The threads group refuses mismatched pairs or shapes naming the
  // ranks; NCCL cannot see its peers' arguments (nccl_process_group.h).
  virtual void send_recv(Tensor& output, const Tensor& input, int send_to, int receive_from) = 0;
  // send_recv to the next rank, from the previous: (rank + 1) % size and
  // (rank - 1 + size) % size. size() steps bring every rank's input past every rank.
  void ring_step(Tensor& output, const Tensor& input);
  // In place: every rank ends with rank `root`'s tensor (root is a group rank).
  virtual void broadcast(Tensor& tensor, int root = 0) = 0;
  virtual void barrier() = 0;

  // Collective over this group: every rank calls it with the same `ranks` (group
  // ranks of this group), in the same order as its other new_group calls. Members
  // get the new group; the others get nullptr ("not a member"). The new group
  // orders its members by their rank here, whatever order `ranks` lists them in
  // (as torch.distributed.new_group does). An empty name becomes "group[...]".
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                                  const std::string& name) = 0;

  // Collective over this group, like new_group for several disjoint groups at once:
  // `groups` lists each new group's members (group ranks of this group), `names` their
  // names, the same on every rank. Each rank gets the group it is in, or nullptr. This
  // default makes one new_group per group (NcclProcessGroup keeps it: one ncclCommSplit
  // each); LocalProcessGroup overrides it to create them all in one collective.
  virtual std::shared_ptr<ProcessGroup> split(const std::vector<std::vector<int>>& groups,
                                              const std::vector<std::string>& names);

  // What this rank's exact all-reduces (all_reduce_sums, all_reduce's Sum and Avg) have
  // carried so far, in int64 words: the sums' own words (what adding every word would
  // carry), and those actually sent (the hulls' all-reduce and the packed words').
  struct DigitTraffic {
    int64_t calls = 0;
    int64_t digit_words = 0;
    int64_t sent_words = 0;
  };
  const DigitTraffic& digit_traffic() const { return traffic_; }

 protected:
  // What an exact all-reduce's collectives are part of, for checks and messages:
  // `operation` names it; `values` (may be null) are the tensor the sums were made from,
  // whose shape a group may check across ranks, as the sums' count.
  struct DigitsCall {
    const char* operation;
    const exact::ExactSums* sums;
    const Tensor* values;
  };
  enum class WordOp { Sum, Max };
  // The two collectives of all_reduce_digits, in place over `count` int64 words on the
  // sums' device: Sum adds them (two's complement, as digits add), Max keeps the largest.
  // Every rank passes the same count.
  virtual void all_reduce_words(int64_t* words, int64_t count, WordOp op,
                                const DigitsCall& call) = 0;
  // all_reduce_sums, named `operation` in errors: agrees on each chunk's hull of nonzero
  // words (a Max of two words a chunk), then adds only those words (dist/packed_digits.h).
  void all_reduce_digits(exact::ExactSums& sums, const Tensor* values, const char* operation);
  // all_reduce's Sum and Avg: each value's exact digits are added over the group and
  // the total rounded once; Avg then divides by the size.
  void all_reduce_exact(Tensor& tensor, ReduceOp op);

 private:
  DigitTraffic traffic_;
};

// A group as an exact::CrossRankSums: how a fused training step (bench/) adds its
// ranks' gradient digits before rounding.
class GroupSums final : public exact::CrossRankSums {
 public:
  explicit GroupSums(ProcessGroup& group) : group_(group) {}
  void combine(exact::ExactSums& sums) override { group_.all_reduce_sums(sums); }

 private:
  ProcessGroup& group_;
};

// "0-3" for a run of consecutive ranks, "0,4" otherwise: how groups are named.
std::string rank_list_label(const std::vector<int>& ranks);

// Checks one rank's send_recv arguments before any exchange: both tensors defined, of
// one shape (at least one dimension) and device, and both peers ranks of a group of
// `group_size`. `what` ("send_recv on group cp[0,2]") opens the message.
void check_send_recv_arguments(const std::string& what, const Tensor& output, const Tensor& input,
                               int send_to, int receive_from, int group_size);

// Checks the `ranks` handed to new_group on a group of `group_size` ranks (not
// empty, in range, no repeats) and returns them sorted.
std::vector<int> checked_member_ranks(const std::vector<int>& ranks, int group_size,
                                      const std::string& group_name);

// Checks the `groups` handed to split on a group of `group_size` ranks (each as
// checked_member_ranks, no rank in two) and returns, for each rank, the index of its
// group (-1: none).
std::vector<int> checked_partition(const std::vector<std::vector<int>>& groups, int group_size,
                                   const std::string& group_name);

}  // namespace seqpar::dist
