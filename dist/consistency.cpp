#include "dist/consistency.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace seqpar::dist {

namespace {

std::vector<float> host_values(const std::vector<Tensor>& tensors) {
  std::vector<float> values;
  for (const Tensor& tensor : tensors) {
    const std::vector<float> one = tensor.to_vector();
    values.insert(values.end(), one.begin(), one.end());
  }
  return values;
}

uint64_t fnv1a(const std::vector<float>& values) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (float value : values) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    for (int byte = 0; byte < 4; ++byte) {
      hash ^= (bits >> (8 * byte)) & 0xffu;
      hash *= 0x100000001b3ull;
    }
  }
  return hash;
}

// Every rank's values as host vectors, through the group (on `device`, as the
// collectives of an NCCL group need). The group's float copies move bits unchanged.
std::vector<std::vector<float>> gather_values(ProcessGroup& group, const std::vector<float>& mine,
                                              Device device) {
  const auto n = static_cast<int64_t>(mine.size());
  const Tensor input = Tensor::from_data({n}, mine, device);
  Tensor output = Tensor::empty({group.size() * n}, device);
  group.all_gather(output, input);
  const std::vector<float> all = output.to_vector();
  std::vector<std::vector<float>> per_rank;
  for (int rank = 0; rank < group.size(); ++rank) {
    per_rank.emplace_back(all.begin() + rank * n, all.begin() + (rank + 1) * n);
  }
  return per_rank;
}

// A 64-bit fingerprint as four 16-bit pieces, each exact in a float.
std::vector<float> fingerprint_pieces(uint64_t fingerprint) {
  std::vector<float> pieces;
  for (int piece = 0; piece < 4; ++piece) {
    pieces.push_back(static_cast<float>((fingerprint >> (16 * piece)) & 0xffffu));
  }
  return pieces;
}

uint64_t from_pieces(const std::vector<float>& pieces) {
  uint64_t fingerprint = 0;
  for (int piece = 0; piece < 4; ++piece) {
    fingerprint |= static_cast<uint64_t>(pieces[static_cast<size_t>(piece)]) << (16 * piece);
  }
  return fingerprint;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

Divergence locate(const std::vector<std::vector<float>>& per_rank,
                  const std::vector<Tensor>& tensors) {
  Divergence divergence;
  divergence.total_elements = static_cast<int64_t>(per_rank[0].size());
  bool found = false;
  for (size_t i = 0; i < per_rank[0].size(); ++i) {
    bool differs = false;
    for (size_t rank = 1; rank < per_rank.size(); ++rank) {
      if (same_bits(per_rank[rank][i], per_rank[0][i])) continue;
      differs = true;
      const double difference = std::fabs(double(per_rank[rank][i]) - double(per_rank[0][i]));
      // A NaN difference (a NaN on one rank) is the largest and stays.
      if (!std::isnan(divergence.max_difference) &&
          (std::isnan(difference) || difference > divergence.max_difference)) {
        divergence.max_difference = difference;
      }
    }
    if (!differs) continue;
    ++divergence.differing_elements;
    if (found) continue;
    found = true;
    int64_t element = static_cast<int64_t>(i);
    int64_t tensor = 0;
    while (element >= tensors[static_cast<size_t>(tensor)].numel()) {
      element -= tensors[static_cast<size_t>(tensor)].numel();
      ++tensor;
    }
    divergence.tensor = tensor;
    divergence.element = element;
  }
  return divergence;
}

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

}  // namespace

uint64_t fingerprint(const std::vector<Tensor>& tensors) { return fnv1a(host_values(tensors)); }

std::string name_scale(double ratio, int sp, int dp, double tolerance) {
  SEQPAR_CHECK(sp >= 1 && dp >= 1, "name_scale: sp ", sp, " and dp ", dp, " must be at least 1");
  if (!(ratio > 0) || !std::isfinite(ratio)) return "";
  if (std::fabs(ratio - 1.0) <= tolerance) return "";
  const double s = sp, d = dp;
  const struct {
    const char* name;
    double factor;
  } candidates[] = {
      // The plainer cause first where two factors coincide (sp 4, dp 2: 1/dp = 1/sqrt(sp)).
      {"sp", s},       {"1/sp", 1 / s},          {"dp", d},     {"1/dp", 1 / d},
      {"sp*dp", s * d}, {"1/(sp*dp)", 1 / (s * d)}, {"sqrt(sp)", std::sqrt(s)},
      {"1/sqrt(sp)", 1 / std::sqrt(s)}, {"sp/dp", s / d}, {"dp/sp", d / s},
      {"sqrt(sp*dp)", std::sqrt(s * d)}, {"1/sqrt(sp*dp)", 1 / std::sqrt(s * d)},
  };
  for (const auto& candidate : candidates) {
    if (std::fabs(candidate.factor - 1.0) <= tolerance) continue;  // no mistake looks like 1
    if (std::fabs(ratio / candidate.factor - 1.0) <= tolerance) {
      return std::string("x ") + candidate.name + " (" + format_number(candidate.factor) + ")";
    }
  }
  return "";
}

ConsistencyChecker::ConsistencyChecker(std::shared_ptr<ProcessGroup> group, std::string name,
                                       int expected_replicas)
    : group_(std::move(group)), name_(std::move(name)), expected_replicas_(expected_replicas) {
  SEQPAR_CHECK(group_ != nullptr, "ConsistencyChecker ", name_, ": no group");
  SEQPAR_CHECK(expected_replicas_ >= 0, "ConsistencyChecker ", name_, ": expected_replicas ",
               expected_replicas_, " is negative");
}

ConsistencyReport ConsistencyChecker::check(int64_t step, const std::vector<Tensor>& tensors,
                                            std::optional<double> reference_norm) {
  ProcessGroup& group = *group_;
  ConsistencyReport report;
  report.group = name_;
  report.step = step;
  report.group_size = group.size();
  report.group_of_one = group.size() == 1 && expected_replicas_ > 1;
  const Device device = tensors.empty() ? Device::cpu() : tensors.front().device();
  const std::vector<float> mine = host_values(tensors);

  for (const auto& pieces : gather_values(group, fingerprint_pieces(fnv1a(mine)), device)) {
    report.fingerprints.push_back(from_pieces(pieces));
  }
  for (uint64_t each : report.fingerprints) {
    if (each != report.fingerprints.front()) report.consistent = false;
  }
  if (!report.consistent) {
    // Fingerprints differ (a collision cannot make equal tensors differ): all ranks'
    // tensors, to say where. Every rank takes this branch alike.
    report.divergence = locate(gather_values(group, mine, device), tensors);
    if (first_divergent_step_ == 0) first_divergent_step_ = step;
  }
  if (reference_norm && *reference_norm > 0) {
    double squares = 0;
    for (float value : mine) squares += double(value) * double(value);
    report.norm_ratio = std::sqrt(squares) / *reference_norm;
    const int sp = expected_replicas_ > 0 ? expected_replicas_ : group.size();
    report.scale_cause = name_scale(*report.norm_ratio, sp);
  }
  return report;
}

std::string ConsistencyReport::summary() const {
  std::ostringstream out;
  out << group << ": step " << step << ": ";
  std::vector<std::string> problems;
  if (group_of_one) {
    problems.push_back("the group has one rank: a reduction over it does nothing");
  }
  if (!consistent && divergence) {
    problems.push_back("ranks differ: " + std::to_string(divergence->differing_elements) + " of " +
                       std::to_string(divergence->total_elements) + " elements, first tensor " +
                       std::to_string(divergence->tensor) + " element " +
                       std::to_string(divergence->element) + " (max |difference| " +
                       format_number(divergence->max_difference) + ")");
  }
  if (norm_ratio && !scale_cause.empty()) {
    problems.push_back("gradient norm " + format_number(*norm_ratio) + "x the reference: " +
                       scale_cause);
  }
  if (problems.empty()) return out.str() + "consistent";
  for (size_t i = 0; i < problems.size(); ++i) out << (i ? "; " : "") << problems[i];
  return out.str();
}

}  // namespace seqpar::dist
