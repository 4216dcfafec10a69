#include "dist/local_rendezvous.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/nvtx.h"

namespace seqpar::dist::detail {

// ---------------------------------------------------------------- LocalWorld

LocalWorld::LocalWorld(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), finished_(static_cast<size_t>(size), 0) {
  SEQPAR_CHECK(size >= 1, "a local world needs at least one rank, got ", size);
  SEQPAR_CHECK(timeout.count() > 0, "the collective timeout must be positive, got ",
               timeout.count(), " ms");
}

void LocalWorld::record_failure(int world_rank, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  record_failure_locked(world_rank, message);
}

void LocalWorld::record_failure_locked(int world_rank, const std::string& message) {
  if (failed_rank_ < 0) {
    failed_rank_ = world_rank;
    failure_ = message;
  }
  changed_.notify_all();
}

void LocalWorld::record_finished(int world_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_[static_cast<size_t>(world_rank)] = 1;
  changed_.notify_all();
}

std::optional<std::pair<int, std::string>> LocalWorld::first_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_rank_ < 0) return std::nullopt;
  return std::make_pair(failed_rank_, failure_);
}

// ---------------------------------------------------------------- Rendezvous

Rendezvous::Rendezvous(std::shared_ptr<LocalWorld> world, std::vector<int> world_ranks,
                       std::string name)
    : world_(std::move(world)),
      world_ranks_(std::move(world_ranks)),
      name_(std::move(name)),
      contributions_(world_ranks_.size()),
      arrived_(world_ranks_.size(), 0) {}

std::string Rendezvous::prefix(const std::string& operation) const {
  return operation + " on group " + name_ + ": ";
}

// The protocol, per collective ("ticket"):
//   1. arrive: leave the contribution, count in;
//   2. the last to arrive seals the ticket (no timeout applies after that), combines
//      outside the lock, publishes the outcome and wakes everybody;
//   3. everybody leaves with the outcome.
// The next ticket cannot complete before every rank has left this one (it needs all
// of them to arrive again), so one outcome slot is enough.
Outcome Rendezvous::meet(int group_rank, Contribution contribution, const Combine& combine) {
  SEQPAR_NVTX_RANGE_TEXT(contribution.operation);  // every threads-group collective
  const std::string operation = contribution.operation;
  const int world_rank = world_ranks_[static_cast<size_t>(group_rank)];
  contribution.world_rank = world_rank;

  std::unique_lock<std::mutex> lock(world_->mutex_);
  if (world_->failed_rank_ >= 0) {
    SEQPAR_FAIL(prefix(operation), "rank ", world_->failed_rank_, " failed: ", world_->failure_);
  }
  const uint64_t ticket = sealed_;
  contributions_[static_cast<size_t>(group_rank)] = std::move(contribution);
  arrived_[static_cast<size_t>(group_rank)] = 1;
  if (++arrived_count_ < size()) {
    wait_for_everyone(lock, ticket, operation, world_rank);
  } else {
    combine_as_last(lock, ticket, combine);
  }
  // The combining rank always finishes (its errors are caught), so no timeout here.
  world_->changed_.wait(lock, [&] { return completed_ > ticket; });
  if (!error_.empty()) throw Error(error_);
  return outcome_;
}

void Rendezvous::wait_for_everyone(std::unique_lock<std::mutex>& lock, uint64_t ticket,
                                   const std::string& operation, int world_rank) {
  const auto deadline = std::chrono::steady_clock::now() + world_->timeout();
  world_->changed_.wait_until(lock, deadline, [&] {
    return sealed_ > ticket || world_->failed_rank_ >= 0 || missing_rank_that_finished() >= 0;
  });
  if (sealed_ > ticket) return;
  if (world_->failed_rank_ >= 0) {
    SEQPAR_FAIL(prefix(operation), "rank ", world_->failed_rank_, " failed: ", world_->failure_);
  }
  // This collective can no longer complete. Record why before throwing, so that
  // every other waiting rank of every group is released now, not at its own timeout.
  std::ostringstream why;
  why << prefix(operation);
  if (const int finished = missing_rank_that_finished(); finished >= 0) {
    why << "rank " << finished << " returned without calling " << operation;
  } else {
    const double seconds = std::chrono::duration<double>(world_->timeout()).count();
    std::vector<int> missing = missing_ranks();
    const size_t missing_count = missing.size();
    if (missing.size() > 16) missing.resize(16);  // one readable line, whatever the world
    why << "timed out after " << std::setprecision(3) << seconds << " s: rank"
        << (missing.size() > 1 ? "s " : " ") << rank_list_label(missing)
        << (missing_count > missing.size() ? ", ... (" + std::to_string(missing_count) + " in all)" : "")
        << " never arrived";
  }
  world_->record_failure_locked(world_rank, why.str());
  SEQPAR_FAIL(why.str());
}

void Rendezvous::combine_as_last(std::unique_lock<std::mutex>& lock, uint64_t ticket,
                                 const Combine& combine) {
  sealed_ = ticket + 1;
  arrived_count_ = 0;
  std::fill(arrived_.begin(), arrived_.end(), 0);
  // The others are parked until completed_ moves, so contributions_ is ours to read.
  lock.unlock();
  Outcome outcome;
  std::string error = mismatch_error();
  if (error.empty()) {
    try {
      outcome = combine(contributions_);
    } catch (const std::exception& caught) {
      error = caught.what();
    }
  }
  lock.lock();
  std::fill(contributions_.begin(), contributions_.end(), Contribution{});
  outcome_ = std::move(outcome);
  error_ = std::move(error);
  completed_ = ticket + 1;
  world_->changed_.notify_all();
}

// Ranks calling different collectives at the same point is a program bug that would
// deadlock or corrupt data under NCCL; here it is caught and named.
std::string Rendezvous::mismatch_error() const {
  bool all_same = true;
  for (const Contribution& c : contributions_) all_same &= c.operation == contributions_[0].operation;
  if (all_same) return "";
  std::ostringstream out;
  out << "collective mismatch on group " << name_ << ":";
  for (const Contribution& c : contributions_) {
    out << " rank " << c.world_rank << " called " << c.operation << ";";
  }
  return out.str();
}

std::vector<int> Rendezvous::missing_ranks() const {
  std::vector<int> missing;
  for (size_t i = 0; i < arrived_.size(); ++i) {
    if (!arrived_[i]) missing.push_back(world_ranks_[i]);
  }
  return missing;
}

int Rendezvous::missing_rank_that_finished() const {
  for (int rank : missing_ranks()) {
    if (world_->finished_[static_cast<size_t>(rank)]) return rank;
  }
  return -1;
}

}  // namespace seqpar::dist::detail
