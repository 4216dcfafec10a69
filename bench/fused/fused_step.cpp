#include "bench/fused/fused_step.h"

#include <vector>

#include "core/error.h"

#include "core/nvtx.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#endif

namespace seqpar::fused::detail {

AdamWSchedule::AdamWSchedule(const optim::AdamWOptions& options, Device device)
    : options_(options), table_(kTableSteps, device), slot_(1, device) {
  slot_.zero();
  upload();
}

// table[i] = the scalars of step first_step_ + i, as the eager AdamW takes them.
void AdamWSchedule::upload() {
  std::vector<optim::detail::AdamWStepScalars> host;
  host.reserve(kTableSteps);
  for (int64_t i = 0; i < kTableSteps; ++i) {
    host.push_back(optim::detail::adamw_step_scalars(options_, first_step_ + i));
  }
  table_.copy_from_host(host.data(), kTableSteps);
}

void AdamWSchedule::begin_step() {
  const int64_t step = steps_ + 1;
  if (step - first_step_ >= kTableSteps) {  // the device counter restarts at slot 0
    first_step_ = step;
    upload();
    slot_.zero();
  }
  steps_ = step;
}

#ifdef SEQPAR_WITH_CUDA

namespace {

// Every batch [rows, in] -> [rows, out] with the first batch's rows, on `device`, with
// adjacent columns; `op` names the step in the error.
void check_batches(const char* op, const std::vector<Batch>& batches, int64_t in, int64_t out,
                   Device device) {
  SEQPAR_CHECK(!batches.empty(), op, ": at least one batch is needed");
  const Batch& first = batches[0];
  for (const Batch& batch : batches) {
    SEQPAR_CHECK(batch.x.defined() && batch.target.defined(), op, ": a batch is undefined");
    SEQPAR_CHECK(batch.x.dim() == 2 && batch.x.size(1) == in &&
                     batch.x.size(0) == first.x.size(0),
                 op, ": every x must be [", first.x.size(0), ", ", in, "], got ",
                 batch.x.shape());
    SEQPAR_CHECK(batch.target.dim() == 2 && batch.target.size(0) == batch.x.size(0) &&
                     batch.target.size(1) == out,
                 op, ": target must be [", batch.x.size(0), ", ", out, "], got ",
                 batch.target.shape());
    SEQPAR_CHECK(batch.x.device() == device && batch.target.device() == device, op,
                 ": the batches must be on the model's device ", device);
    SEQPAR_CHECK((in <= 1 || batch.x.stride(1) == 1) && (out <= 1 || batch.target.stride(1) == 1),
                 op, ": x and target need adjacent columns (unit column stride)");
  }
  // The L1 mean of no rows is NaN and its gradients are empty sums: a step with nothing
  // to learn from is the caller's mistake here, not a NaN to train on.
  SEQPAR_CHECK(first.x.size(0) > 0, op, ": the batches have no rows");
}

}  // namespace

FusedL1Step::FusedL1Step(const char* name, const nn::Linear& model, std::vector<Batch> batches,
                         nn::Reduction reduction, const optim::AdamWOptions& adamw,
                         double max_norm, int64_t max_out)
    : name_(name),
      weight_(model.weight().data()),
      bias_(model.bias().data()),
      batches_(std::move(batches)),
      in_(model.in_features()),
      out_(model.out_features()),
      device_(weight_.device().index),
      max_norm_(static_cast<float>(max_norm)),
      run_range_(std::string(name) + "::run"),
      replay_range_(std::string(name) + "::replay") {
  const Device device = weight_.device();
  SEQPAR_CHECK(device.is_cuda(), name, ": the model must be on a GPU, it is on ", device);
  SEQPAR_CHECK(out_ <= max_out, name, ": out_features ", out_, " is above the step's ", max_out);
  SEQPAR_CHECK(weight_.is_contiguous() && bias_.is_contiguous(), name,
               ": weight and bias must be contiguous");
  SEQPAR_CHECK(max_norm > 0.0, name, ": max_norm must be positive, got ", max_norm);
  check_batches(name, batches_, in_, out_, device);
  rows_ = batches_[0].x.size(0);
  loss_scale_ = static_cast<float>(reduction.scale(rows_ * out_));

  cuda::set_device(device_);
  const int64_t parameters = out_ * in_ + out_;
  gradients_ = Tensor::zeros({parameters}, device);
  grad_weight_ = gradients_.narrow(0, 0, out_ * in_).view({out_, in_});
  grad_bias_ = gradients_.narrow(0, out_ * in_, out_);
  loss_ = Tensor::zeros({}, device);
  total_norm_ = Tensor::zeros({}, device);
  exp_avg_ = Tensor::zeros({parameters}, device);
  exp_avg_sq_ = Tensor::zeros({parameters}, device);
  schedule_ = std::make_unique<AdamWSchedule>(adamw, device);
  model.weight().set_grad(grad_weight_);
  model.bias().set_grad(grad_bias_);
}

FusedL1Step::~FusedL1Step() = default;

void FusedL1Step::run(size_t batch) {
  SEQPAR_NVTX_RANGE(run_range_);
  SEQPAR_CHECK(batch < batches_.size(), name_, "::run: batch ", batch, " of ", batches_.size());
  cuda::set_device(device_);
  schedule_->begin_step();
  enqueue_step(batch);
}

void FusedL1Step::capture() {
  const char* refusal = capture_refusal();
  SEQPAR_CHECK(refusal == nullptr, name_, "::capture: ", refusal != nullptr ? refusal : "");
  SEQPAR_CHECK(!captured(), name_, "::capture: already captured");
  graphs_.capture(batches_.size(), device_, [this](size_t batch) { enqueue_step(batch); });
}

void FusedL1Step::replay(size_t batch) {
  SEQPAR_NVTX_RANGE(replay_range_);
  SEQPAR_CHECK(batch < graphs_.size(), name_, "::replay: no graph for batch ", batch,
               " (capture() first)");
  schedule_->begin_step();
  graphs_.replay(batch, device_);
}

StepGraphs::~StepGraphs() {
  for (CUgraphExec_st* graph : graphs_) (void)cudaGraphExecDestroy(graph);
}

void StepGraphs::capture(size_t batches, int device, const std::function<void(size_t)>& enqueue) {
  cuda::set_device(device);
  cudaStream_t stream = cuda::current_stream(device);
  for (size_t batch = 0; batch < batches; ++batch) {
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue(batch);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      (void)cudaStreamEndCapture(stream, &broken);
      if (broken != nullptr) (void)cudaGraphDestroy(broken);
      throw;
    }
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t executable = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&executable, graph, 0);
    (void)cudaGraphDestroy(graph);
    CUDA_CHECK(status);
    graphs_.push_back(executable);
  }
}

void StepGraphs::replay(size_t batch, int device) const {
  cuda::set_device(device);
  CUDA_CHECK(cudaGraphLaunch(graphs_.at(batch), cuda::current_stream(device)));
}

#else  // CPU-only build: the fused steps are a GPU path; the public API serves the CPU.

FusedL1Step::FusedL1Step(const char* name, const nn::Linear&, std::vector<Batch>, nn::Reduction,
                         const optim::AdamWOptions&, double, int64_t)
    : name_(name) {
  SEQPAR_FAIL(name, ": this seqpar was built without CUDA; use the public API (nn::linear, "
              "nn::l1_loss, optim::clip_grad_norm, optim::AdamW) on the CPU");
}
FusedL1Step::~FusedL1Step() = default;
void FusedL1Step::run(size_t) {}
void FusedL1Step::capture() {}
void FusedL1Step::replay(size_t) {}

StepGraphs::~StepGraphs() = default;
void StepGraphs::capture(size_t, int, const std::function<void(size_t)>&) {
  SEQPAR_FAIL("StepGraphs: this seqpar was built without CUDA");
}
void StepGraphs::replay(size_t, int) const { SEQPAR_FAIL("StepGraphs: this seqpar was built without CUDA"); }

#endif

}  // namespace seqpar::fused::detail
