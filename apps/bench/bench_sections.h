// The sections of seqpar-bench that live outside its main file.
#pragma once

#include <string>

#include "apps/bench/bench_util.h"

namespace seqpar::bench {

struct Settings {
  int repeats = 300, warmup = 30;
  std::string json = "seqpar_bench.json";
  bool stress = true;
};

// Kernels at the seed's shapes (seqpar_bench_kernels.cpp).
void bench_kernels(Report& report, const Settings& settings);
// The stress shape and the square GEMM (seqpar_bench_kernels.cpp).
void bench_stress(Report& report, const Settings& settings);

}  // namespace seqpar::bench
