#include "train/step_parts.h"

#include <vector>

#include "core/error.h"

#ifdef SEQPAR_WITH_CUDA
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#endif

namespace seqpar::train::detail {

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
}

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

#else

StepGraphs::~StepGraphs() = default;
void StepGraphs::capture(size_t, int, const std::function<void(size_t)>&) {
  SEQPAR_FAIL("StepGraphs: this seqpar was built without CUDA");
}
void StepGraphs::replay(size_t, int) const { SEQPAR_FAIL("StepGraphs: this seqpar was built without CUDA"); }

#endif

}  // namespace seqpar::train::detail
