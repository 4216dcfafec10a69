#include "apps/diagnose/precision.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/error.h"

namespace seqpar::diagnose {

double unit_roundoff(Precision precision) {
  // Half the spacing of the numbers in [1, 2): 2^-(mantissa bits + 1).
  switch (precision) {
    case Precision::Float64: return std::ldexp(1.0, -53);
    case Precision::Float32: return std::ldexp(1.0, -24);
    case Precision::TensorFloat32: return std::ldexp(1.0, -11);
    case Precision::Float16: return std::ldexp(1.0, -11);
    case Precision::BFloat16: return std::ldexp(1.0, -8);
  }
  return std::ldexp(1.0, -24);
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::Float64: return "fp64";
    case Precision::Float32: return "fp32";
    case Precision::TensorFloat32: return "tf32";
    case Precision::Float16: return "fp16";
    case Precision::BFloat16: return "bf16";
  }
  return "?";
}

std::optional<Precision> parse_precision(const std::string& text) {
  std::string lower = text;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "bf16" || lower == "bfloat16") return Precision::BFloat16;
  if (lower == "fp16" || lower == "float16" || lower == "half") return Precision::Float16;
  if (lower == "tf32") return Precision::TensorFloat32;
  if (lower == "fp32" || lower == "float32") return Precision::Float32;
  if (lower == "fp64" || lower == "float64") return Precision::Float64;
  return std::nullopt;
}

std::optional<Precision> precision_of_dtype(const std::string& dtype) {
  if (dtype == "BF16") return Precision::BFloat16;
  if (dtype == "F16") return Precision::Float16;
  if (dtype == "F32") return Precision::Float32;
  if (dtype == "F64") return Precision::Float64;
  return std::nullopt;
}

Precision coarser(Precision a, Precision b) { return unit_roundoff(a) >= unit_roundoff(b) ? a : b; }

double rounding_bound(Precision precision, int64_t terms) {
  SEQPAR_CHECK(terms >= 1, "rounding_bound: a sum of ", terms, " terms");
  return 2 * std::sqrt(double(terms)) * unit_roundoff(precision);
}

double gradient_bound(Precision precision, int64_t tokens, int64_t sequence) {
  SEQPAR_CHECK(tokens >= 1 && sequence >= 1, "gradient_bound: ", tokens, " tokens, sequences of ", sequence);
  const bool half = precision == Precision::BFloat16 || precision == Precision::Float16 ||
                    precision == Precision::TensorFloat32;
  const double accumulate = half ? unit_roundoff(Precision::Float32) : unit_roundoff(precision);
  return 2 * (std::sqrt(double(tokens)) * accumulate + std::sqrt(double(sequence) + 3) * unit_roundoff(precision));
}

double ulp_in(Precision precision, double value) {
  if (value == 0 || !std::isfinite(value)) return 0;
  return std::ldexp(2 * unit_roundoff(precision), std::ilogb(value));
}

RunPrecision precision_of_dtypes(const std::vector<std::string>& dtypes) {
  RunPrecision run;
  std::set<std::string> seen;
  for (const std::string& dtype : dtypes) {
    const std::optional<Precision> precision = precision_of_dtype(dtype);
    if (!precision) continue;
    run.precision = seen.empty() ? *precision : coarser(run.precision, *precision);
    seen.insert(dtype);
  }
  std::string names;
  for (const std::string& dtype : seen) names += (names.empty() ? "" : ", ") + dtype;
  run.source = seen.empty() ? "assumed fp32 (no tensors)" : "the saved tensors' dtypes (" + names + ")";
  return run;
}

}  // namespace seqpar::diagnose
