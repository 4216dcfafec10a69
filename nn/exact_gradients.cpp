#include "nn/exact_gradients.h"

#include "core/error.h"

namespace seqpar::nn {

namespace {

thread_local ExactGradients* current_recording = nullptr;

bool same_targets(const std::vector<ExactGradients::Target>& a,
                  const std::vector<ExactGradients::Target>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].parameter.is(b[i].parameter) || a[i].first != b[i].first) return false;
  }
  return true;
}

}  // namespace

ExactGradients::Recording::Recording(ExactGradients& gradients) : previous_(current_recording) {
  current_recording = &gradients;
}

ExactGradients::Recording::~Recording() { current_recording = previous_; }

std::vector<exact::ExactSums*> ExactGradients::sums() {
  std::vector<exact::ExactSums*> all;
  for (Entry& entry : entries_) all.push_back(&entry.sums);
  return all;
}

void ExactGradients::round_into_grads() {
  for (Entry& entry : entries_) {
    for (const Target& target : entry.targets) {
      const autograd::Variable& parameter = target.parameter;
      Tensor grad = parameter.grad();
      const bool in_place = grad.defined() && grad.is_contiguous() && grad.shape() == parameter.shape();
      if (!in_place) grad = Tensor::empty(parameter.shape(), parameter.device());
      entry.sums.round_into(grad, target.first);
      if (!in_place) parameter.set_grad(grad);
    }
  }
  entries_.clear();
}

bool ExactGradients::record(exact::ExactSums&& sums, std::vector<Target> targets) {
  if (current_recording == nullptr) return false;
  for (Entry& entry : current_recording->entries_) {
    if (!same_targets(entry.targets, targets)) continue;
    SEQPAR_CHECK(entry.sums.count() == sums.count() && entry.sums.device() == sums.device(),
                 "ExactGradients: a pass recorded ", sums.count(), " sums on ", sums.device(),
                 " for parameters that an earlier pass recorded ", entry.sums.count(), " on ",
                 entry.sums.device());
    entry.sums.add(sums);
    return true;
  }
  current_recording->entries_.push_back(Entry{std::move(targets), std::move(sums)});
  return true;
}

std::vector<autograd::Variable> ExactGradients::recorded_parameters() const {
  std::vector<autograd::Variable> parameters;
  for (const Entry& entry : entries_) {
    for (const Target& target : entry.targets) parameters.push_back(target.parameter);
  }
  return parameters;
}

}  // namespace seqpar::nn
