// What the fused step's tests share (tests/fused/exact_l1_step_test.cpp,
// exact_l1_forward_test.cpp): the report's AdamW, the model and data placed on a
// device, and what a step leaves.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>

#include "core/generator.h"
#include "core/tensor.h"
#include "nn/linear.h"
#include "optim/adamw.h"
#include "bench/fused/fused_step.h"

namespace seqpar::test {

inline optim::AdamWOptions issue_adamw() {
  return optim::AdamWOptions().lr(1e-4).weight_decay(0.01);
}

// values on `device`; strided: as a misaligned window of a wider buffer (row stride
// cols + 5, starting at row 1, column 3).
inline Tensor place(const Tensor& values, Device device, bool strided) {
  if (!strided) return values.to(device);
  Tensor wide = Tensor::zeros({values.size(0) + 1, values.size(1) + 5}, device);
  Tensor window = wide.narrow(0, 1, values.size(0)).narrow(1, 3, values.size(1));
  window.copy_(values);
  return window;
}

// A Linear on `device` holding copies of `weight` [out, in] and `bias` [out].
inline nn::Linear model_with(const Tensor& weight, const Tensor& bias, Device device) {
  Generator unused(0);
  nn::Linear model(weight.size(1), weight.size(0), unused, device);
  model.weight().data().copy_(weight);
  model.bias().data().copy_(bias);
  return model;
}

// A step's data on the host: a Linear's initial parameters, then x, from one generator
// (as the report's script draws them); the target is the caller's.
struct StepData {
  Tensor x, target, weight, bias;
};
inline StepData draw_model_and_x(uint64_t seed, int64_t rows, int64_t in, int64_t out) {
  Generator generator(seed);
  nn::Linear model(in, out, generator);
  StepData data;
  data.weight = model.weight().data().clone();
  data.bias = model.bias().data().clone();
  data.x = generator.randn({rows, in});
  return data;
}

// A Linear on `device` with the data's initial parameters.
inline nn::Linear model_on(const StepData& data, Device device) {
  return model_with(data.weight, data.bias, device);
}

// What a step leaves, after its last step.
struct StepOutcome {
  Tensor loss, norm, grad_weight, grad_bias, weight, bias;
};

// `steps` steps of a fused step that trains `model`, over its `batches` batches in turn,
// eagerly or captured and replayed; then what it leaves.
inline StepOutcome run_steps(fused::detail::FusedL1Step& step, const nn::Linear& model, int steps,
                             bool graph, int batches) {
  if (graph) step.capture();
  for (int s = 0; s < steps; ++s) {
    const size_t batch = static_cast<size_t>(s % batches);
    if (graph) step.replay(batch);
    else step.run(batch);
  }
  CHECK(step.step_count() == steps);
  return {step.loss().clone(),      step.total_norm().clone(),     step.grad_weight().clone(),
          step.grad_bias().clone(), model.weight().data().clone(), model.bias().data().clone()};
}

}  // namespace seqpar::test
