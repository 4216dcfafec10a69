// seqpar-diagnose's attention signatures (attention_evidence.h) on fresh random q, k, v:
// each Ulysses mistake computed here from its definition, in float64 (RoPE, causal
// softmax attention; docs/ulysses.md), independently of nn/, then compared by shard
// against the one-rank attention. The same signatures on seqpar-repro's real dumps:
// scripts/diagnose_ulysses_dumps.py.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>
#include <limits>

#include "apps/diagnose/diagnosis.h"
#include "apps/diagnose/report.h"
#include "core/error.h"
#include "core/generator.h"

using namespace seqpar;
using namespace seqpar::diagnose;

namespace {

constexpr int64_t kTokens = 32, kHeads = 2, kDim = 8;

// How one variant places tokens: the position RoPE gives token t, and whether query t
// sees key u.
struct Variant {
  std::function<int64_t(int64_t)> position;
  std::function<bool(int64_t, int64_t)> visible;
  double scale = 0;  // the softmax scale; 0: 1/sqrt(D)
};

Variant variant(const std::string& name, int64_t shard) {
  const auto global = [](int64_t t) { return t; };
  const auto causal = [](int64_t t, int64_t u) { return u <= t; };
  if (name == "no-all-to-all") {
    return {global, [shard](int64_t t, int64_t u) { return u <= t && u / shard == t / shard; }};
  }
  if (name == "local-positions") return {[shard](int64_t t) { return t % shard; }, causal};
  if (name == "local-mask") return {global, [shard](int64_t t, int64_t u) { return u % shard <= t % shard; }};
  if (name == "scale-1/D") return {global, causal, 1.0 / double(kDim)};
  return {global, causal};
}

// x [S, H, D] rotated pairwise (m, m + D/2) by position * 10000^(-2m/D).
std::vector<double> rope(const std::vector<float>& x, const Variant& v) {
  std::vector<double> out(x.size());
  const int64_t half = kDim / 2;
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const size_t row = size_t((t * kHeads + h) * kDim);
      for (int64_t m = 0; m < half; ++m) {
        const double angle = double(v.position(t)) * std::pow(10000.0, -2.0 * double(m) / double(kDim));
        const double a = x[row + size_t(m)], b = x[row + size_t(m + half)];
        out[row + size_t(m)] = a * std::cos(angle) - b * std::sin(angle);
        out[row + size_t(m + half)] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

struct Tensors {
  std::vector<float> query, key, output;  // [S, H * D] each, rounded to float32
};

Tensors attend(const std::vector<float>& q0, const std::vector<float>& k0, const std::vector<float>& v,
               const Variant& variant) {
  const std::vector<double> q = rope(q0, variant), k = rope(k0, variant);
  Tensors out{std::vector<float>(q.begin(), q.end()), std::vector<float>(k.begin(), k.end()),
              std::vector<float>(v.size())};
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      std::vector<double> weight(size_t(kTokens), 0.0);
      double max = -INFINITY, total = 0;
      for (int64_t u = 0; u < kTokens; ++u) {
        if (!variant.visible(t, u)) continue;
        double score = 0;
        for (int64_t d = 0; d < kDim; ++d) {
          score += q[size_t((t * kHeads + h) * kDim + d)] * k[size_t((u * kHeads + h) * kDim + d)];
        }
        weight[size_t(u)] = score * (variant.scale > 0 ? variant.scale : 1 / std::sqrt(double(kDim)));
        max = std::fmax(max, weight[size_t(u)]);
      }
      for (int64_t u = 0; u < kTokens; ++u) {
        weight[size_t(u)] = variant.visible(t, u) ? std::exp(weight[size_t(u)] - max) : 0.0;
        total += weight[size_t(u)];
      }
      for (int64_t d = 0; d < kDim; ++d) {
        double sum = 0;
        for (int64_t u = 0; u < kTokens; ++u) sum += weight[size_t(u)] * v[size_t((u * kHeads + h) * kDim + d)];
        out.output[size_t((t * kHeads + h) * kDim + d)] = float(sum / total);
      }
    }
  }
  return out;
}

std::vector<float> random_values(uint64_t seed) { return Generator(seed).randn({kTokens * kHeads * kDim}).to_vector(); }

// The files of a run whose `ranks` each hold their block of `tensors`' rows, and a
// baseline holding `baseline`'s rows (query and key only when `with_inputs`).
RunFiles run_files(const Tensors& tensors, const Tensors& baseline, int ranks, bool with_inputs) {
  RunFiles run;
  const int64_t rows = kTokens / ranks, width = kHeads * kDim;
  const auto add = [&](RankState& state, const Tensors& source, int64_t first, int64_t count) {
    const auto block = [&](const std::vector<float>& all) {
      return std::vector<float>(all.begin() + first * width, all.begin() + (first + count) * width);
    };
    state.files.push_back("rank.safetensors");
    state.activations.add({kAttentionOutput, "F32", {count, width}, block(source.output)});
    if (!with_inputs) return;
    state.activations.add({kAttentionQuery, "F32", {count, kHeads, kDim}, block(source.query)});
    state.activations.add({kAttentionKey, "F32", {count, kHeads, kDim}, block(source.key)});
  };
  run.ranks.resize(size_t(ranks));
  for (int r = 0; r < ranks; ++r) add(run.ranks[size_t(r)], tensors, r * rows, rows);
  run.baseline.emplace();
  add(*run.baseline, baseline, 0, kTokens);
  return run;
}

AttentionSignature signature_of(const std::string& name, bool with_inputs, uint64_t seed, int sp = 4, int dp = 1) {
  const std::vector<float> q = random_values(seed), k = random_values(seed + 1), v = random_values(seed + 2);
  const int64_t shard = kTokens / (sp * dp);
  // With dp > 1 the S tokens here are dp sequences of S/dp: the baseline attends within each.
  const auto sequence = [&](const Variant& inner) {
    const int64_t length = kTokens / dp;
    return Variant{[=](int64_t t) { return inner.position(t % length); }, [=](int64_t t, int64_t u) {
                     return t / length == u / length && inner.visible(t % length, u % length);
                   }};
  };
  const Tensors baseline = attend(q, k, v, sequence(variant("one rank", shard)));
  const Tensors mistaken = attend(q, k, v, sequence(variant(name, shard)));
  const std::optional<AttentionFigures> figures =
      attention_figures(run_files(mistaken, baseline, sp * dp, with_inputs), sp, dp);
  REQUIRE(figures);
  return figures->signature;
}

}  // namespace

TEST_CASE("attention: each Ulysses mistake's signature from the output alone", "[diagnose]") {
  for (uint64_t seed : {11u, 1234u, 987654u}) {
    INFO("seed " << seed);
    CHECK(signature_of("one rank", false, seed) == AttentionSignature::Matches);
    CHECK(signature_of("no-all-to-all", false, seed) == AttentionSignature::KeysOrPositionsLost);
    CHECK(signature_of("local-positions", false, seed) == AttentionSignature::KeysOrPositionsLost);
    CHECK(signature_of("local-mask", false, seed) == AttentionSignature::FirstShardDiffers);
  }
}

TEST_CASE("attention: the query and key saved tell lost keys from wrong positions", "[diagnose]") {
  for (uint64_t seed : {5u, 4242u}) {
    INFO("seed " << seed);
    CHECK(signature_of("one rank", true, seed) == AttentionSignature::Matches);
    CHECK(signature_of("no-all-to-all", true, seed) == AttentionSignature::KeysLost);
    CHECK(signature_of("local-positions", true, seed) == AttentionSignature::PositionsWrong);
    CHECK(signature_of("local-mask", true, seed) == AttentionSignature::FirstShardDiffers);
  }
}

TEST_CASE("attention: shards over sp x dp, and sp 1", "[diagnose]") {
  CHECK(signature_of("no-all-to-all", false, 77, 2, 2) == AttentionSignature::KeysOrPositionsLost);
  CHECK(signature_of("local-mask", false, 77, 2, 2) == AttentionSignature::FirstShardDiffers);
  CHECK(signature_of("local-positions", true, 77, 2, 2) == AttentionSignature::PositionsWrong);
  // One shard: nothing to lose across shards.
  CHECK(signature_of("no-all-to-all", false, 78, 1, 1) == AttentionSignature::Matches);
  // One shard, and a difference: named as one, no Ulysses signature.
  CHECK(signature_of("local-mask", false, 78, 1, 2) == AttentionSignature::Matches);
  const std::vector<float> q = random_values(79);
  const Tensors baseline = attend(q, q, q, variant("one rank", kTokens));
  const Tensors other = attend(q, random_values(80), q, variant("one rank", kTokens));
  CHECK(attention_figures(run_files(other, baseline, 1, false), 1, 1)->signature == AttentionSignature::Differs);
}

TEST_CASE("attention: per-shard figures, rounding, other inputs, inf", "[diagnose]") {
  const std::vector<float> base = random_values(31);
  const int64_t width = kHeads * kDim, shard = 8;
  std::vector<float> changed = base;
  changed[size_t(2 * shard * width + 5)] += 0.25f;                  // shard 2, one row
  changed[size_t(1 * shard * width)] = std::nextafter(changed[size_t(shard * width)], 10.0f);  // shard 1: one ulp
  const TensorByShard t = compare_by_shard("attention", changed, base, width, shard, 4,
                                           attention_tolerance(Precision::Float32, 4 * shard));
  CHECK(t.shards[0].bitwise());
  CHECK(t.shards[1].rows_unequal == 1);
  CHECK_FALSE(t.shards[1].beyond_rounding());
  CHECK(t.shards[2].rows_unequal == 1);
  CHECK(t.shards[2].max_difference == Approx(0.25).epsilon(1e-6));
  double largest = 0;
  for (int64_t i = 2 * shard * width; i < 3 * shard * width; ++i) {
    largest = std::fmax(largest, std::fabs(base[size_t(i)]));
  }
  CHECK(t.shards[2].largest == largest);
  CHECK(t.shards[2].beyond_rounding());
  CHECK(t.shards[3].rows == shard);

  // Query and key of another batch: no attention signature.
  const std::vector<float> q = random_values(40), k = random_values(41), v = random_values(42);
  Tensors baseline = attend(q, k, v, variant("one rank", shard));
  Tensors other = attend(random_values(43), k, v, variant("one rank", shard));
  CHECK(attention_figures(run_files(other, baseline, 4, true), 4, 1)->signature == AttentionSignature::InputsDiffer);
  other = baseline;
  other.output[7] = std::numeric_limits<float>::infinity();
  CHECK(attention_figures(run_files(other, baseline, 4, false), 4, 1)->signature == AttentionSignature::NotFinite);
}

TEST_CASE("attention: rows that do not add up are refused", "[diagnose]") {
  const std::vector<float> q = random_values(50);
  const Tensors tensors = attend(q, q, q, variant("one rank", 8));
  RunFiles run = run_files(tensors, tensors, 4, false);
  run.ranks.pop_back();  // three ranks' rows against a baseline of four
  CHECK_THROWS_AS(attention_figures(run, 3, 1), InputError);
  CHECK_THROWS_WITH(attention_figures(run_files(tensors, tensors, 4, false), 8, 1),
                    Catch::Contains("none of the layouts read (sp 8 x dp 1)"));
  CHECK_FALSE(attention_figures(run_files(tensors, tensors, 4, false), 4, 1)->output.any_beyond(0));
  RunFiles empty = run_files(tensors, tensors, 1, false);
  empty.baseline->activations = {};
  empty.baseline->activations.add({kAttentionOutput, "F32", {0, 16}, {}});
  CHECK_THROWS_WITH(attention_figures(empty, 4, 1), Catch::Contains("no values to compare"));
}

TEST_CASE("attention: in the diagnosis, beside the parameters", "[diagnose]") {
  const std::vector<float> q = random_values(60), k = random_values(61), v = random_values(62);
  const Tensors baseline = attend(q, k, v, variant("one rank", 8));
  const Tensors mistaken = attend(q, k, v, variant("local-mask", 8));
  Settings settings;
  settings.sp = 4;
  settings.dp = 1;
  settings.lr = 1e-3;
  const auto with_parameters = [&](RunFiles run) {
    const std::vector<float> weight = random_values(63);
    for (RankState& rank : run.ranks) rank.parameters.add({"weight", "F32", {int64_t(weight.size())}, weight});
    run.baseline->parameters.add({"weight", "F32", {int64_t(weight.size())}, weight});
    run.parameter_names = {"weight"};
    return run;
  };
  // Parameters bitwise one rank's, attention not: the verdict is not an all-clear.
  Diagnosis d = diagnose::diagnose(with_parameters(run_files(mistaken, baseline, 4, false)), settings);
  CHECK(d.kind == Verdict::UnlikeOneRank);
  REQUIRE_FALSE(d.causes.empty());
  CHECK(d.causes[0].pitfall == signature_name(AttentionSignature::FirstShardDiffers));
  CHECK(d.causes[0].scenario == "seqpar-repro --scenario ulysses (variant local-mask)");

  d = diagnose::diagnose(with_parameters(run_files(baseline, baseline, 4, false)), settings);
  CHECK(d.kind == Verdict::Identical);
  CHECK(d.causes.empty());

  // Gradients saved too, and turned by the mistake: the attention names the cause; the
  // loss-side pitfalls (shifted targets, dropout, masked tokens) are not listed beside it.
  const auto with_gradients = [&](RunFiles run) {
    run = with_parameters(std::move(run));
    const std::vector<float> turned = random_values(64), right = random_values(65);
    for (RankState& rank : run.ranks) rank.gradients.add({"grad.weight", "F32", {int64_t(turned.size())}, turned});
    run.baseline->gradients.add({"grad.weight", "F32", {int64_t(right.size())}, right});
    return run;
  };
  d = diagnose::diagnose(with_gradients(run_files(mistaken, baseline, 4, false)), settings);
  REQUIRE(d.causes.size() == 1);
  CHECK(d.causes[0].pitfall == signature_name(AttentionSignature::FirstShardDiffers));
  RunFiles gradients_alone = with_gradients(run_files(mistaken, baseline, 4, false));
  for (RankState& rank : gradients_alone.ranks) rank.activations = {};
  gradients_alone.baseline->activations = {};
  d = diagnose::diagnose(gradients_alone, settings);
  CHECK(d.kind == Verdict::WrongGradient);
  CHECK(d.causes.size() == 3);  // without the attention, the loss-side pitfalls are the guesses

  // Without attention tensors, a sequence-parallel run is told they cannot be seen.
  RunFiles plain = with_parameters(run_files(baseline, baseline, 4, false));
  for (RankState& rank : plain.ranks) rank.activations = {};
  plain.baseline->activations = {};
  const auto line = [](const Diagnosis& diagnosis) {
    for (const EvidenceLine& e : diagnosis.evidence) {
      if (e.check == "attention against one-rank training") return e.text;
    }
    return std::string("(none)");
  };
  CHECK_THAT(line(diagnose::diagnose(plain, settings)), Catch::Contains("cannot be seen from parameters alone"));
  settings.sp = 1;
  settings.dp = 4;
  CHECK(line(diagnose::diagnose(plain, settings)) == "(none)");

  // Attention alone: the step is not judged, the attention is.
  settings.sp = 4;
  settings.dp = 1;
  d = diagnose::diagnose(run_files(mistaken, baseline, 4, false), settings);
  CHECK(d.kind == Verdict::Skipped);
  REQUIRE(d.causes.size() == 1);
  CHECK(d.causes[0].pitfall == signature_name(AttentionSignature::FirstShardDiffers));
  CHECK(d.evidence.back().text == signature_name(AttentionSignature::FirstShardDiffers));
  // No parameter was compared: --json says neither agree nor differ.
  const RunFiles alone = run_files(mistaken, baseline, 4, false);
  const nlohmann::json json = nlohmann::json::parse(diagnosis_json(alone, settings, d));
  CHECK(json["parameters_agree"].is_null());
  CHECK(json["differing_parameters"].is_null());
  CHECK(json["attention"]["signature"] == "first-shard-differs");
  const nlohmann::json with = nlohmann::json::parse(
      diagnosis_json(with_parameters(alone), settings, diagnose::diagnose(with_parameters(alone), settings)));
  CHECK(with["parameters_agree"] == true);
}

TEST_CASE("attention: a wrong scale and a shard-local mask get no fix, permuted heads do", "[diagnose]") {
  const std::vector<float> q = random_values(70), k = random_values(71), v = random_values(72);
  const int64_t shard = kTokens / 4;
  const Tensors baseline = attend(q, k, v, variant("one rank", shard));
  Settings settings;
  settings.sp = 4;
  settings.dp = 1;
  const auto cause_of = [&](const Tensors& tensors) {
    const Diagnosis d = diagnose::diagnose(run_files(tensors, baseline, 4, false), settings);
    REQUIRE(d.attention);
    REQUIRE(d.causes.size() == 1);
    return std::make_pair(*d.attention, d.causes[0]);
  };
  // 1/D for 1/sqrt(D): shard 0 differs as under a shard-local mask, but each sequence's
  // first token (one key, weight 1) keeps its row; neither case may be told to fix a mask.
  const auto [scaled, scaled_cause] = cause_of(attend(q, k, v, variant("scale-1/D", shard)));
  CHECK(scaled.signature == AttentionSignature::FirstShardDiffers);
  CHECK(scaled.first_rows_match);
  CHECK(scaled_cause.fix.empty());
  CHECK_THAT(scaled_cause.tell_apart, Catch::Contains("1/sqrt(D)"));
  CHECK_THAT(scaled_cause.evidence, Catch::Contains("first row") && Catch::Contains("within rounding"));
  const auto [masked, masked_cause] = cause_of(attend(q, k, v, variant("local-mask", shard)));
  CHECK(masked.signature == AttentionSignature::FirstShardDiffers);
  CHECK_FALSE(masked.first_rows_match);
  CHECK(masked_cause.fix.empty());
  // Lost keys or positions: two causes, one pattern: no fix either until q and k are saved.
  CHECK(cause_of(attend(q, k, v, variant("no-all-to-all", shard))).second.fix.empty());

  // The heads put back in the wrong order: every row is the right row with its head
  // blocks swapped. Told apart (a permutation and nothing else), so it has a fix.
  Tensors swapped = baseline;
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t d = 0; d < kDim; ++d) {
      std::swap(swapped.output[size_t(t * kHeads * kDim + d)], swapped.output[size_t(t * kHeads * kDim + kDim + d)]);
    }
  }
  const auto [heads, heads_cause] = cause_of(swapped);
  CHECK(heads.signature == AttentionSignature::HeadsPermuted);
  CHECK(heads.heads == 2);
  CHECK(heads.head_order == std::vector<int64_t>{1, 0});
  CHECK_THAT(heads_cause.fix, Catch::Contains("source-rank order"));
  CHECK_THAT(heads_cause.fix, !Catch::Contains("mask"));
  // The right rows in the right order are no permutation.
  CHECK(permuted_heads(baseline.output, baseline.output, kHeads * kDim, 1e-6).first == 0);
}

TEST_CASE("attention: batch-first and head-sharded tensors are read, or a hint is given", "[diagnose]") {
  const std::vector<float> q = random_values(80), k = random_values(81), v = random_values(82);
  const Tensors baseline = attend(q, k, v, variant("one rank", kTokens / 2));
  const Tensors masked = attend(q, k, v, variant("local-mask", kTokens / 2));
  const int64_t width = kHeads * kDim;
  // sp 2: each rank's tensor in `layout`, from all rows of `t`; the baseline [1, S, H*D]
  // for batch first, [S, H*D] (2-D) or [S, H, D] (3-D) for head-sharded.
  const auto files = [&](const Tensors& t, const std::string& layout) {
    RunFiles run;
    run.ranks.resize(2);
    run.baseline.emplace();
    run.baseline->files = {"baseline.safetensors"};
    for (int r = 0; r < 2; ++r) {
      RankState& rank = run.ranks[size_t(r)];
      rank.files = {"rank" + std::to_string(r) + ".safetensors"};
      std::vector<float> mine;
      if (layout == "batch-first") {
        mine.assign(t.output.begin() + r * (kTokens / 2) * width, t.output.begin() + (r + 1) * (kTokens / 2) * width);
        rank.activations.add({kAttentionOutput, "F32", {1, kTokens / 2, width}, mine});
      } else {  // rank r holds head r of every token
        for (int64_t u = 0; u < kTokens; ++u) {
          mine.insert(mine.end(), t.output.begin() + u * width + r * kDim, t.output.begin() + u * width + (r + 1) * kDim);
        }
        const std::vector<int64_t> shape =
            layout == "head-sharded-3d" ? std::vector<int64_t>{kTokens, 1, kDim} : std::vector<int64_t>{kTokens, kDim};
        rank.activations.add({kAttentionOutput, "F32", shape, mine});
      }
    }
    const std::vector<int64_t> shape = layout == "batch-first"       ? std::vector<int64_t>{1, kTokens, width}
                                       : layout == "head-sharded-3d" ? std::vector<int64_t>{kTokens, kHeads, kDim}
                                                                     : std::vector<int64_t>{kTokens, width};
    run.baseline->activations.add({kAttentionOutput, "F32", shape, baseline.output});
    return run;
  };
  for (const std::string layout : {"batch-first", "head-sharded"}) {
    INFO(layout);
    const auto right = attention_figures(files(baseline, layout), 2, 1);
    REQUIRE(right);
    CHECK(right->signature == AttentionSignature::Matches);
    CHECK(attention_layout_name(right->layout) == layout);
    CHECK(attention_figures(files(masked, layout), 2, 1)->signature == AttentionSignature::FirstShardDiffers);
  }
  // [S, H/sp, D] against [S, H, D] is also [b, S/sp, h*d]'s shape: a hint, then read.
  CHECK_THROWS_WITH(attention_figures(files(baseline, "head-sharded-3d"), 2, 1),
                    Catch::Contains("give --attention-layout batch-first or --attention-layout head-sharded"));
  const auto told = attention_figures(files(masked, "head-sharded-3d"), 2, 1, Precision::Float32,
                                      AttentionLayout::HeadSharded);
  CHECK(told->signature == AttentionSignature::FirstShardDiffers);
  CHECK_THROWS_WITH(attention_figures(files(masked, "head-sharded-3d"), 2, 1, Precision::Float32,
                                      AttentionLayout::TokensFirst),
                    Catch::Contains("not the --attention-layout tokens-first"));
  // Where the shapes fit one layout the hint is not needed, and does not override them.
  CHECK(attention_figures(files(masked, "head-sharded"), 2, 1, Precision::Float32, AttentionLayout::BatchFirst)
            ->layout == AttentionLayout::HeadSharded);
}

TEST_CASE("attention: rows saved in context parallelism's zigzag layout, or files out of rank order", "[diagnose]") {
  const std::vector<float> q = random_values(90), k = random_values(91), v = random_values(92);
  const Tensors baseline = attend(q, k, v, variant("one rank", kTokens / 4));
  const int64_t width = kHeads * kDim;
  // The ranks' rows stacked in rank order hold the baseline's blocks `order` (of
  // kTokens / order.size() rows each); q and k move with them.
  const auto reordered = [&](const std::vector<int64_t>& order) {
    Tensors t = baseline;
    const int64_t block = kTokens / int64_t(order.size()) * width;
    for (auto* values : {&t.output, &t.query, &t.key}) {
      const std::vector<float> source = values == &t.output ? baseline.output
                                        : values == &t.query ? baseline.query : baseline.key;
      for (size_t a = 0; a < order.size(); ++a) {
        std::copy(source.begin() + order[a] * block, source.begin() + (order[a] + 1) * block,
                  values->begin() + int64_t(a) * block);
      }
    }
    return t;
  };
  CHECK(zigzag_order(4) == std::vector<int64_t>{0, 7, 1, 6, 2, 5, 3, 4});
  Settings settings;
  settings.sp = 4;
  settings.dp = 1;
  const Diagnosis zigzag = diagnose::diagnose(run_files(reordered(zigzag_order(4)), baseline, 4, true), settings);
  REQUIRE(zigzag.attention);
  CHECK(zigzag.attention->signature == AttentionSignature::RowsPermuted);
  CHECK(zigzag.attention->row_chunks == 8);
  CHECK(zigzag.causes.empty());  // the numbers may be right: a note, not a mistake
  REQUIRE_FALSE(zigzag.notes.empty());
  CHECK_THAT(zigzag.notes.back(), Catch::Contains("exactly context parallelism's zigzag layout"));
  // Rank 1's and rank 2's files swapped: the ranks' blocks out of order.
  const Diagnosis swapped = diagnose::diagnose(run_files(reordered({0, 2, 1, 3}), baseline, 4, false), settings);
  CHECK(swapped.attention->signature == AttentionSignature::RowsPermuted);
  CHECK(swapped.attention->row_order == std::vector<int64_t>{0, 2, 1, 3});
  CHECK_THAT(swapped.notes.back(), Catch::Contains("rank w's file holds the w-th block"));
  // A real mistake is no permutation.
  CHECK(permuted_rows(attend(q, k, v, variant("local-mask", 8)).output, baseline.output, width, kTokens, 8,
                      1e-6).empty());
}
