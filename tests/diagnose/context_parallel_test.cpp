// seqpar-diagnose's context-parallel signatures (context_parallel_evidence.h) on fresh
// random q, k, v and an upstream gradient: RoPE, causal attention and its backward
// computed here in float64 from their definitions, the backward block by block as a ring
// runs it (rank r's queries against rank j's keys: dQ kept by r, dK and dV carried to
// j), each CP mistake made inside that computation, the rows saved per rank as a user
// saves them, and compared with one rank's. The same signatures on a PyTorch layer:
// scripts/diagnose_torch_cp.py.
#include <catch2/catch.hpp>

#include <cmath>

#include "apps/diagnose/context_parallel_evidence.h"
#include "apps/diagnose/diagnosis.h"
#include "core/generator.h"

using namespace seqpar;
using namespace seqpar::diagnose;

namespace {

constexpr int kRanks = 4;
constexpr int64_t kTokens = 32, kHeads = 2, kDim = 8, kWidth = kHeads * kDim;

enum class Mistake { None, StaleKeysValues, NotReduced, LossPerRank, ContiguousPositions, LocalPositions, KeysLost };

// The tokens rank `rank` of `ranks` holds, in its own order.
std::vector<int64_t> rank_rows(int rank, int ranks, bool zigzag) {
  std::vector<int64_t> rows;
  if (!zigzag || ranks == 1) {
    for (int64_t t = rank * kTokens / ranks; t < (rank + 1) * kTokens / ranks; ++t) rows.push_back(t);
    return rows;
  }
  const int64_t chunk = kTokens / (2 * ranks);
  for (const int64_t c : {int64_t(rank), int64_t(2 * ranks - 1 - rank)}) {
    for (int64_t t = c * chunk; t < (c + 1) * chunk; ++t) rows.push_back(t);
  }
  return rows;
}

// Every tensor a run saves, [S, H*D] in global token order.
struct Tensors {
  std::vector<float> output, query, key, dq, dk, dv;
};

// x [S, H, D] rotated pairwise (m, m + D/2) by its token's position * 10000^(-2m/D).
std::vector<double> rope(const std::vector<float>& x, const std::vector<int64_t>& positions) {
  std::vector<double> out(x.size());
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const size_t row = size_t(t * kWidth + h * kDim);
      for (int64_t m = 0; m < kDim / 2; ++m) {
        const double angle = double(positions[size_t(t)]) * std::pow(10000.0, -2.0 * double(m) / double(kDim));
        const double a = x[row + size_t(m)], b = x[row + size_t(m + kDim / 2)];
        out[row + size_t(m)] = a * std::cos(angle) - b * std::sin(angle);
        out[row + size_t(m + kDim / 2)] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

Tensors attend(const std::vector<float>& q0, const std::vector<float>& k0, const std::vector<float>& v,
               const std::vector<float>& upstream, int ranks, bool zigzag, Mistake mistake) {
  std::vector<std::vector<int64_t>> rows;
  for (int r = 0; r < ranks; ++r) rows.push_back(rank_rows(r, ranks, zigzag));
  std::vector<int64_t> positions(static_cast<size_t>(kTokens));
  for (int64_t t = 0; t < kTokens; ++t) positions[size_t(t)] = t;
  // The zigzag's tokens at contiguous blocks' positions, or at 0.. on every rank.
  for (int r = 0; r < ranks; ++r) {
    for (size_t j = 0; j < rows[size_t(r)].size(); ++j) {
      const int64_t t = rows[size_t(r)][j];
      if (mistake == Mistake::ContiguousPositions) positions[size_t(t)] = r * kTokens / ranks + int64_t(j);
      if (mistake == Mistake::LocalPositions) positions[size_t(t)] = int64_t(j);
    }
  }
  std::vector<int> owner(static_cast<size_t>(kTokens));
  for (int r = 0; r < ranks; ++r) {
    for (const int64_t t : rows[size_t(r)]) owner[size_t(t)] = r;
  }
  // Keys lost: each rank attends to its own rows alone (no gather of K and V).
  const auto visible = [&](int64_t t, int64_t u) {
    return positions[size_t(u)] <= positions[size_t(t)] &&
           (mistake != Mistake::KeysLost || owner[size_t(u)] == owner[size_t(t)]);
  };
  const std::vector<double> q = rope(q0, positions), k = rope(k0, positions);
  // Each rank's loss a mean over its own tokens, summed over the ranks: every gradient x ranks.
  const double loss_scale = mistake == Mistake::LossPerRank ? double(ranks) : 1.0;
  const double scale = 1 / std::sqrt(double(kDim));
  const auto at = [](int64_t t, int64_t h, int64_t d) { return size_t(t * kWidth + h * kDim + d); };
  const auto score = [&](int64_t t, int64_t u, int64_t h) {
    double sum = 0;
    for (int64_t d = 0; d < kDim; ++d) sum += q[at(t, h, d)] * k[at(u, h, d)];
    return sum * scale;
  };
  std::vector<double> out(q.size(), 0.0), lse(size_t(kTokens * kHeads));
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t h = 0; h < kHeads; ++h) {
      double max = -INFINITY, total = 0;
      for (int64_t u = 0; u < kTokens; ++u) {
        if (visible(t, u)) max = std::fmax(max, score(t, u, h));
      }
      for (int64_t u = 0; u < kTokens; ++u) {
        if (!visible(t, u)) continue;
        const double p = std::exp(score(t, u, h) - max);
        total += p;
        for (int64_t d = 0; d < kDim; ++d) out[at(t, h, d)] += p * v[at(u, h, d)];
      }
      for (int64_t d = 0; d < kDim; ++d) out[at(t, h, d)] /= total;
      lse[size_t(t * kHeads + h)] = max + std::log(total);
    }
  }
  std::vector<double> dq(q.size(), 0.0), dk(q.size(), 0.0), dv(q.size(), 0.0);
  for (int r = 0; r < ranks; ++r) {
    for (int j = 0; j < ranks; ++j) {
      const std::vector<int64_t>& mine = rows[size_t(r)];
      const std::vector<int64_t>& theirs = rows[size_t(j)];
      // Stale K/V: the hop's keys and values are the rank's own block, not the visiting one.
      const std::vector<int64_t>& keys = mistake == Mistake::StaleKeysValues ? mine : theirs;
      for (const int64_t t : mine) {
        for (int64_t h = 0; h < kHeads; ++h) {
          double delta = 0;
          for (int64_t d = 0; d < kDim; ++d) delta += loss_scale * upstream[at(t, h, d)] * out[at(t, h, d)];
          for (size_t i = 0; i < theirs.size(); ++i) {
            const int64_t u = theirs[i], key = keys[i];
            if (positions[size_t(u)] > positions[size_t(t)]) continue;
            const double p = std::exp(score(t, key, h) - lse[size_t(t * kHeads + h)]);
            double dp = 0;
            for (int64_t d = 0; d < kDim; ++d) dp += loss_scale * upstream[at(t, h, d)] * v[at(key, h, d)];
            const double ds = p * (dp - delta);
            for (int64_t d = 0; d < kDim; ++d) dq[at(t, h, d)] += ds * k[at(key, h, d)] * scale;
            // Not reduced: each rank keeps only its own queries' part of its keys' gradients.
            if (mistake == Mistake::NotReduced && r != j) continue;
            for (int64_t d = 0; d < kDim; ++d) {
              dk[at(u, h, d)] += ds * q[at(t, h, d)] * scale;
              dv[at(u, h, d)] += p * loss_scale * upstream[at(t, h, d)];
            }
          }
        }
      }
    }
  }
  const auto rounded = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  return {rounded(out), rounded(q), rounded(k), rounded(dq), rounded(dk), rounded(dv)};
}

std::vector<float> random_values(uint64_t seed) { return Generator(seed).randn({kTokens * kWidth}).to_vector(); }

// Each rank's rows of every tensor (the attention output alone unless `with_inputs`),
// in its own order; the baseline's whole.
RunFiles run_files(const Tensors& ranks_run, const Tensors& baseline, bool zigzag, bool with_inputs) {
  const auto add = [&](RankState& state, const Tensors& source, const std::vector<int64_t>& rows) {
    state.files.push_back("rank.safetensors");
    const std::vector<std::pair<const char*, const std::vector<float>*>> named = {
        {kAttentionOutput, &source.output}, {kAttentionQuery, &source.query}, {kAttentionKey, &source.key},
        {kQueryGradient, &source.dq},       {kKeyGradient, &source.dk},        {kValueGradient, &source.dv}};
    for (const auto& [name, all] : named) {
      if (!with_inputs && name != kAttentionOutput) continue;
      std::vector<float> values;
      for (const int64_t t : rows) {
        values.insert(values.end(), all->begin() + t * kWidth, all->begin() + (t + 1) * kWidth);
      }
      state.activations.add({name, "F32", {int64_t(rows.size()), kWidth}, values});
    }
  };
  RunFiles run;
  run.ranks.resize(kRanks);
  for (int r = 0; r < kRanks; ++r) add(run.ranks[size_t(r)], ranks_run, rank_rows(r, kRanks, zigzag));
  run.baseline.emplace();
  add(*run.baseline, baseline, rank_rows(0, 1, false));
  return run;
}

struct Case {
  Diagnosis diagnosis;
  const AttentionFigures& figures() const { return *diagnosis.attention; }
  const Cause* cause() const { return diagnosis.causes.empty() ? nullptr : &diagnosis.causes.back(); }
};

Case diagnose_cp(Mistake mistake, bool zigzag, bool with_inputs = true, uint64_t seed = 70) {
  const std::vector<float> q = random_values(seed), k = random_values(seed + 1), v = random_values(seed + 2),
                           g = random_values(seed + 3);
  const Tensors baseline = attend(q, k, v, g, 1, false, Mistake::None);
  const Tensors ranks = attend(q, k, v, g, kRanks, zigzag, mistake);
  Settings settings;
  settings.sp = kRanks;
  settings.dp = 1;
  Case c{diagnose::diagnose(run_files(ranks, baseline, zigzag, with_inputs), settings)};
  REQUIRE(c.diagnosis.attention);
  return c;
}

}  // namespace

TEST_CASE("context parallelism: rows put back in global order, norms", "[diagnose]") {
  // Two sequences of 4 rows in 4 blocks of one row: zigzag over 2 ranks holds 0, 3, 1, 2.
  const std::vector<float> stacked = {0, 3, 1, 2, 4, 7, 5, 6};
  CHECK(to_global_order(stacked, 1, 4, zigzag_order(2)) == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(row_norms({3, 4, 0, 0, 1, 0}, 2) == std::vector<float>{5, 0, 1});
  CHECK(attention_gradient_tolerance(Precision::BFloat16, 256) == Approx(2 * std::sqrt(512.0) / 256));
}

TEST_CASE("context parallelism: correct runs, contiguous and zigzag, are not called wrong", "[diagnose]") {
  for (const bool zigzag : {false, true}) {
    INFO((zigzag ? "zigzag" : "contiguous"));
    const Case c = diagnose_cp(Mistake::None, zigzag);
    CHECK(c.figures().zigzag == zigzag);
    CHECK(c.figures().signature == (zigzag ? AttentionSignature::RowsPermuted : AttentionSignature::Matches));
    CHECK(c.figures().backward.signature == BackwardSignature::Matches);
    CHECK(c.figures().backward.blocks == (zigzag ? 2 * kRanks : kRanks));
    CHECK(c.diagnosis.causes.empty());
  }
}

TEST_CASE("context parallelism: stale K/V in the ring's backward", "[diagnose]") {
  for (const bool zigzag : {false, true}) {
    INFO((zigzag ? "zigzag" : "contiguous"));
    const Case c = diagnose_cp(Mistake::StaleKeysValues, zigzag);
    CHECK(c.figures().backward.signature == BackwardSignature::StaleKeysValues);
    const TensorByShard& dq = c.figures().backward.gradients[0];
    CHECK(dq.name == kQueryGradient);
    CHECK_FALSE(dq.shards[0].beyond_rounding());  // the first block's keys are its own rank's
    CHECK(dq.any_beyond(1));
    REQUIRE(c.cause());
    CHECK_THAT(c.cause()->fix, Catch::Contains("received at that hop"));
  }
  // With the attention output alone the forward matches and nothing tells the backward.
  const Case blind = diagnose_cp(Mistake::StaleKeysValues, false, false);
  CHECK(blind.figures().signature == AttentionSignature::Matches);
  CHECK(blind.figures().backward.signature == BackwardSignature::NotSaved);
}

TEST_CASE("context parallelism: dK and dV not reduced across the ranks", "[diagnose]") {
  for (const bool zigzag : {false, true}) {
    INFO((zigzag ? "zigzag" : "contiguous"));
    const Case c = diagnose_cp(Mistake::NotReduced, zigzag);
    const BackwardFigures& b = c.figures().backward;
    CHECK(b.signature == BackwardSignature::KeysValuesNotReduced);
    CHECK_FALSE(b.gradients[0].any_beyond(0));  // dQ needs no reduction
    // The last block's keys are seen by their own rank's queries alone (causal).
    CHECK_FALSE(b.gradients[1].shards.back().beyond_rounding());
    REQUIRE(c.cause());
    CHECK_THAT(c.cause()->fix, Catch::Contains("sum dK and dV over the CP ranks"));
  }
}

TEST_CASE("context parallelism: the loss normalized per rank is a pure x cp", "[diagnose]") {
  const Case c = diagnose_cp(Mistake::LossPerRank, true);
  CHECK(c.figures().backward.signature == BackwardSignature::Scaled);
  CHECK(c.figures().backward.scale == Approx(kRanks).epsilon(1e-6));
  CHECK(loss_normalized_per_rank(c.figures()));
  REQUIRE(c.cause());
  CHECK_THAT(c.cause()->fix, Catch::Contains("token count of the whole sequence"));
}

TEST_CASE("context parallelism: positions not following the zigzag", "[diagnose]") {
  const Case c = diagnose_cp(Mistake::ContiguousPositions, true);
  CHECK(c.figures().signature == AttentionSignature::PositionsNotZigzag);
  CHECK(c.figures().zigzag);
  CHECK(c.figures().contiguous_positions);
  CHECK(c.figures().backward.signature == BackwardSignature::NotJudged);  // the forward differs
  REQUIRE(c.cause());
  CHECK_THAT(c.cause()->fix, Catch::Contains("global position under the zigzag"));
  // Positions from 0 on every rank: the tokens are the zigzag's, the rotations wrong, but
  // not as contiguous blocks' positions (chunk 5 of 8 disagrees): no fix, what to check.
  const Case shifted = diagnose_cp(Mistake::LocalPositions, true);
  CHECK(shifted.figures().signature == AttentionSignature::PositionsNotZigzag);
  CHECK_FALSE(shifted.figures().contiguous_positions);
  REQUIRE(shifted.cause());
  CHECK(shifted.cause()->fix.empty());
  CHECK_FALSE(shifted.cause()->tell_apart.empty());
  // Contiguous shards at their own positions are no zigzag at all.
  CHECK_FALSE(diagnose_cp(Mistake::None, false).figures().zigzag);
}

TEST_CASE("context parallelism: zigzag rows read in global order show the forward's signatures", "[diagnose]") {
  // Keys lost under zigzag: q and k are right (the zigzag's rows, rotated right), chunk 0
  // attends to its own rank's keys alone and is right, later chunks are not.
  const Case c = diagnose_cp(Mistake::KeysLost, true);
  CHECK(c.figures().zigzag);
  CHECK(c.figures().signature == AttentionSignature::KeysLost);
  CHECK(c.figures().output.shards.size() == size_t(2 * kRanks));
  CHECK(c.figures().backward.signature == BackwardSignature::NotJudged);
}

TEST_CASE("context parallelism: gradients whose rows do not add up are refused, naming the tensor", "[diagnose]") {
  const std::vector<float> q = random_values(80), k = random_values(81), v = random_values(82), g = random_values(83);
  const Tensors baseline = attend(q, k, v, g, 1, false, Mistake::None);
  RunFiles run = run_files(baseline, baseline, false, true);
  TensorSet cut;  // the baseline's dK without its last row
  for (const StoredTensor& tensor : run.baseline->activations.tensors) {
    StoredTensor copy = tensor;
    if (tensor.name == kKeyGradient) {
      copy.shape = {kTokens - 1, kWidth};
      copy.values.resize(size_t((kTokens - 1) * kWidth));
    }
    cut.add(copy);
  }
  run.baseline->activations = cut;
  CHECK_THROWS_WITH(attention_figures(run, kRanks, 1), Catch::Contains("attention.key.grad"));
}

TEST_CASE("context parallelism: dK and dV saved over the whole sequence, each rank's part", "[diagnose]") {
  const std::vector<float> q = random_values(90), k = random_values(91), v = random_values(92), g = random_values(93);
  const Tensors baseline = attend(q, k, v, g, 1, false, Mistake::None);
  RunFiles run = run_files(baseline, baseline, false, true);
  // Every rank's copy a share of the baseline's dK and dV (each element on one rank):
  // unlike the baseline's, and adding up to it exactly, as the queries' parts do.
  for (int r = 0; r < kRanks; ++r) {
    TensorSet kept;
    for (const StoredTensor& tensor : run.ranks[size_t(r)].activations.tensors) {
      if (tensor.name == kKeyGradient || tensor.name == kValueGradient) continue;
      kept.add(tensor);
    }
    for (const auto& [name, all] : {std::pair{kKeyGradient, &baseline.dk}, std::pair{kValueGradient, &baseline.dv}}) {
      std::vector<float> share(*all);
      for (size_t i = 0; i < share.size(); ++i) share[i] = (int(i) % kRanks == r) ? share[i] : 0.0f;
      kept.add({name, "F32", {kTokens, kWidth}, share});
    }
    run.ranks[size_t(r)].activations = kept;
  }
  const std::optional<AttentionFigures> f = attention_figures(run, kRanks, 1);
  REQUIRE(f);
  CHECK(f->backward.partials);
  CHECK(f->backward.signature == BackwardSignature::KeysValuesPartial);
  // Without grad.* nothing tells whether the step used them so: no fix, what to save.
  Settings settings;
  settings.sp = kRanks;
  settings.dp = 1;
  const Diagnosis d = diagnose::diagnose(run, settings);
  REQUIRE_FALSE(d.causes.empty());
  CHECK(d.causes.back().fix.empty());
  CHECK_THAT(d.causes.back().tell_apart, Catch::Contains("save grad.*"));
}
