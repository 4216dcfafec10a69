// The meeting point behind LocalProcessGroup: the rank threads of a group arrive one
// by one, each leaving its contribution (a pointer to its tensor, the op, the root);
// the last to arrive combines them all, and every rank leaves with the same outcome.
//
// Why one lock for a whole world: every rendezvous of one world (the world group
// and all its sub-groups) waits on the mutex and condition variable of LocalWorld.
// A failure anywhere is recorded there and wakes every waiting rank of every group
// at once, so "rank 2 threw" becomes an error everywhere instead of a hang. With a
// handful of threads that meet a few times per step, one lock costs nothing.
//
// Ranks in messages are world ranks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device_buffer.h"
#include "core/tensor.h"
#include "dist/process_group.h"

namespace seqpar::dist::detail {

class Rendezvous;

// The ranks of one run_local_world call and what has gone wrong among them.
class LocalWorld {
 public:
  LocalWorld(int size, std::chrono::milliseconds timeout);

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // The first failure is kept: later ones are usually its consequences.
  void record_failure(int world_rank, const std::string& message);
  // The rank's body returned: it will never arrive at another collective.
  void record_finished(int world_rank);
  // (world rank, message) of the first failure, if any.
  std::optional<std::pair<int, std::string>> first_failure() const;

 private:
  friend class Rendezvous;
  void record_failure_locked(int world_rank, const std::string& message);

  const int size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // any arrival, completion, failure or finish
  int failed_rank_ = -1;
  std::string failure_;
  std::vector<char> finished_;
};

// What one rank brings to a collective. `tensor` points at the caller's own tensor,
// which stays valid (and untouched) while the caller waits.
struct Contribution {
  Contribution() = default;
  explicit Contribution(std::string operation_name) : operation(std::move(operation_name)) {}

  std::string operation;  // "all_reduce", "broadcast", ...: all ranks must agree
  int world_rank = -1;    // filled in by Rendezvous::meet
  const Tensor* tensor = nullptr;
  const exact::ExactSums* sums = nullptr;  // all_reduce_sums: the sums (for checks)
  int64_t* words = nullptr;                // all_reduce_sums: the words to reduce, and
  int64_t word_count = 0;                  // how many, on the sums' device
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  int send_to = -1, receive_from = -1;  // send_recv: the peers (group ranks)
  std::vector<int> ranks;  // new_group: the members (sorted group ranks)
  std::string name;        // new_group: the new group's name
  // split: the new groups' members and names, the caller's own (valid while it waits)
  const std::vector<std::vector<int>>* groups = nullptr;
  const std::vector<std::string>* names = nullptr;
};

// What every rank leaves with.
struct Outcome {
  Tensor tensor;                      // the reduced / gathered / broadcast values
  std::shared_ptr<Rendezvous> group;  // new_group: the members' new meeting point
  std::shared_ptr<DeviceBuffer<int64_t>> words;  // all_reduce_sums: the reduced words
  std::vector<std::shared_ptr<Rendezvous>> groups;  // split: one per new group
};

// Runs on the last rank to arrive, with the contributions in group-rank order.
using Combine = std::function<Outcome(const std::vector<Contribution>&)>;

class Rendezvous {
 public:
  Rendezvous(std::shared_ptr<LocalWorld> world, std::vector<int> world_ranks, std::string name);

  const std::shared_ptr<LocalWorld>& world() const { return world_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }

  // Collective. Blocks until every member has arrived, then returns the outcome of
  // `combine` (run once, by the last rank to arrive), or throws its error on every
  // rank. Throws instead when the world has a failure, when a missing member has
  // already returned, or when the members do not all arrive within the timeout.
  Outcome meet(int group_rank, Contribution contribution, const Combine& combine);

 private:
  void wait_for_everyone(std::unique_lock<std::mutex>& lock, uint64_t ticket,
                         const std::string& operation, int world_rank);
  void combine_as_last(std::unique_lock<std::mutex>& lock, uint64_t ticket,
                       const Combine& combine);
  std::string mismatch_error() const;
  std::vector<int> missing_ranks() const;
  int missing_rank_that_finished() const;
  std::string prefix(const std::string& operation) const;

  const std::shared_ptr<LocalWorld> world_;
  const std::vector<int> world_ranks_;
  const std::string name_;

  // All guarded by world_->mutex_. A "ticket" numbers the collectives of this group.
  std::vector<Contribution> contributions_;
  std::vector<char> arrived_;
  int arrived_count_ = 0;
  uint64_t sealed_ = 0;     // collectives every member has arrived at
  uint64_t completed_ = 0;  // collectives whose outcome (or error) is ready
  Outcome outcome_;         // of collective number completed_ - 1
  std::string error_;
};

}  // namespace seqpar::dist::detail
