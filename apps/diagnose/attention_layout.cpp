#include "apps/diagnose/attention_layout.h"

#include <algorithm>

#include "apps/common/text.h"
#include "core/error.h"

namespace seqpar::diagnose {

namespace {

int64_t product(const std::vector<int64_t>& shape, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t d = from; d < to && d < shape.size(); ++d) n *= shape[d];
  return n;
}

// [outer][a][b][inner] -> [outer][b][a][inner]
std::vector<float> swap_middle(const std::vector<float>& in, int64_t outer, int64_t a, int64_t b, int64_t inner) {
  std::vector<float> out(in.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j) {
        const size_t from = size_t(((o * a + i) * b + j) * inner), to = size_t(((o * b + j) * a + i) * inner);
        std::copy(in.begin() + long(from), in.begin() + long(from + size_t(inner)), out.begin() + long(to));
      }
    }
  }
  return out;
}

// How a rank's tensor `own` relates to the baseline's `base` (the layouts users save; one
// dimension is the rank's share of the baseline's):
//   tokens first: dimension 0 is S/sp of the baseline's (seqpar-repro, DeepSpeed's
//                 [s, b, h, d], [S, H*D]); rows are read as they are;
//   batch first:  [b, S/sp, ...] of [dp*b, S, ...] (Hugging Face's [b, s, h*d]); each
//                 sequence is moved to tokens first ([S, b, ...]);
//   head-sharded: dimension k >= 1 is H/sp of the baseline's and dimension 0 whole:
//                 inside the all-to-all, each rank holds every token of H/sp heads
//                 ([S, H/sp*D], [S, H/sp, D], [s, b, H/sp, d]); the ranks' slices are put
//                 side by side in rank order.
// A 3-dimensional tensor whose dimension 1 is the share, [b, S/sp, h*d] or
// [S, H/sp, D], is either of the last two: --attention-layout says which.
struct Layout {
  AttentionLayout kind = AttentionLayout::TokensFirst;
  size_t dim = 0;  // the dimension split over the ranks
};

Layout layout_of(const std::string& who, const std::string& name, const std::vector<int64_t>& own,
                 const std::vector<int64_t>& base, int sp, int dp, std::optional<AttentionLayout> hint) {
  const std::string shapes = who + ": '" + name + "' has shape " + shape_text(own) + ", the baseline's " +
                             shape_text(base);
  SEQPAR_INPUT_CHECK(own.size() == base.size() && !own.empty(), shapes, ": the same number of dimensions is needed");
  const int64_t blocks = int64_t(sp) * dp;
  std::vector<size_t> split;  // dimensions that differ from the baseline's
  for (size_t d = 0; d < own.size(); ++d) {
    if (own[d] != base[d]) split.push_back(d);
  }
  const auto fits = [&](AttentionLayout kind) -> std::optional<Layout> {
    if (kind == AttentionLayout::TokensFirst && split.size() <= 1 && own[0] * blocks == base[0]) return Layout{kind, 0};
    // With sp 1 nothing is split but whole sequences: tokens first only.
    if (own.size() < 2 || sp == 1) return std::nullopt;
    if (kind == AttentionLayout::BatchFirst && own.size() >= 3 && own[0] * dp == base[0] && own[1] * sp == base[1]) {
      for (size_t d = 2; d < own.size(); ++d) {
        if (own[d] != base[d]) return std::nullopt;
      }
      return Layout{kind, 1};
    }
    // Head-sharded rows are the baseline's dimension 0: S per sequence, S/sp a shard.
    if (kind == AttentionLayout::HeadSharded && own[0] * dp == base[0] && base[0] % blocks == 0) {
      for (size_t d = 1; d < own.size(); ++d) {
        if (own[d] * sp != base[d]) continue;
        bool rest_equal = true;
        for (size_t e = 1; e < own.size(); ++e) rest_equal = rest_equal && (e == d || own[e] == base[e]);
        if (rest_equal) return Layout{kind, d};
      }
    }
    return std::nullopt;
  };
  std::vector<Layout> candidates;
  for (AttentionLayout kind : {AttentionLayout::TokensFirst, AttentionLayout::BatchFirst, AttentionLayout::HeadSharded}) {
    if (const std::optional<Layout> layout = fits(kind)) candidates.push_back(*layout);
  }
  SEQPAR_INPUT_CHECK(!candidates.empty(), shapes, ": a rank's share of the baseline's tensor in none of the "
                     "layouts read (sp ", sp, " x dp ", dp, "): tokens first [S/sp, ...] (DeepSpeed's [s, b, h, d]), "
                     "batch first [b, S/sp, h*d] (Hugging Face), or head-sharded inside the all-to-all [S, H/sp*D]; "
                     "save one of them (and check --sp and --dp)");
  // The hint decides only between layouts the shapes fit: the query and key may be saved
  // tokens first beside an output saved head-sharded.
  if (candidates.size() == 1) return candidates[0];
  // Only 3 dimensions split at dimension 1 fit two: [b, S/sp, h*d] and [S, H/sp, D].
  SEQPAR_INPUT_CHECK(hint, shapes, ": either batch first [b, S/sp, h*d] or head-sharded [S, H/sp, D]: give "
                     "--attention-layout batch-first or --attention-layout head-sharded");
  for (const Layout& layout : candidates) {
    if (layout.kind == *hint) return layout;
  }
  SEQPAR_INPUT_FAIL(shapes, ": either batch first [b, S/sp, h*d] or head-sharded [S, H/sp, D], not the "
                    "--attention-layout ", attention_layout_name(*hint));
}

}  // namespace

AttentionRows gathered_rows(const RunFiles& run, const std::string& name, const StoredTensor& baseline, int sp,
                            int dp, std::optional<AttentionLayout> hint) {
  AttentionRows out;
  const std::vector<int64_t>& base = baseline.shape;
  SEQPAR_INPUT_CHECK(!base.empty(), "--baseline: '", name, "' is a scalar; its first dimension must be tokens");
  const StoredTensor* first = run.ranks[0].activations.find(name);
  // One file of every rank's rows (seqpar-repro's dumps): the baseline's shape, as it is.
  if (run.ranks.size() == 1 && first && first->shape == base) {
    out = {first->values, baseline.values, base[0], product(base, 1, base.size())};
    return out;
  }
  const std::string who0 = "rank 0 (" + run.ranks[0].files[0] + ")";
  SEQPAR_INPUT_CHECK(first, who0, ": no '", name, "'");
  const Layout layout = layout_of(who0, name, first->shape, base, sp, dp, hint);
  out.layout = layout.kind;
  SEQPAR_INPUT_CHECK(int64_t(run.ranks.size()) == int64_t(sp) * dp, "'", name, "': ", run.ranks.size(),
                     " ranks' files for sp ", sp, " x dp ", dp, ": every rank's file is needed");
  for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
    const StoredTensor* own = run.ranks[rank].activations.find(name);
    const std::string who = "rank " + std::to_string(rank) + " (" + run.ranks[rank].files[0] + ")";
    SEQPAR_INPUT_CHECK(own, who, ": no '", name, "', which rank 0 has");
    SEQPAR_INPUT_CHECK(own->shape == first->shape, who, ": '", name, "' has shape ", shape_text(own->shape),
                       ", rank 0's ", shape_text(first->shape));
  }
  const std::vector<int64_t>& own = first->shape;
  if (layout.kind == AttentionLayout::TokensFirst) {
    for (const RankState& rank : run.ranks) {
      const std::vector<float>& v = rank.activations.find(name)->values;
      out.values.insert(out.values.end(), v.begin(), v.end());
    }
    out.baseline = baseline.values;
  } else if (layout.kind == AttentionLayout::BatchFirst) {
    // Each rank's [b, S/sp, inner] to [S/sp, b, inner]; stacked in rank order they are
    // the baseline's [dp, b, S, inner] moved to [dp, S, b, inner].
    const int64_t inner = product(own, 2, own.size());
    for (const RankState& rank : run.ranks) {
      const std::vector<float> moved = swap_middle(rank.activations.find(name)->values, 1, own[0], own[1], inner);
      out.values.insert(out.values.end(), moved.begin(), moved.end());
    }
    out.baseline = swap_middle(baseline.values, dp, own[0], base[1], inner);
  } else {
    // Rank w = dp_rank * sp + sp_rank holds slice sp_rank of dimension k of its
    // sequences' rows dp_rank * S0 ..: placed there, the ranks' slices are the baseline.
    const size_t k = layout.dim;
    const int64_t outer = product(own, 0, k), share = own[k], inner = product(own, k + 1, own.size());
    out.values.assign(baseline.values.size(), 0.0f);
    for (size_t rank = 0; rank < run.ranks.size(); ++rank) {
      const std::vector<float>& v = run.ranks[rank].activations.find(name)->values;
      const int64_t dp_rank = int64_t(rank) / sp, sp_rank = int64_t(rank) % sp;
      for (int64_t o = 0; o < outer; ++o) {
        const int64_t target_outer = dp_rank * outer + o;  // dimension 0 leads: dp blocks of whole sequences
        for (int64_t j = 0; j < share; ++j) {
          const size_t from = size_t((o * share + j) * inner);
          const size_t to = size_t((target_outer * share * sp + sp_rank * share + j) * inner);
          std::copy(v.begin() + long(from), v.begin() + long(from + size_t(inner)), out.values.begin() + long(to));
        }
      }
    }
    out.baseline = baseline.values;
  }
  out.width = out.layout == AttentionLayout::BatchFirst ? own[0] * product(own, 2, own.size())
                                                        : product(base, 1, base.size());
  out.rows = int64_t(out.baseline.size()) / std::max<int64_t>(out.width, 1);
  return out;
}

std::string attention_layout_name(AttentionLayout layout) {
  switch (layout) {
    case AttentionLayout::TokensFirst: return "tokens-first";
    case AttentionLayout::BatchFirst: return "batch-first";
    case AttentionLayout::HeadSharded: return "head-sharded";
  }
  return "?";
}

std::optional<AttentionLayout> parse_attention_layout(const std::string& text) {
  for (AttentionLayout layout : {AttentionLayout::TokensFirst, AttentionLayout::BatchFirst, AttentionLayout::HeadSharded}) {
    if (text == attention_layout_name(layout)) return layout;
  }
  return std::nullopt;
}

}  // namespace seqpar::diagnose
