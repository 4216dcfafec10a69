#include "nn/exact_gradient_sync.h"

#include <algorithm>

#include "core/error.h"

namespace seqpar::nn {

namespace {

// What a user can do about each refusal, said once.
const char* const kHowTo =
    "run every backward of the step inside the sync's recording (sync.backward(loss), or "
    "loss.backward() inside an ExactGradientSync::Recording scope)";

}  // namespace

ExactGradientSync::ExactGradientSync(std::vector<autograd::Variable> parameters,
                                     std::shared_ptr<exact::CrossRankSums> ranks, std::string group_name)
    : parameters_(std::move(parameters)), ranks_(std::move(ranks)), group_name_(std::move(group_name)) {
  SEQPAR_CHECK(ranks_ != nullptr, "ExactGradientSync: no group (a null group pointer)");
  for (size_t i = 0; i < parameters_.size(); ++i) {
    SEQPAR_CHECK(parameters_[i].defined(), "ExactGradientSync over ", group_name_, ": parameter ", i,
                 " is undefined");
  }
  at_sync_ = seen_ = accumulations();
}

std::vector<uint64_t> ExactGradientSync::accumulations() const {
  std::vector<uint64_t> counts;
  for (const autograd::Variable& parameter : parameters_) counts.push_back(parameter.grad_accumulations());
  return counts;
}

void ExactGradientSync::refuse(size_t parameter, const std::string& what) const {
  SEQPAR_FAIL("ExactGradientSync over ", group_name_, ": parameter ", parameter, " (shape ",
              parameters_[parameter].shape(), ") ", what);
}

void ExactGradientSync::check_nothing_outside(const char* when) const {
  const std::vector<uint64_t> now = accumulations();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (now[i] != seen_[i]) {
      refuse(i, std::string("received a gradient outside a recording (") + when +
                    "): that backward pass kept no exact sums, so its .grad() is this rank's own partial "
                    "gradient and the ranks would step apart; " + kHowTo);
    }
  }
}

ExactGradientSync& ExactGradientSync::begin_recording() {
  check_nothing_outside("before this recording began");
  return *this;
}

ExactGradientSync::Recording::Recording(ExactGradientSync& sync)
    : sync_(sync.begin_recording()), recording_(sync.exact_) {}

// Whatever backward added meanwhile was recorded (or is refused by synchronize() when its
// op kept no exact sums): the counts move on.
ExactGradientSync::Recording::~Recording() { sync_.seen_ = sync_.accumulations(); }

void ExactGradientSync::backward(const autograd::Variable& loss) {
  const Recording recording(*this);
  loss.backward();
}

void ExactGradientSync::synchronize() {
  check_nothing_outside("after the last recording");
  const std::vector<autograd::Variable> recorded = exact_.recorded_parameters();
  const auto is_recorded = [&](const autograd::Variable& parameter) {
    return std::any_of(recorded.begin(), recorded.end(),
                       [&](const autograd::Variable& other) { return other.is(parameter); });
  };
  for (const autograd::Variable& parameter : recorded) {
    const bool ours = std::any_of(parameters_.begin(), parameters_.end(),
                                  [&](const autograd::Variable& other) { return other.is(parameter); });
    SEQPAR_CHECK(ours, "ExactGradientSync over ", group_name_, ": the recording kept exact sums of a parameter "
                 "of shape ", parameter.shape(), " that is not one of the sync's ", parameters_.size(),
                 " parameters (make the sync with every parameter the recorded backward reaches)");
  }
  const std::vector<uint64_t> now = accumulations();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (is_recorded(parameters_[i])) continue;
    if (now[i] != at_sync_[i]) {
      refuse(i, "received a gradient inside a recording from an op that keeps no exact sums (only Linear "
                "keeps them), so it cannot be added over the ranks exactly");
    }
    if (exact_.empty() && parameters_[i].grad().defined()) {
      refuse(i, "holds a gradient but nothing was recorded: a sync of nothing would leave each rank its own "
                "gradient (a backward before the sync was made, or a gradient set by hand?); " +
                std::string(kHowTo));
    }
  }
  for (exact::ExactSums* sums : exact_.sums()) ranks_->combine(*sums);
  exact_.round_into_grads();
  at_sync_ = seen_ = accumulations();
}

}  // namespace seqpar::nn
