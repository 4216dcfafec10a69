#include "apps/repro/policy.h"

#include "core/error.h"

namespace seqpar::repro {

bool uses_chunk(const Policy& policy) { return policy.kind != PolicyKind::Exact; }

std::string cannot_shard_reason(const Policy& policy, int64_t rows, int64_t sp) {
  if (!uses_chunk(policy)) return "";
  const int64_t piece = (rows + sp - 1) / sp;
  const int64_t pieces = (rows + piece - 1) / piece;
  if (pieces == sp) return "";
  return detail::concat("torch.chunk splits ", rows, " rows into ", pieces, " pieces of up to ",
                        piece, " for ", sp, " ranks: rank ", pieces,
                        " would have no rows (the report's script would fail with IndexError)");
}

Tensor shard_rows(const Policy& policy, const Tensor& batch, int64_t sp, int64_t sp_rank) {
  const std::string reason = cannot_shard_reason(policy, batch.size(0), sp);
  SEQPAR_CHECK(reason.empty(), policy.name, ": ", reason);
  const std::vector<Tensor> shards = uses_chunk(policy) ? batch.chunk(sp) : batch.tensor_split(sp);
  return shards[static_cast<size_t>(sp_rank)];
}

nn::Reduction loss_reduction(const Policy& policy, int64_t replica_rows, int64_t out_features,
                             int64_t dp) {
  if (policy.kind == PolicyKind::Exact) {
    // Each rank's share of the global batch's mean: summed over sp x dp, it is the
    // mean, with the very scale 1 / (dp * rows * out) that one rank on all rows uses.
    return nn::Reduction::sum_divided_by(dp * replica_rows * out_features);
  }
  return nn::Reduction::mean();  // the report's loss: mean over the rank's own rows
}

}  // namespace seqpar::repro
