#include "dist/process_group.h"

#include <algorithm>

#include "core/error.h"
#include "dist/local_reduce.h"
#include "dist/packed_digits.h"

namespace seqpar::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "unknown";
}

void ProcessGroup::all_reduce_exact(Tensor& tensor, ReduceOp op) {
  SEQPAR_CHECK(op != ReduceOp::Max, "all_reduce_exact: Max is not a sum");
  exact::ExactSums sums = exact::ExactSums::of_values(tensor);
  all_reduce_digits(sums, &tensor, "all_reduce");
  Tensor total = Tensor::empty(tensor.shape(), tensor.device());
  sums.round_into(total);
  if (op == ReduceOp::Avg) detail::divide_(total, static_cast<float>(size()));
  tensor.copy_(total);
}

void ProcessGroup::all_reduce_digits(exact::ExactSums& sums, const Tensor* values,
                                     const char* operation) {
  const DigitsCall call{operation, &sums, values};
  DeviceBuffer<int64_t> spans(detail::kSpanWords * detail::digit_chunks(sums.count()), sums.device());
  detail::find_digit_spans(sums, spans.data());
  all_reduce_words(spans.data(), spans.size(), WordOp::Max, call);
  std::vector<int64_t> agreed(static_cast<size_t>(spans.size()));
  detail::copy_words(agreed.data(), Device::cpu(), spans.data(), sums.device(), spans.size());
  detail::PackedDigits packed(agreed, sums);
  traffic_.calls += 1;
  traffic_.digit_words += sums.words();
  traffic_.sent_words += spans.size() + packed.words();
  if (packed.words() == 0) return;  // the same hulls on every rank: every rank skips
  packed.pack(sums);
  all_reduce_words(packed.data(), packed.words(), WordOp::Sum, call);
  packed.unpack(sums);
}

void ProcessGroup::all_reduce_sums_plain(exact::ExactSums& sums) {
  const DigitsCall call{"all_reduce_sums_plain", &sums, nullptr};
  traffic_.calls += 1;
  traffic_.digit_words += sums.words();
  traffic_.sent_words += sums.words();
  if (sums.words() > 0) all_reduce_words(sums.digits(), sums.words(), WordOp::Sum, call);
}

void ProcessGroup::ring_step(Tensor& output, const Tensor& input) {
  send_recv(output, input, (rank() + 1) % size(), (rank() + size() - 1) % size());
}

void check_send_recv_arguments(const std::string& what, const Tensor& output, const Tensor& input,
                               int send_to, int receive_from, int group_size) {
  SEQPAR_CHECK(input.defined() && output.defined(), what, ": undefined tensor");
  SEQPAR_CHECK(input.dim() >= 1, what, ": the input must have at least one dimension");
  SEQPAR_CHECK(output.shape() == input.shape() && output.device() == input.device(), what, ": output ",
               output.shape(), " on ", output.device(), " should be the input's ", input.shape(), " on ",
               input.device());
  SEQPAR_CHECK(send_to >= 0 && send_to < group_size, what, ": send_to ", send_to,
               " is not a rank of a group of ", group_size);
  SEQPAR_CHECK(receive_from >= 0 && receive_from < group_size, what, ": receive_from ", receive_from,
               " is not a rank of a group of ", group_size);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::vector<std::vector<int>>& groups,
                                                const std::vector<std::string>& names) {
  SEQPAR_CHECK(names.size() == groups.size(), "split on group ", name(), ": ", groups.size(),
               " groups but ", names.size(), " names");
  std::shared_ptr<ProcessGroup> mine;
  for (size_t i = 0; i < groups.size(); ++i) {
    auto created = new_group(groups[i], names[i]);
    if (created) mine = created;
  }
  return mine;
}

std::vector<int> checked_partition(const std::vector<std::vector<int>>& groups, int group_size,
                                   const std::string& group_name) {
  std::vector<int> group_of(static_cast<size_t>(group_size), -1);
  for (size_t i = 0; i < groups.size(); ++i) {
    for (int rank : checked_member_ranks(groups[i], group_size, group_name)) {
      SEQPAR_CHECK(group_of[static_cast<size_t>(rank)] < 0, "split on group ", group_name,
                   ": rank ", rank, " is in two groups (", group_of[static_cast<size_t>(rank)],
                   " and ", i, ")");
      group_of[static_cast<size_t>(rank)] = static_cast<int>(i);
    }
  }
  return group_of;
}

std::string rank_list_label(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  bool consecutive = true;
  for (size_t i = 1; i < ranks.size(); ++i) consecutive &= ranks[i] == ranks[i - 1] + 1;
  if (consecutive && ranks.size() > 1) {
    return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  }
  std::string label;
  for (size_t i = 0; i < ranks.size(); ++i) label += (i ? "," : "") + std::to_string(ranks[i]);
  return label;
}

std::vector<int> checked_member_ranks(const std::vector<int>& ranks, int group_size,
                                      const std::string& group_name) {
  SEQPAR_CHECK(!ranks.empty(), "new_group on group ", group_name, ": the list of ranks is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    SEQPAR_CHECK(sorted[i] >= 0 && sorted[i] < group_size, "new_group on group ", group_name,
                 ": rank ", sorted[i], " is out of range for a group of ", group_size,
                 " ranks (ranks ", ranks, ")");
    SEQPAR_CHECK(i == 0 || sorted[i] != sorted[i - 1], "new_group on group ", group_name,
                 ": rank ", sorted[i], " is listed twice (ranks ", ranks, ")");
  }
  return sorted;
}

}  // namespace seqpar::dist
