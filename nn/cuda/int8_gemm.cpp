// cuBLASLt's integer GEMM, as nn/cuda/int8_gemm.h describes.
#include "nn/cuda/int8_gemm.h"

#include <cublasLt.h>

#include <mutex>

#include "core/device_buffer.h"
#include "core/error.h"

#define CUBLASLT_CHECK(call)                                                              \
  do {                                                                                    \
    const cublasStatus_t seqpar_status_ = (call);                                         \
    SEQPAR_CHECK(seqpar_status_ == CUBLAS_STATUS_SUCCESS, #call, " failed: ",             \
                 cublasLtGetStatusName(seqpar_status_), " (",                             \
                 cublasLtGetStatusString(seqpar_status_), ")");                           \
  } while (0)

namespace seqpar::nn::detail {

namespace {

// One handle for the process, created on first use (it costs milliseconds) and never
// destroyed (it may outlive the CUDA context at exit). Calls through it are serialized
// (`calls`): ranks as threads share it, and they only enqueue work.
std::mutex calls;
cublasLtHandle_t handle() {
  static const cublasLtHandle_t created = [] {
    cublasLtHandle_t h = nullptr;
    CUBLASLT_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return created;
}

// cuBLASLt's descriptors, destroyed however the call ends.
struct Descriptors {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }
};

// A layout's strided batch: `count` matrices, `stride` elements apart.
void set_batch(cublasLtMatrixLayout_t layout, int count, int64_t stride) {
  const int32_t batch_count = count;
  CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch_count,
                                                  sizeof(batch_count)));
  CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)));
}

// Enough for cuBLASLt's split-K and stream-K algorithms at the shapes nn asks for.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

void int8_product(const Int8Product& p, int device, cuda::Stream stream) {
  SEQPAR_CHECK(p.m > 0 && p.n > 0 && p.k > 0 && p.m % 16 == 0 && p.n % 16 == 0 && p.k % 16 == 0,
               "int8_product: m ", p.m, ", n ", p.n, ", k ", p.k, " must be positive multiples of 16");
  SEQPAR_CHECK(p.batch == 1 || (p.batch > 1 && p.a_batch_stride % 16 == 0 && p.b_batch_stride % 16 == 0 &&
                                 p.c_batch_stride % 16 == 0 && p.a_batch_stride > 0 && p.b_batch_stride > 0 &&
                                 p.c_batch_stride >= p.m * p.n),
               "int8_product: a batch of ", p.batch, " needs positive strides, multiples of 16, C's at least m n; got ",
               p.a_batch_stride, ", ", p.b_batch_stride, ", ", p.c_batch_stride);
  const int64_t a_stride = p.a_stride > 0 ? p.a_stride : p.k;
  SEQPAR_CHECK(a_stride >= p.k && a_stride % 16 == 0, "int8_product: A's column stride ", a_stride,
               " must be a multiple of 16 and at least k (", p.k, ")");
  const std::lock_guard<std::mutex> lock(calls);
  Descriptors d;
  CUBLASLT_CHECK(cublasLtMatmulDescCreate(&d.operation, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                &transpose, sizeof(transpose)));
  CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d.operation, CUBLASLT_MATMUL_DESC_TRANSB, &keep,
                                                sizeof(keep)));
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8I, u(p.k), u(p.m), a_stride));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8I, u(p.k), u(p.n), p.k));
  CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32I, u(p.m), u(p.n), p.m));
  if (p.batch > 1) {
    set_batch(d.a, p.batch, p.a_batch_stride);
    set_batch(d.b, p.batch, p.b_batch_stride);
    set_batch(d.c, p.batch, p.c_batch_stride);
  }
  CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&d.preference));
  const size_t workspace_bytes = kWorkspaceBytes;
  CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t choice{};
  int found = 0;
  CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle(), d.operation, d.a, d.b, d.c, d.c,
                                                d.preference, 1, &choice, &found));
  SEQPAR_CHECK(found > 0, "int8_product: cuBLASLt has no int8 algorithm for m ", p.m, ", n ", p.n,
               ", k ", p.k);
  DeviceBuffer<unsigned char> workspace(static_cast<int64_t>(workspace_bytes), Device::cuda(device));
  const int32_t one = 1, beta = p.accumulate ? 1 : 0;
  CUBLASLT_CHECK(cublasLtMatmul(handle(), d.operation, &one, p.a, d.a, p.b, d.b, &beta, p.c, d.c,
                                p.c, d.c, &choice.algo, workspace.data(), workspace_bytes, stream));
}

}  // namespace seqpar::nn::detail
