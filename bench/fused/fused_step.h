// The frame of a fused L1 training step (bench/fused/exact_l1_step.h): the batch it trains
// on, and FusedL1Step, the base that checks the model and the batches, holds the
// gradient and optimizer buffers, AdamW's scalars on the device and one CUDA graph per
// batch, and runs, captures and replays a step whose launches the derived step
// enqueues.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device_buffer.h"
#include "core/tensor.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "optim/adamw.h"

struct CUgraphExec_st;  // cudaGraphExec_t's type; declared so CPU-only builds compile

namespace seqpar::fused {

// One batch: x [rows, in] and target [rows, out] (either may be a view with its own
// row stride, columns adjacent), at fixed addresses for the life of the step object.
struct Batch {
  Tensor x, target;
};

namespace detail {

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

// The base of a fused step. A step's device work is all enqueue_step's (the derived
// step's: the loss, the unclipped gradients in gradients(), combined across ranks when
// it has them, the norm, the clip and AdamW's update with the state below). Nothing in
// a step allocates, synchronizes with the host or reads a value back.
class FusedL1Step {
 public:
  virtual ~FusedL1Step();
  FusedL1Step(const FusedL1Step&) = delete;
  FusedL1Step& operator=(const FusedL1Step&) = delete;

  // One step on batch `batch`, its kernels queued on the device's current stream.
  void run(size_t batch = 0);
  // Captures one graph per batch (nothing runs), refused when the step meets its peers
  // on the host. With NCCL every rank captures, and later replays, together; capture
  // after a run() or two, so that NCCL has connected to its peers first (as PyTorch
  // warms up).
  void capture();
  bool captured() const { return graphs_.size() > 0; }
  // One step by launching the captured graph of `batch`.
  void replay(size_t batch = 0);

  int64_t step_count() const { return schedule_->steps(); }
  const Tensor& loss() const { return loss_; }
  const Tensor& total_norm() const { return total_norm_; }
  const Tensor& grad_weight() const { return grad_weight_; }
  const Tensor& grad_bias() const { return grad_bias_; }
  // Both gradients in one buffer: grad_weight() flattened, then grad_bias().
  const Tensor& gradients() const { return gradients_; }

  // Steps whose AdamW scalars one upload of the table covers.
  static constexpr int64_t kTableSteps = AdamWSchedule::kTableSteps;

 protected:
  // Checks the model (on a GPU, contiguous, out_features at most max_out) and the
  // batches, naming `name` in every error; allocates the buffers; the model's .grad()
  // become views of gradients().
  FusedL1Step(const char* name, const nn::Linear& model, std::vector<Batch> batches,
              nn::Reduction reduction, const optim::AdamWOptions& adamw, double max_norm,
              int64_t max_out);

  // One step on batch `batch`, every launch on the device's current stream.
  virtual void enqueue_step(size_t batch) = 0;
  // Why the step cannot be captured into a graph, or null when it can.
  virtual const char* capture_refusal() const = 0;

  const char* name_;
  Tensor weight_, bias_;
  std::vector<Batch> batches_;
  int64_t rows_ = 0, in_ = 0, out_ = 0;
  float loss_scale_ = 0.0f;  // the loss's factor, nn::Reduction::scale in float
  int device_ = 0;
  Tensor gradients_, grad_weight_, grad_bias_, loss_, total_norm_;
  // The optimizer's state: AdamW's moments ([parameters], W's then b's, as gradients_)
  // and its scalars on the device.
  float max_norm_ = 0.0f;
  Tensor exp_avg_, exp_avg_sq_;
  std::unique_ptr<AdamWSchedule> schedule_;

 private:
  std::string run_range_, replay_range_;  // NVTX: "<name>::run", "<name>::replay"
  StepGraphs graphs_;
};

}  // namespace detail
}  // namespace seqpar::fused
