// The precision a run computed in, and the rounding bounds derived from it: what two
// correct computations of the same value, in different orders (another kernel, another
// tiling, partial sums over ranks), can differ by. Every "within rounding" of the
// diagnosis comes from here, so a correct bf16 run is never called wrong for bf16's
// rounding, and a float32 run keeps float32's resolution.
//
// The precision is the coarsest of: the saved tensors' dtypes (BF16, F16, F32), the
// ds_config's "bf16": {"enabled": true} or "fp16": {"enabled": true}, and --precision
// (which overrides both: a bf16 run saved as float32 looks like float32, and TF32
// matmuls round at 2^-11 whatever the dtype).
//
// The bound. A sum of n terms computed in precision u (unit roundoff: 2^-8 for bf16,
// 2^-11 for fp16 and TF32, 2^-24 for fp32, 2^-53 for fp64) errs by at most
// gamma_n = n u / (1 - n u) of the sum of the terms' magnitudes (Higham, Accuracy and
// Stability of Numerical Algorithms, 2nd ed., section 3.1). That worst case assumes
// every rounding errs the same way; rounding errors are close to independent and of
// mean zero, and then the error is lambda sqrt(n) u with probability at least
// 1 - 2 exp(-lambda^2 (1 - u)^2 / 2) (Higham and Mary, SIAM J. Sci. Comput. 41(5),
// 2019, theorem 3.1). seqpar-diagnose takes lambda = 1 per run and compares two runs
// (the ranks' and the baseline's), each rounded on its own: the bound is
//
//     rounding_bound(u, n) = 2 sqrt(n) u
//
// with n the longest reduction on the compared value's path rounded at u.
//
// The attention's output: the keys a query attends to (the sequence length S). Its
// softmax weights, S of them, are each rounded at the run's precision before the
// weighted sum (PyTorch's math path materializes them in bf16), and its denominator and
// weighted sum run over the same keys: attention_tolerance = rounding_bound(u, S). A bf16 attention of S = 2048 keys gets 0.35 of the
// shard's largest value (PyTorch's bf16 attention in two op orders differs by up to
// 0.1 of it; a softmax scale of 1/D instead of 1/sqrt(D) by 0.5, a lost shard by more);
// float32 at the same S gets 5.4e-6.
//
// A weight's gradient: a sum of one term per token of the batch (N tokens), each term a
// product of two operands. Half-precision runs accumulate those sums in float32 (every
// GEMM kernel, and DeepSpeed's bf16/fp16 gradient accumulation and reduction), so the
// N-term sum rounds at float32's u_acc. The operands are activations the forward pass
// computed at the run's u, and their error is the forward's: the attention's, over the S
// keys of a sequence (above), plus the three roundings of the term (two operands, the
// result). Independent errors add in quadrature:
//
//     gradient_bound(u, N, S) = 2 (sqrt(N) u_acc + sqrt(S + 3) u)
//
// S is the sequence length when the attention was saved, else at most N (taken as N).
// bf16 at N = S = 256: 0.126 (normwise, relative; PyTorch's bf16 Ulysses layer against
// its one-rank baseline: 0.024); float32 at N = S = 8192: 2.2e-5.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace seqpar::diagnose {

enum class Precision { Float64, Float32, TensorFloat32, Float16, BFloat16 };

double unit_roundoff(Precision precision);
std::string precision_name(Precision precision);  // "bf16", "fp16", "tf32", "fp32", "fp64"
// "bf16" (also "bfloat16"), "fp16" ("float16", "half"), "tf32", "fp32" ("float32"),
// "fp64" ("float64"); nullopt for anything else.
std::optional<Precision> parse_precision(const std::string& text);
// The safetensors dtype's precision ("BF16", "F16", "F32", "F64"); nullopt for others.
std::optional<Precision> precision_of_dtype(const std::string& dtype);
// The coarser of the two (larger unit roundoff).
Precision coarser(Precision a, Precision b);

// 2 sqrt(n) u: what two correct runs in precision u, each summing n terms in its own
// order, differ by, relative to the terms' magnitude (above). n >= 1.
double rounding_bound(Precision precision, int64_t terms);
// 2 (sqrt(N) u_acc + sqrt(S + 3) u): a weight gradient summed over N tokens of
// sequences of S (above).
double gradient_bound(Precision precision, int64_t tokens, int64_t sequence);

// The units in the last place of `value` in `precision` (its spacing there): 2u times
// the power of two at or below |value|; 0 for 0.
double ulp_in(Precision precision, double value);

// What the diagnosis knows of the run's precision and where it came from.
struct RunPrecision {
  Precision precision = Precision::Float32;
  std::string source;  // "the saved tensors (F32)", "ds_config.json: bf16.enabled", "--precision"
};

// The coarsest of the dtypes given, or float32 with none.
RunPrecision precision_of_dtypes(const std::vector<std::string>& dtypes);

}  // namespace seqpar::diagnose
