// seqpar-diagnose's parts: the safetensors reader against seqpar's writer and the
// compiler's float16, Adam's first-step rule against a first step computed through the
// moments, and the layout and scale names. The program on real PyTorch runs, on
// seqpar-repro's dumps and on bad input is tested by the scripts CMakeLists.txt lists.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unistd.h>

#include "apps/diagnose/diagnosis.h"
#include "apps/diagnose/safetensors_reader.h"
#include "core/generator.h"
#include "apps/common/safetensors.h"

using namespace seqpar;
using namespace seqpar::diagnose;

namespace {

bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 4) == 0;
}

std::string temporary_directory() {
  char name[] = "/tmp/seqpar_diagnose_test.XXXXXX";
  REQUIRE(::mkdtemp(name) != nullptr);
  return name;
}

// One AdamW first step in float32, the long way: through the moments and the bias
// corrections, as torch.optim.AdamW computes it.
std::vector<float> adamw_first_step(const std::vector<float>& theta, const std::vector<float>& g, float lr) {
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
  std::vector<float> out(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) {
    const float m = (1 - b1) * g[i], v = (1 - b2) * g[i] * g[i];
    const float denominator = std::sqrt(v) / std::sqrt(1 - b2) + eps;
    out[i] = theta[i] * (1 - lr * wd) - (lr / (1 - b1)) * m / denominator;
  }
  return out;
}

}  // namespace

TEST_CASE("diagnose: float16 widened exactly, every bit pattern", "[diagnose]") {
#if defined(__FLT16_MANT_DIG__)
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t half_bits = static_cast<uint16_t>(bits);
    _Float16 half;
    std::memcpy(&half, &half_bits, 2);
    INFO("bits " << bits);
    REQUIRE(same_bits(float_from_half(half_bits), static_cast<float>(half)));
  }
#endif
  CHECK(float_from_half(0x3c00) == 1.0f);
  CHECK(float_from_half(0xc000) == -2.0f);
  CHECK(float_from_half(0x0001) == std::ldexp(1.0f, -24));  // the smallest subnormal
  CHECK(float_from_half(0x7bff) == 65504.0f);
  CHECK(std::isinf(float_from_half(0xfc00)));
  CHECK(std::isnan(float_from_half(0x7e00)));
}

TEST_CASE("diagnose: bfloat16 is float32's upper half", "[diagnose]") {
  CHECK(float_from_bfloat16(0x3f80) == 1.0f);
  CHECK(float_from_bfloat16(0xc040) == -3.0f);
  CHECK(float_from_bfloat16(0x0001) == std::ldexp(1.0f, -133));
  CHECK(std::isinf(float_from_bfloat16(0x7f80)));
}

TEST_CASE("diagnose: the reader returns what seqpar's writer wrote, bit for bit", "[diagnose]") {
  Generator generator(29);
  const Tensor a = generator.randn({5, 7}), b = generator.randn({3});
  const std::string directory = temporary_directory(), path = directory + "/m_rank0.safetensors";
  save_safetensors(path, {{"layer.weight", a}, {"grad.layer.bias", b}}, {{"producer", "test"}});
  const StoredFile file = read_safetensors(path);
  REQUIRE(file.tensors.size() == 2);
  CHECK(file.tensors[0].name == "layer.weight");
  CHECK(file.tensors[0].shape == std::vector<int64_t>{5, 7});
  CHECK(file.tensors[0].values == a.to_vector());
  CHECK(file.tensors[1].name == "grad.layer.bias");
  CHECK(file.tensors[1].values == b.to_vector());
  CHECK(file.metadata.at("producer") == "test");
  std::remove(path.c_str());
  ::rmdir(directory.c_str());
}

// A header of 640, 896, 1152 or 1408 bytes begins 0x80 0x02..0x05, as an old torch.save
// pickle does.
TEST_CASE("diagnose: a header whose length looks like a pickle's first bytes is read", "[diagnose]") {
  const std::string directory = temporary_directory(), path = directory + "/m_rank0.safetensors";
  for (const size_t length : {640, 896, 1152, 1408}) {
    std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
    header.resize(length, ' ');
    const float value = 1.5f;
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((uint64_t(length) >> (8 * i)) & 0xff);
    bytes += header + std::string(reinterpret_cast<const char*>(&value), 4);
    FILE* file = std::fopen(path.c_str(), "wb");
    REQUIRE(file != nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), file);
    std::fclose(file);
    INFO("header of " << length << " bytes");
    REQUIRE(uint8_t(bytes[0]) == 0x80);
    const StoredFile read = read_safetensors(path);
    REQUIRE(read.tensors.size() == 1);
    CHECK(read.tensors[0].values == std::vector<float>{1.5f});
  }
  std::remove(path.c_str());
  ::rmdir(directory.c_str());
}

TEST_CASE("diagnose: Adam's first step from different gradients gives the 2 lr signature", "[diagnose]") {
  Generator generator(31);
  const std::vector<float> theta = generator.uniform({64}, -0.05f, 0.05f).to_vector();
  const std::string directory = temporary_directory();
  FileLists lists;
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<float> gradient = generator.randn({64}).to_vector();
    const std::string path = directory + "/model_rank" + std::to_string(rank) + ".safetensors";
    save_safetensors(path, {{"w", Tensor::from_data({8, 8}, adamw_first_step(theta, gradient, 1e-4f))},
                            {"grad.w", Tensor::from_data({8, 8}, gradient)}});
    lists.ranks.push_back(path);
  }
  const RunFiles run = read_run_files(lists);
  Settings settings;
  settings.sp = 4;
  settings.dp = 1;
  settings.lr = 1e-4;
  settings.eps = 1e-8;
  const Diagnosis diagnosis = diagnose::diagnose(run, settings);
  CHECK(diagnosis.verdict == "BROKEN: RANKS DIVERGE");
  REQUIRE(diagnosis.first_step);
  CHECK(diagnosis.first_step->two_lr_signature);
  CHECK(diagnosis.first_step->rule_pairs == 3 * 64);
  CHECK(diagnosis.first_step->rule_matching == diagnosis.first_step->rule_pairs);
  REQUIRE(diagnosis.causes.size() == 1);
  CHECK(diagnosis.causes[0].scenario == "seqpar-repro --scenario issue-6868 --policy deepspeed-0.16");
  CHECK_THAT(diagnosis.layout, Catch::Contains("every rank stepped alone"));

  // The same files read with twice the lr: the differences are 1 lr, not 2, and the
  // rule predicts none of the opposite-sign pairs.
  settings.lr = 2e-4;
  const Diagnosis wrong_lr = diagnose::diagnose(run, settings);
  CHECK_FALSE(wrong_lr.first_step->two_lr_signature);
  CHECK(wrong_lr.first_step->rule_matching < wrong_lr.first_step->rule_pairs);
  for (const std::string& path : lists.ranks) std::remove(path.c_str());
  ::rmdir(directory.c_str());
}

TEST_CASE("diagnose: the group layout that explains which ranks agree", "[diagnose]") {
  CHECK_THAT(explain_layout({{0, 4}, {1, 5}, {2, 6}, {3, 7}}, 4, 2), Catch::Contains("data-parallel groups"));
  CHECK_THAT(explain_layout({{0, 1, 2, 3}, {4, 5, 6, 7}}, 4, 2), Catch::Contains("sequence-parallel groups"));
  CHECK_THAT(explain_layout({{0}, {1}, {2}, {3}}, 4, 1), Catch::Contains("every rank stepped alone"));
  CHECK_THAT(explain_layout({{0, 1}, {2, 3, 4, 5, 6, 7}}, 4, 2), Catch::Contains("no group layout"));
  CHECK_THAT(explain_layout({{0, 1, 2, 3}}, 4, 1), Catch::Contains("one replica"));
}

TEST_CASE("diagnose: a gradient's scale is named, and a turned one is not a scale", "[diagnose]") {
  Generator generator(37);
  const std::vector<float> reference = generator.randn({200}).to_vector();
  std::vector<float> scaled = reference, turned = reference;
  for (float& value : scaled) value *= 4;
  turned[3] += 0.5f;
  Settings settings;
  settings.sp = 4;
  settings.dp = 1;
  const ScaleFigure sp_times = scale_against(scaled, reference, settings);
  CHECK(sp_times.cause == "x sp (4)");
  CHECK(sp_times.direction_error < 1e-7);
  const ScaleFigure off = scale_against(turned, reference, settings);
  CHECK(off.cause.empty());
  CHECK(off.direction_error > 1e-3);
}
