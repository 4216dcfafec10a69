#include "dist/local_process_group.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "core/elementwise.h"
#include "core/error.h"
#include "core/exact_sums.h"
#include "dist/all_to_all.h"
#include "dist/local_reduce.h"
#include "dist/local_rendezvous.h"
#include "dist/packed_digits.h"

namespace seqpar::dist {

using detail::Contribution;
using detail::Outcome;

// ---------------------------------------------------------------- run_local_world

static void run_rank(const RankBody& body, const std::shared_ptr<detail::Rendezvous>& world_group,
                     int rank) {
  detail::LocalWorld& world = *world_group->world();
  try {
    body(std::make_shared<LocalProcessGroup>(world_group, rank));
  } catch (const std::exception& error) {
    world.record_failure(rank, error.what());
  } catch (...) {
    world.record_failure(rank, "an exception that is not a std::exception");
  }
  world.record_finished(rank);
}

void run_local_world(int world_size, const RankBody& body, LocalOptions options) {
  SEQPAR_CHECK(world_size >= 1, "run_local_world: world size must be at least 1, got ",
               world_size);
  auto world = std::make_shared<detail::LocalWorld>(world_size, options.timeout);
  std::vector<int> ranks(static_cast<size_t>(world_size));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto world_group = std::make_shared<detail::Rendezvous>(world, ranks, "world");

  std::vector<std::thread> threads;
  try {
    for (int rank = 0; rank < world_size; ++rank) {
      threads.emplace_back(run_rank, std::cref(body), std::cref(world_group), rank);
    }
  } catch (const std::exception& error) {  // could not start a thread: stop the others
    world->record_failure(static_cast<int>(threads.size()), error.what());
    for (std::thread& thread : threads) thread.join();
    throw;
  }
  for (std::thread& thread : threads) thread.join();
  if (auto failure = world->first_failure()) {
    SEQPAR_FAIL("rank ", failure->first, " failed: ", failure->second);
  }
}

// ---------------------------------------------------------------- the combine steps
// Each runs once per collective, on the last rank to arrive, over the contributions
// in rank order. Ranks are checked against rank 0, so a mistake names both.

static void check_same_tensors(const std::string& what, const std::vector<Contribution>& all) {
  const Tensor& first = *all[0].tensor;
  for (const Contribution& c : all) {
    SEQPAR_CHECK(c.tensor->shape() == first.shape() && c.tensor->device() == first.device(),
                 what, ": rank ", c.world_rank, " passed ", c.tensor->shape(), " on ",
                 c.tensor->device(), " but rank ", all[0].world_rank, " passed ", first.shape(),
                 " on ", first.device());
  }
}

static Outcome max_over_ranks(const std::string& what, const std::vector<Contribution>& all) {
  check_same_tensors(what, all);
  for (const Contribution& c : all) {
    SEQPAR_CHECK(c.op == ReduceOp::Max, what, ": rank ", c.world_rank, " asked for ",
                 reduce_op_name(c.op), " but rank ", all[0].world_rank, " for max");
  }
  Tensor result = all[0].tensor->clone();
  for (size_t r = 1; r < all.size(); ++r) detail::reduce_into(result, *all[r].tensor, ReduceOp::Max);
  return {result, nullptr, nullptr, {}};
}

// The exact all-reduce's words (the digits' hulls, then the packed digits), added as
// integers or their maxima taken: the order of the ranks cannot matter.
static Outcome reduce_words(const std::string& what, const std::vector<Contribution>& all,
                            bool max) {
  if (all[0].tensor != nullptr) check_same_tensors(what, all);
  const Contribution& first = all[0];
  for (const Contribution& c : all) {
    SEQPAR_CHECK(c.sums->count() == first.sums->count() && c.sums->device() == first.sums->device(),
                 what, ": rank ", c.world_rank, " passed ", c.sums->count(), " sums on ",
                 c.sums->device(), " but rank ", first.world_rank, " passed ",
                 first.sums->count(), " on ", first.sums->device());
    SEQPAR_CHECK(c.word_count == first.word_count, what, ": rank ", c.world_rank, " sends ",
                 c.word_count, " words but rank ", first.world_rank, " sends ", first.word_count);
  }
  const Device device = first.sums->device();
  auto total = std::make_shared<DeviceBuffer<int64_t>>(first.word_count, device);
  detail::copy_words(total->data(), device, first.words, device, first.word_count);
  for (size_t r = 1; r < all.size(); ++r) {
    detail::reduce_words_into(total->data(), all[r].words, first.word_count, device, max);
  }
  Outcome outcome;
  outcome.words = total;
  return outcome;
}

static Outcome gather_in_rank_order(const std::string& what, const std::vector<Contribution>& all) {
  check_same_tensors(what, all);
  const Tensor& first = *all[0].tensor;
  Shape shape = first.shape();
  const int64_t rows = shape[0];
  shape[0] = rows * static_cast<int64_t>(all.size());
  Tensor result = Tensor::empty(shape, first.device());
  for (size_t r = 0; r < all.size(); ++r) {
    result.narrow(0, static_cast<int64_t>(r) * rows, rows).copy_(*all[r].tensor);
  }
  return {result, nullptr, nullptr, {}};
}

// send_recv: every rank's input, in rank order, once the pairs are known to match
// (rank r sends to t exactly when t receives from r) and the shapes to agree.
static Outcome matched_sends(const std::string& what, const std::vector<Contribution>& all) {
  for (size_t r = 0; r < all.size(); ++r) {
    const Contribution& sender = all[r];
    const Contribution& receiver = all[static_cast<size_t>(sender.send_to)];
    SEQPAR_CHECK(receiver.receive_from == static_cast<int>(r), what, ": rank ", sender.world_rank,
                 " sends to group rank ", sender.send_to, " (rank ", receiver.world_rank,
                 ") but that rank receives from group rank ", receiver.receive_from);
  }
  return gather_in_rank_order(what, all);
}

static Outcome copy_of_root(const std::string& what, const std::vector<Contribution>& all) {
  check_same_tensors(what, all);
  const int root = all[0].root;
  for (const Contribution& c : all) {
    SEQPAR_CHECK(c.root == root, what, ": rank ", c.world_rank, " names root ", c.root,
                 " but rank ", all[0].world_rank, " names root ", root);
  }
  return {all[static_cast<size_t>(root)].tensor->clone(), nullptr, nullptr, {}};
}

// ---------------------------------------------------------------- LocalProcessGroup

LocalProcessGroup::LocalProcessGroup(std::shared_ptr<detail::Rendezvous> rendezvous, int rank)
    : rendezvous_(std::move(rendezvous)), rank_(rank) {
  SEQPAR_CHECK(rank >= 0 && rank < rendezvous_->size(), "LocalProcessGroup: rank ", rank,
               " out of range for group ", rendezvous_->name(), " of ", rendezvous_->size());
}

int LocalProcessGroup::size() const { return rendezvous_->size(); }
const std::vector<int>& LocalProcessGroup::global_ranks() const {
  return rendezvous_->world_ranks();
}
std::string LocalProcessGroup::name() const { return rendezvous_->name(); }

void LocalProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  const std::string what = "all_reduce on group " + name();
  SEQPAR_CHECK(tensor.defined(), what, ": the tensor is undefined");
  if (op != ReduceOp::Max) return all_reduce_exact(tensor, op);
  Contribution mine{"all_reduce"};
  mine.tensor = &tensor;
  mine.op = op;
  const Outcome outcome = rendezvous_->meet(
      rank_, mine, [&](const std::vector<Contribution>& all) { return max_over_ranks(what, all); });
  tensor.copy_(outcome.tensor);
}

void LocalProcessGroup::all_reduce_words(int64_t* words, int64_t count, WordOp op,
                                         const DigitsCall& call) {
  const std::string what = std::string(call.operation) + " on group " + name();
  Contribution mine{call.operation};
  mine.sums = call.sums;
  mine.tensor = call.values;
  mine.words = words;
  mine.word_count = count;
  const bool max = op == WordOp::Max;
  const Outcome outcome = rendezvous_->meet(rank_, mine, [&](const std::vector<Contribution>& all) {
    return reduce_words(what, all, max);
  });
  const Device device = call.sums->device();
  detail::copy_words(words, device, outcome.words->data(), device, count);
}

void LocalProcessGroup::all_gather(Tensor& output, const Tensor& input) {
  const std::string what = "all_gather on group " + name();
  SEQPAR_CHECK(input.defined() && output.defined(), what, ": undefined tensor");
  SEQPAR_CHECK(input.dim() >= 1, what, ": the input must have at least one dimension");
  Shape expected = input.shape();
  expected[0] *= size();
  SEQPAR_CHECK(output.shape() == expected && output.device() == input.device(), what,
               ": output ", output.shape(), " on ", output.device(), " should be ", expected,
               " on ", input.device());
  Contribution mine{"all_gather"};
  mine.tensor = &input;
  const Outcome outcome = rendezvous_->meet(
      rank_, mine, [&](const std::vector<Contribution>& all) { return gather_in_rank_order(what, all); });
  output.copy_(outcome.tensor);
}

// The last rank to arrive gathers every input (a copy, in rank order); each rank then
// copies out the chunks meant for it. Nothing reads a rank's own input after the
// meeting, so output may be the input itself.
void LocalProcessGroup::all_to_all(Tensor& output, const Tensor& input) {
  const std::string what = "all_to_all on group " + name();
  check_all_to_all_arguments(what, output, input, size());
  Contribution mine{"all_to_all"};
  mine.tensor = &input;
  const Outcome outcome = rendezvous_->meet(
      rank_, mine, [&](const std::vector<Contribution>& all) { return gather_in_rank_order(what, all); });
  const int64_t rows = input.size(0);
  const int64_t chunk = rows / size();
  for (int source = 0; source < size(); ++source) {
    output.narrow(0, source * chunk, chunk)
        .copy_(outcome.tensor.narrow(0, source * rows + rank_ * chunk, chunk));
  }
}

// Like all_to_all: the inputs are gathered in one meeting, each rank copies out its
// source's, so output may be the input itself.
void LocalProcessGroup::send_recv(Tensor& output, const Tensor& input, int send_to, int receive_from) {
  const std::string what = "send_recv on group " + name();
  check_send_recv_arguments(what, output, input, send_to, receive_from, size());
  Contribution mine{"send_recv"};
  mine.tensor = &input;
  mine.send_to = send_to;
  mine.receive_from = receive_from;
  const Outcome outcome = rendezvous_->meet(
      rank_, mine, [&](const std::vector<Contribution>& all) { return matched_sends(what, all); });
  const int64_t rows = input.size(0);
  output.copy_(outcome.tensor.narrow(0, receive_from * rows, rows));
}

void LocalProcessGroup::broadcast(Tensor& tensor, int root) {
  const std::string what = "broadcast on group " + name();
  SEQPAR_CHECK(tensor.defined(), what, ": the tensor is undefined");
  SEQPAR_CHECK(root >= 0 && root < size(), what, ": root ", root, " is not a rank of a group of ",
               size());
  Contribution mine{"broadcast"};
  mine.tensor = &tensor;
  mine.root = root;
  const Outcome outcome = rendezvous_->meet(
      rank_, mine, [&](const std::vector<Contribution>& all) { return copy_of_root(what, all); });
  if (rank_ != root) tensor.copy_(outcome.tensor);
}

void LocalProcessGroup::barrier() {
  rendezvous_->meet(rank_, Contribution{"barrier"},
                    [](const std::vector<Contribution>&) { return Outcome{}; });
}

std::shared_ptr<ProcessGroup> LocalProcessGroup::new_group(const std::vector<int>& ranks,
                                                           const std::string& name) {
  const std::vector<int> members = checked_member_ranks(ranks, size(), this->name());
  std::vector<int> member_world_ranks;
  for (int member : members) member_world_ranks.push_back(global_ranks()[static_cast<size_t>(member)]);
  Contribution mine{"new_group"};
  mine.ranks = members;
  mine.name = name.empty() ? "group[" + rank_list_label(member_world_ranks) + "]" : name;

  const std::string what = "new_group on group " + this->name();
  const Outcome outcome = rendezvous_->meet(rank_, mine, [&](const std::vector<Contribution>& all) {
    for (const Contribution& c : all) {
      SEQPAR_CHECK(c.ranks == all[0].ranks && c.name == all[0].name, what, ": rank ", c.world_rank,
                   " asked for ", c.name, " with ranks ", c.ranks, " but rank ", all[0].world_rank,
                   " for ", all[0].name, " with ranks ", all[0].ranks);
    }
    auto group = std::make_shared<detail::Rendezvous>(rendezvous_->world(), member_world_ranks,
                                                      all[0].name);
    return Outcome{Tensor(), group, nullptr, {}};
  });
  const auto position = std::find(members.begin(), members.end(), rank_);
  if (position == members.end()) return nullptr;
  return std::make_shared<LocalProcessGroup>(outcome.group,
                                             static_cast<int>(position - members.begin()));
}

std::shared_ptr<ProcessGroup> LocalProcessGroup::split(const std::vector<std::vector<int>>& groups,
                                                       const std::vector<std::string>& names) {
  const std::string what = "split on group " + name();
  SEQPAR_CHECK(names.size() == groups.size(), what, ": ", groups.size(), " groups but ",
               names.size(), " names");
  Contribution mine{"split"};
  mine.groups = &groups;
  mine.names = &names;
  // The last rank to arrive checks the lists once and makes every group's meeting point.
  const Outcome outcome = rendezvous_->meet(rank_, mine, [&](const std::vector<Contribution>& all) {
    for (const Contribution& c : all) {
      SEQPAR_CHECK(*c.groups == *all[0].groups && *c.names == *all[0].names, what, ": rank ",
                   c.world_rank, " asked for other groups than rank ", all[0].world_rank);
    }
    checked_partition(groups, size(), this->name());
    Outcome made;
    for (size_t i = 0; i < groups.size(); ++i) {
      std::vector<int> members = groups[i];
      std::sort(members.begin(), members.end());
      for (int& member : members) member = global_ranks()[static_cast<size_t>(member)];
      made.groups.push_back(std::make_shared<detail::Rendezvous>(rendezvous_->world(), members,
                                                                 names[i]));
    }
    return made;
  });
  for (size_t i = 0; i < groups.size(); ++i) {
    std::vector<int> members = groups[i];
    std::sort(members.begin(), members.end());
    const auto position = std::find(members.begin(), members.end(), rank_);
    if (position != members.end()) {
      return std::make_shared<LocalProcessGroup>(outcome.groups[i],
                                                 static_cast<int>(position - members.begin()));
    }
  }
  return nullptr;
}

}  // namespace seqpar::dist

// ---------------------------------------------------------------- the reductions'
// arithmetic (dist/local_reduce.h): CPU loops here, CUDA kernels in local_reduce.cu

namespace seqpar::dist::detail {

void reduce_into(Tensor& accumulator, const Tensor& source, ReduceOp op) {
  SEQPAR_CHECK(accumulator.is_contiguous(), "reduce_into: the accumulator must be contiguous");
  SEQPAR_CHECK(accumulator.shape() == source.shape() && accumulator.device() == source.device(),
               "reduce_into: accumulator ", accumulator.shape(), " on ", accumulator.device(),
               " vs source ", source.shape(), " on ", source.device());
  if (op != ReduceOp::Max) {
    // core's add_ rounds once per element on both backends: a + b, nothing fused.
    add_(accumulator, source);
    return;
  }
  const Tensor packed = source.contiguous();
  const int64_t count = accumulator.numel();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (accumulator.device().is_cuda()) {
    return max_into_cuda(accumulator.data(), packed.data(), count, accumulator.device().index);
  }
#endif
  float* out = accumulator.data();
  const float* in = packed.data();
  for (int64_t i = 0; i < count; ++i) out[i] = std::fmax(out[i], in[i]);
}

void reduce_words_into(int64_t* accumulator, const int64_t* source, int64_t count, Device device,
                       bool max) {
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device.is_cuda()) {
    if (max) return max_words_into_cuda(accumulator, source, count, device.index);
    return exact::detail::add_digits_cuda(accumulator, source, count, device.index);
  }
#endif
  (void)device;
  for (int64_t i = 0; i < count; ++i) {
    accumulator[i] = max ? std::max(accumulator[i], source[i])
                         : static_cast<int64_t>(static_cast<uint64_t>(accumulator[i]) +
                                                static_cast<uint64_t>(source[i]));
  }
}

void divide_(Tensor& tensor, float divisor) {
  SEQPAR_CHECK(tensor.is_contiguous(), "divide_: the tensor must be contiguous");
  const int64_t count = tensor.numel();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (tensor.device().is_cuda()) return divide_cuda(tensor.data(), count, divisor, tensor.device().index);
#endif
  float* data = tensor.data();
  for (int64_t i = 0; i < count; ++i) data[i] = data[i] / divisor;
}

}  // namespace seqpar::dist::detail
