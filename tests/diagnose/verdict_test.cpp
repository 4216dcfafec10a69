// seqpar-diagnose says "fine" only on evidence: the verdicts of runs built here the long
// way (one AdamW first step through the moments, as torch.optim.AdamW computes it) from
// fresh random gradients, each read with less saved; no ratio through a zero; the
// evidence lines in the text's place and in the JSON.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "apps/diagnose/diagnosis.h"
#include "apps/diagnose/report.h"
#include "core/generator.h"
#include "apps/common/safetensors.h"

using namespace seqpar;
using namespace seqpar::diagnose;

namespace {

constexpr float kLr = 1e-4f, kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;

struct Step {
  std::vector<float> parameters, m, v;
};

// One AdamW step (no weight decay) from theta with gradient g, through the moments.
Step adam_first_step(const std::vector<float>& theta, const std::vector<float>& g) {
  Step step{theta, std::vector<float>(g.size()), std::vector<float>(g.size())};
  for (size_t i = 0; i < g.size(); ++i) {
    step.m[i] = (1 - kB1) * g[i];
    step.v[i] = (1 - kB2) * g[i] * g[i];
    const float denominator = std::sqrt(step.v[i]) / std::sqrt(1 - kB2) + kEps;
    step.parameters[i] = theta[i] - (kLr / (1 - kB1)) * step.m[i] / denominator;
  }
  return step;
}

// A run's files in a directory of their own: each rank (and the baseline) saves what
// `kinds` names: "p" parameters, "g" grad.*, "m" the moments.
struct Run {
  std::string directory;
  FileLists lists;

  Run() {
    char name[] = "/tmp/seqpar_diagnose_verdict.XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    directory = name;
  }
  ~Run() {
    for (const auto& list : {lists.ranks, lists.baseline}) {
      for (const std::string& path : list) std::remove(path.c_str());
    }
    ::rmdir(directory.c_str());
  }
  std::string save(const std::string& file, const Step& step, const std::vector<float>& g, const std::string& kinds) {
    const int64_t n = int64_t(g.size());
    NamedTensors tensors;
    if (kinds.find('p') != std::string::npos) tensors.push_back({"w", Tensor::from_data({n}, step.parameters)});
    if (kinds.find('g') != std::string::npos) tensors.push_back({"grad.w", Tensor::from_data({n}, g)});
    if (kinds.find('m') != std::string::npos) {
      tensors.push_back({"exp_avg.w", Tensor::from_data({n}, step.m)});
      tensors.push_back({"exp_avg_sq.w", Tensor::from_data({n}, step.v)});
    }
    const std::string path = directory + "/" + file;
    save_safetensors(path, tensors);
    return path;
  }
};

Settings adam_settings(int sp) {
  Settings settings;
  settings.lr = kLr;
  settings.beta1 = kB1;
  settings.beta2 = kB2;
  settings.eps = kEps;
  settings.clipping = 0;
  settings.sp = sp;
  settings.dp = 1;
  return settings;
}

// Four ranks that all stepped with `scale` x g, against a baseline that stepped with g,
// each saving `kinds`; the baseline's parameters moved by `offset` more.
Diagnosis diagnose_scaled(float scale, const std::string& kinds, float offset = 0, uint64_t seed = 41) {
  Generator generator(seed);
  const std::vector<float> theta = generator.uniform({256}, -0.05f, 0.05f).to_vector();
  const std::vector<float> g = generator.randn({256}).to_vector();
  std::vector<float> scaled = g;
  for (float& value : scaled) value *= scale;
  Run run;
  const Step ranks = adam_first_step(theta, scaled);
  Step baseline = adam_first_step(theta, g);
  for (float& value : baseline.parameters) value += offset;
  for (int rank = 0; rank < 4; ++rank) {
    run.lists.ranks.push_back(run.save("model_rank" + std::to_string(rank) + ".safetensors", ranks, scaled, kinds));
  }
  run.lists.baseline.push_back(run.save("baseline.safetensors", baseline, g, kinds));
  return diagnose::diagnose(read_run_files(run.lists), adam_settings(4));
}

const EvidenceLine& evidence(const Diagnosis& diagnosis, const std::string& check) {
  for (const EvidenceLine& line : diagnosis.evidence) {
    if (line.check == check) return line;
  }
  FAIL("no evidence line '" << check << "'");
  throw;
}

}  // namespace

TEST_CASE("diagnose: parameters far from the baseline are never 'up to rounding'", "[diagnose]") {
  const Diagnosis far = diagnose_scaled(1, "p", 5.0f);
  CHECK(far.verdict == "CONSISTENT, UNLIKE ONE-RANK TRAINING");
  REQUIRE(far.baseline_distance);
  CHECK(far.baseline_distance->beyond_two_lr == 256);
  CHECK(*far.baseline_distance->max_in_lr > 1e4);
  // Ten lr is as far from rounding; and with the gradients compared (and equal) too.
  CHECK(diagnose_scaled(1, "p", 10 * kLr).verdict == "CONSISTENT, UNLIKE ONE-RANK TRAINING");
  CHECK(diagnose_scaled(1, "pg", 10 * kLr).verdict == "CONSISTENT, UNLIKE ONE-RANK TRAINING");
  // The same run without the offset is rounding-close.
  CHECK(diagnose_scaled(1, "pg").verdict == "IDENTICAL TO ONE-RANK TRAINING");
}

TEST_CASE("diagnose: x sp with parameters only is not called consistent", "[diagnose]") {
  const Diagnosis diagnosis = diagnose_scaled(4, "p");
  CHECK(diagnosis.verdict == "PARAMETERS CLOSE, GRADIENT NOT CHECKED");
  CHECK(diagnosis.kind == Verdict::ParametersClose);  // the name is the kind's, in one place
  CHECK_THAT(diagnosis.verdict_text, Catch::Contains("nearly invisible in the parameters"));
  CHECK_FALSE(evidence(diagnosis, "gradient scale").checked);
  CHECK_THAT(evidence(diagnosis, "gradient scale").text, Catch::Contains("save grad.* or exp_avg"));
  CHECK(evidence(diagnosis, "parameters against one-rank training").checked);
}

TEST_CASE("diagnose: x sp from the moments alone, on the ranks and the baseline", "[diagnose]") {
  const Diagnosis diagnosis = diagnose_scaled(4, "pm");
  CHECK(diagnosis.verdict == "CONSISTENT, WRONG GRADIENT SCALE");
  REQUIRE(diagnosis.scale);
  CHECK(diagnosis.scale->from == "exp_avg (clipping taken out by the clip norms)");
  CHECK(diagnosis.scale->cause == "x sp (4)");
  CHECK(diagnosis.scale->ratio == Approx(4).epsilon(1e-6));
  REQUIRE(diagnosis.moments_are_first_step);
  CHECK(*diagnosis.moments_are_first_step);
  CHECK(evidence(diagnosis, "gradient scale").checked);
  // The right gradient through the moments: the scale is 1, and so is the verdict.
  const Diagnosis right = diagnose_scaled(1, "pm");
  CHECK(right.verdict == "IDENTICAL TO ONE-RANK TRAINING");
  REQUIRE(right.scale);
  CHECK(right.scale->ratio == 1);
}

TEST_CASE("diagnose: a zero gradient on either side is named, never divided by", "[diagnose]") {
  for (const std::string kinds : {"pg", "pm"}) {
    const Diagnosis ranks_zero = diagnose_scaled(0, kinds);
    INFO(kinds << ": " << ranks_zero.verdict_text);
    CHECK(ranks_zero.verdict == "CONSISTENT, WRONG GRADIENT");
    REQUIRE(ranks_zero.scale);
    CHECK(ranks_zero.scale->zero == "the ranks' gradient");
    CHECK_THAT(ranks_zero.verdict_text, Catch::Contains("is all zeros"));
    CHECK_THAT(ranks_zero.verdict_text, !Catch::Contains("nan") && !Catch::Contains("inf"));
    for (const EvidenceLine& line : ranks_zero.evidence) CHECK_THAT(line.text, !Catch::Contains("nan"));
  }
}

TEST_CASE("diagnose: the baseline's zero gradient, and both zero", "[diagnose]") {
  Generator generator(43);
  const std::vector<float> theta = generator.uniform({64}, -0.05f, 0.05f).to_vector();
  const std::vector<float> g = generator.randn({64}).to_vector(), zero(64, 0.0f);
  for (const bool both : {false, true}) {
    Run run;
    const std::vector<float>& ranks_g = both ? zero : g;
    for (int rank = 0; rank < 2; ++rank) {
      run.lists.ranks.push_back(run.save("m_rank" + std::to_string(rank) + ".safetensors",
                                         adam_first_step(theta, ranks_g), ranks_g, "pg"));
    }
    run.lists.baseline.push_back(run.save("baseline.safetensors", adam_first_step(theta, zero), zero, "pg"));
    const Diagnosis diagnosis = diagnose::diagnose(read_run_files(run.lists), adam_settings(2));
    REQUIRE(diagnosis.scale);
    CHECK(diagnosis.scale->zero == (both ? "both gradients" : "the baseline's gradient"));
    // Both zero: the same parameters and gradients bit for bit, nothing divided.
    CHECK(diagnosis.verdict == (both ? "IDENTICAL TO ONE-RANK TRAINING" : "CONSISTENT, WRONG GRADIENT"));
    const nlohmann::json json = nlohmann::json::parse(diagnosis_json(read_run_files(run.lists), adam_settings(2), diagnosis));
    CHECK(json["gradient_scale"]["ratio"].is_null());
    CHECK(json["gradient_scale"]["zero"] == diagnosis.scale->zero);
  }
}

TEST_CASE("diagnose: the evidence lines are in the JSON as in the text", "[diagnose]") {
  Generator generator(47);
  const std::vector<float> theta = generator.uniform({32}, -0.05f, 0.05f).to_vector();
  const std::vector<float> g = generator.randn({32}).to_vector();
  Run run;
  for (int rank = 0; rank < 2; ++rank) {
    run.lists.ranks.push_back(run.save("m_rank" + std::to_string(rank) + ".safetensors", adam_first_step(theta, g), g, "p"));
  }
  const RunFiles files = read_run_files(run.lists);
  const Settings settings = adam_settings(2);
  const Diagnosis diagnosis = diagnose::diagnose(files, settings);
  const nlohmann::json json = nlohmann::json::parse(diagnosis_json(files, settings, diagnosis));
  std::ostringstream text;
  print_diagnosis(text, files, settings, diagnosis);
  REQUIRE(json["evidence"].size() == diagnosis.evidence.size());
  REQUIRE(diagnosis.evidence.size() >= 4);
  for (size_t i = 0; i < diagnosis.evidence.size(); ++i) {
    CHECK(json["evidence"][i]["check"] == diagnosis.evidence[i].check);
    CHECK(json["evidence"][i]["checked"] == diagnosis.evidence[i].checked);
    CHECK(json["evidence"][i]["text"] == diagnosis.evidence[i].text);
    CHECK_THAT(text.str(), Catch::Contains("  " + diagnosis.evidence[i].check + ": "));
  }
  CHECK_THAT(text.str(), Catch::Contains("parameters against one-rank training: not checked - give the baseline's"));
}

TEST_CASE("diagnose: moments past the first step give a steady scale, and say so", "[diagnose]") {
  Generator generator(53);
  const std::vector<float> theta = generator.uniform({128}, -0.05f, 0.05f).to_vector();
  const std::vector<float> g1 = generator.randn({128}).to_vector(), g2 = generator.randn({128}).to_vector();
  // Two steps' moments, m = b1 m + (1-b1) g and v = b2 v + (1-b2) g^2, with every
  // gradient x `scale` (the parameters are the first step's: only the moments matter here).
  const auto two_steps = [&](float scale) {
    Step step = adam_first_step(theta, g1);
    for (size_t i = 0; i < g1.size(); ++i) {
      const float a = scale * g1[i], b = scale * g2[i];
      step.m[i] = kB1 * ((1 - kB1) * a) + (1 - kB1) * b;
      step.v[i] = kB2 * ((1 - kB2) * a * a) + (1 - kB2) * b * b;
    }
    return step;
  };
  Run run;
  for (int rank = 0; rank < 2; ++rank) {
    run.lists.ranks.push_back(run.save("m_rank" + std::to_string(rank) + ".safetensors", two_steps(2), g1, "pm"));
  }
  run.lists.baseline.push_back(run.save("baseline.safetensors", two_steps(1), g1, "pm"));
  const Diagnosis diagnosis = diagnose::diagnose(read_run_files(run.lists), adam_settings(2));
  REQUIRE(diagnosis.moments_are_first_step);
  CHECK_FALSE(*diagnosis.moments_are_first_step);
  REQUIRE(diagnosis.scale);
  CHECK(diagnosis.scale->ratio == Approx(2).epsilon(1e-6));
  CHECK(diagnosis.scale->cause == "x sp (2)");
  CHECK(diagnosis.verdict == "CONSISTENT, WRONG GRADIENT SCALE");
  bool said = false;
  for (const std::string& note : diagnosis.notes) said = said || note.find("only if that was steady") != std::string::npos;
  CHECK(said);
}
