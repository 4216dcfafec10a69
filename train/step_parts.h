// What the fused training steps (train/linear_l1_step.h, train/exact_l1_step.h) share:
// the batch they train on, the checks of the batches, AdamW's step scalars on the
// device, and one CUDA graph per batch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/device_buffer.h"
#include "core/tensor.h"
#include "optim/adamw.h"

struct CUgraphExec_st;  // cudaGraphExec_t's type; declared so CPU-only builds compile

namespace seqpar::train {

// One batch: x [rows, in] and target [rows, out] (either may be a view with its own
// row stride, columns adjacent), at fixed addresses for the life of the step object.
struct Batch {
  Tensor x, target;
};

namespace detail {

// Every batch [rows, in] -> [rows, out] with the first batch's rows, on `device`, with
// adjacent columns; `op` names the step in the error.
void check_batches(const char* op, const std::vector<Batch>& batches, int64_t in, int64_t out,
                   Device device);

// AdamW's scalars (bias corrections and the rest, optim::detail::adamw_step_scalars) for
// kTableSteps steps on the device, and the slot of the next step there. A step kernel
// reads table()[*slot()] and advances the slot; between launches the host moves the
// table on when the next step is past it, so that no step reads a scalar from the host.
class AdamWSchedule {
 public:
  static constexpr int64_t kTableSteps = 1024;

  AdamWSchedule(const optim::AdamWOptions& options, Device device);
  // Before each step's launches: its number, and the table moved on when needed.
  void begin_step();
  int64_t steps() const { return steps_; }
  const optim::detail::AdamWStepScalars* table() const { return table_.data(); }
  int* slot() const { return slot_.data(); }

 private:
  void upload();

  optim::AdamWOptions options_;
  DeviceBuffer<optim::detail::AdamWStepScalars> table_;
  DeviceBuffer<int> slot_;
  int64_t steps_ = 0, first_step_ = 1;
};

// One CUDA graph per batch, each captured from the device's current stream while
// `enqueue(batch)` runs (nothing runs then), and replayed there.
class StepGraphs {
 public:
  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  void capture(size_t batches, int device, const std::function<void(size_t)>& enqueue);
  void replay(size_t batch, int device) const;
  size_t size() const { return graphs_.size(); }

 private:
  std::vector<CUgraphExec_st*> graphs_;
};

}  // namespace detail
}  // namespace seqpar::train
