// The rounding tolerances of seqpar-diagnose (apps/diagnose/precision.h): the unit
// roundoff of each precision, the bound 2 sqrt(n) u, where the run's precision comes
// from (the dtypes, the ds_config's bf16/fp16, --precision), and what the bounds decide:
// a bf16 gradient or attention that differs by bf16's rounding is not called wrong, a
// float32 one keeps float32's resolution.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "apps/diagnose/diagnosis.h"
#include "apps/diagnose/safetensors_reader.h"
#include "apps/diagnose/settings.h"
#include "core/error.h"
#include "core/generator.h"

using namespace seqpar;
using namespace seqpar::diagnose;

TEST_CASE("precision: unit roundoff and the bound 2 sqrt(n) u", "[diagnose]") {
  CHECK(unit_roundoff(Precision::BFloat16) == std::ldexp(1.0, -8));
  CHECK(unit_roundoff(Precision::Float16) == std::ldexp(1.0, -11));
  CHECK(unit_roundoff(Precision::TensorFloat32) == std::ldexp(1.0, -11));
  CHECK(unit_roundoff(Precision::Float32) == std::ldexp(1.0, -24));
  CHECK(unit_roundoff(Precision::Float64) == std::ldexp(1.0, -53));
  // u is half the spacing at 1: 1 + 2u is the next number after 1.
  CHECK(1.0f + float(2 * unit_roundoff(Precision::Float32)) == std::nextafter(1.0f, 2.0f));
  CHECK(rounding_bound(Precision::BFloat16, 2048) == Approx(2 * std::sqrt(2048.0) / 256));
  CHECK(rounding_bound(Precision::Float32, 1) == Approx(2 * std::ldexp(1.0, -24)));
  // A gradient: the N-token sum in float32 for half precisions, the operands' forward
  // error over S keys and three roundings at u.
  CHECK(gradient_bound(Precision::Float32, kAssumedTokens, kAssumedTokens) == Approx(2.2e-5).epsilon(0.02));
  CHECK(gradient_bound(Precision::BFloat16, 12000, 256) ==
        Approx(2 * (std::sqrt(12000.0) * std::ldexp(1.0, -24) + std::sqrt(259.0) / 256)));
  CHECK(gradient_bound(Precision::BFloat16, 256, 256) == Approx(0.126).epsilon(0.01));
  CHECK_THROWS(gradient_bound(Precision::BFloat16, 0, 1));
  CHECK_THROWS(rounding_bound(Precision::Float32, 0));
  // The spacing of bf16 at 1.5 is 2^-7; float32's there 2^-23.
  CHECK(ulp_in(Precision::BFloat16, 1.5) == std::ldexp(1.0, -7));
  CHECK(ulp_in(Precision::Float32, -1.5) == std::ldexp(1.0, -23));
  CHECK(ulp_in(Precision::BFloat16, 0) == 0);
  CHECK(coarser(Precision::Float32, Precision::BFloat16) == Precision::BFloat16);
  CHECK(coarser(Precision::Float16, Precision::Float32) == Precision::Float16);
  CHECK(parse_precision("BF16") == Precision::BFloat16);
  CHECK(parse_precision("half") == Precision::Float16);
  CHECK_FALSE(parse_precision("int8"));
  const RunPrecision mixed = precision_of_dtypes({"F32", "BF16", "F32"});
  CHECK(mixed.precision == Precision::BFloat16);
  CHECK(mixed.source == "the saved tensors' dtypes (BF16, F32)");
  CHECK(precision_of_dtypes({}).precision == Precision::Float32);
}

TEST_CASE("precision: DeepSpeed's bf16 and fp16 sections", "[diagnose]") {
  CHECK(read_ds_config(R"({"bf16": {"enabled": true}})", "ds.json").precision == Precision::BFloat16);
  CHECK(read_ds_config(R"({"fp16": {"enabled": true, "loss_scale": 0}})", "ds.json").precision ==
        Precision::Float16);
  CHECK_FALSE(read_ds_config(R"({"bf16": {"enabled": false}})", "ds.json").precision);
  CHECK_FALSE(read_ds_config(R"({"bf16": {}})", "ds.json").precision);
  const DeepSpeedSettings automatic = read_ds_config(R"({"bf16": {"enabled": "auto"}})", "ds.json");
  CHECK_FALSE(automatic.precision);
  CHECK_THROWS_WITH(read_ds_config(R"({"bf16": true})", "ds.json"), Catch::Contains("not an object"));
  CHECK_THROWS_WITH(read_ds_config(R"({"fp16": {"enabled": 1}})", "ds.json"),
                    Catch::Contains("fp16.enabled is 1, not true or false"));
}

namespace {

// One rank's files and a baseline, every tensor `dtype`, the gradients `g` and `g_base`.
RunFiles run_of(const std::string& dtype, const std::vector<float>& g, const std::vector<float>& g_base) {
  RunFiles run;
  const std::vector<float> weight(g.size(), 0.5f);
  const int64_t n = int64_t(g.size());
  for (int r = 0; r < 2; ++r) {
    run.ranks.emplace_back();
    run.ranks.back().files = {"rank" + std::to_string(r) + ".safetensors"};
    run.ranks.back().parameters.add({"w", dtype, {n}, weight});
    run.ranks.back().gradients.add({"grad.w", dtype, {n}, g});
  }
  run.baseline.emplace();
  run.baseline->files = {"baseline.safetensors"};
  run.baseline->parameters.add({"w", dtype, {n}, weight});
  run.baseline->gradients.add({"grad.w", dtype, {n}, g_base});
  run.parameter_names = {"w"};
  return run;
}

// `values` rounded to bf16 (to nearest even), as a bf16 run stores them.
float to_bfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits = (bits + 0x7fff + ((bits >> 16) & 1)) & 0xffff0000u;
  std::memcpy(&value, &bits, 4);
  return value;
}

}  // namespace

TEST_CASE("precision: a bf16 gradient off by bf16 rounding is not wrong, float32 judges finer", "[diagnose]") {
  const std::vector<float> exact = Generator(5).randn({4096}).to_vector();
  std::vector<float> rounded;
  for (float value : exact) rounded.push_back(to_bfloat16(value * 1.001f));  // another order's rounding
  SettingFlags flags;
  flags.lr = 1e-3;
  flags.tokens = 256;  // sequences of S = 256 at most: the bound's S
  const RunFiles bf16 = run_of("BF16", rounded, exact);
  const Settings settings = resolve_settings(flags, bf16);
  REQUIRE(settings.precision.precision == Precision::BFloat16);
  const Diagnosis d = diagnose::diagnose(bf16, settings);
  CHECK(d.tolerances.gradient == Approx(gradient_bound(Precision::BFloat16, 256, 256)));
  CHECK(d.kind == Verdict::NotExact);
  // The same numbers from a float32 run are far beyond float32's rounding.
  const RunFiles fp32 = run_of("F32", rounded, exact);
  const Diagnosis strict = diagnose::diagnose(fp32, resolve_settings(flags, fp32));
  CHECK(strict.tolerances.precision == Precision::Float32);
  CHECK(strict.kind == Verdict::WrongGradient);
  // --precision overrides the dtypes: a bf16 run saved as float32.
  flags.precision = Precision::BFloat16;
  const Settings told = resolve_settings(flags, fp32);
  CHECK(told.precision.source == "--precision");
  CHECK(diagnose::diagnose(fp32, told).kind == Verdict::NotExact);
  // A real mistake stays one in bf16: a tenth of the gradient's elements lost.
  std::vector<float> turned = exact;
  for (size_t i = 0; i < turned.size(); i += 10) turned[i] = 0;
  CHECK(diagnose::diagnose(run_of("BF16", turned, exact), settings).kind == Verdict::WrongGradient);
}

TEST_CASE("precision: the parameters' tolerance is in the run's units in the last place", "[diagnose]") {
  const std::vector<float> baseline = {1.5f, -0.75f, 3.0f};
  std::vector<float> moved = baseline;
  moved[0] = 1.5f + float(std::ldexp(1.0, -7));  // one bf16 ulp
  CHECK(parameter_distance(moved, baseline, 1e-6, Precision::BFloat16).beyond_tolerance == 0);
  CHECK(parameter_distance(moved, baseline, 1e-6, Precision::Float32).beyond_tolerance == 1);
  // Never finer than the float32 the values are held in.
  CHECK(parameter_distance(baseline, baseline, 1e-6, Precision::Float64).beyond_tolerance == 0);
}

TEST_CASE("precision: attention rounding grows as 2 sqrt(S) u and stays below the mistakes", "[diagnose]") {
  CHECK(attention_tolerance(Precision::Float32, 64) == Approx(16 * std::ldexp(1.0, -24)));
  // A 2048-key bf16 attention: rounding up to 0.35 of a shard's largest value; PyTorch's
  // bf16 attention in two op orders differs by up to 0.1, a softmax scale of 1/D by 0.5.
  CHECK(attention_tolerance(Precision::BFloat16, 2048) == Approx(0.354).epsilon(0.01));
  const std::vector<float> base = {1.0f, -0.5f, 0.25f, 2.0f, 1.0f, -0.5f, 0.25f, 2.0f};
  std::vector<float> rounded = base;
  rounded[3] = 2.0f + 0.02f;  // 1% of the shard's largest: bf16 rounding at 4 keys (bound 4 2^-8 = 0.016)
  const TensorByShard t = compare_by_shard("attention", rounded, base, 2, 2, 2, attention_tolerance(Precision::BFloat16, 4));
  CHECK_FALSE(t.shards[0].beyond_rounding());
  const TensorByShard strict = compare_by_shard("attention", rounded, base, 2, 2, 2, attention_tolerance(Precision::Float32, 4));
  CHECK(strict.shards[0].beyond_rounding());
}

TEST_CASE("precision: F64 tensors are read rounded to float32, and judged at float32's resolution", "[diagnose]") {
  std::string header = R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  header += std::string((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  const double values[2] = {0.1, -2.5};
  bytes += header + std::string(reinterpret_cast<const char*>(values), 16);
  const StoredFile file = parse_safetensors(bytes, "f64.safetensors");
  REQUIRE(file.tensors.size() == 1);
  CHECK(file.tensors[0].dtype == "F64");
  CHECK(file.tensors[0].values == std::vector<float>{0.1f, -2.5f});
  // A run of F64 tensors: fp64 by its dtypes, held as float32, so judged as float32.
  RunFiles run = run_of("F64", {0.1f, 0.2f}, {0.1f, 0.2f});
  const Settings settings = resolve_settings({}, run);
  CHECK(settings.precision.precision == Precision::Float32);
  CHECK_THAT(settings.precision.source, Catch::Contains("held as float32"));
}
