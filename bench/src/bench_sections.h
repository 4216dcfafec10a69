// The sections of seqpar-bench that live outside its main file.
#pragma once

#include <string>

#include "bench/src/bench_util.h"
#include "core/tensor.h"
#include "dist/environment.h"
#include "optim/adamw.h"

namespace seqpar::bench {

// The report's AdamW: lr 1e-4, weight decay 0.01, PyTorch's betas and eps.
inline optim::AdamWOptions issue_adamw() {
  return optim::AdamWOptions().lr(1e-4).weight_decay(0.01);
}

struct Settings {
  int repeats = 300, warmup = 30;
  std::string json = "seqpar_bench.json";
  bool stress = true;
  bool kernel_parts = false, kernel_parts_only = false;
  bool exact_dw_only = false;
  bool attention_only = false;
};

// Kernels at the issue's shapes (seqpar_bench_kernels.cpp).
void bench_kernels(Report& report, const Settings& settings);
// Exact attention at the Ulysses scenario's shape, through the CUDA launchers
// (attention_bench.cpp); bench_kernels runs it.
void bench_attention(Report& report, const Settings& settings);
// Exact attention at 4,096 to 131,072 tokens, GQA, D 128 (attention_bench.cpp).
void bench_attention_long(Report& report, const Settings& settings);
// The Llama-shaped Ulysses layer's step at 65,536 tokens, 4 ranks as threads on one GPU,
// after a check of its bits against one CPU rank (attention_bench.cpp).
void bench_ulysses_step(Report& report, const Settings& settings);
// The issue's kernels one launcher at a time, where bench_kernels times them in pairs
// (seqpar-bench --kernel-parts; seqpar_bench_kernels.cpp).
void bench_kernel_parts(Report& report, const Settings& settings);
// The exact step's forward (the L1 loss in its epilogue) and its one-magnitude dW at
// 12,000 rows of weight's shape: alone, one after the other and side by side on two
// streams (seqpar_bench_overlap.cpp).
void bench_forward_and_weight_grad(Report& report, const Settings& settings, const Tensor& weight,
                                   const Tensor& bias);
// Exact dW alone with a randn dy at the seed shape and (with settings.stress) the stress
// shape: the binned row sums (seed shape; the stress shape's is gemm/stress_dw) and the
// CRT on the int8 tensor cores (seqpar_bench_kernels.cpp).
void bench_exact_dw(Report& report, const Settings& settings);
// The stress shape and the square GEMM (seqpar_bench_kernels.cpp).
void bench_stress(Report& report, const Settings& settings);

// The issue step over NCCL, this process being one rank of `environment`'s world
// (seqpar-bench --nproc 2; seqpar_bench_nccl.cpp, built with NCCL only). Rank 0
// prints the figures and writes settings.json. Returns the exit status: 1 when a
// correctness check failed on any rank.
int bench_nccl_world(const Settings& settings, const dist::LaunchEnvironment& environment);

}  // namespace seqpar::bench
