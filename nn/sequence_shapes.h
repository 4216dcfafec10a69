// What the sequence-parallel layers (Ulysses, context parallelism) check at their entry:
// that every rank of the group passed the same batch, heads and head dim, and its equal
// share of the tokens. A mismatch would otherwise surface inside an exchange, in the
// exchange's internal shapes; here it is refused on every rank, naming what each rank
// passed, or S and the group's size.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "nn/sequence_group.h"

namespace seqpar::nn {

// A rank's call: q [B, tokens, Hq, D] (or [tokens, Hq, D] when three_dims), k and v
// [.., Hkv, D].
struct CallShape {
  bool three_dims;
  int64_t batch, tokens, heads, kv_heads, dim;
};

// Exchanges every rank's CallShape (one small all-to-all) and refuses disagreement, as
// above; `op` opens the messages, `degree` names the group's size ("sp", "cp"). Returns
// this rank's. Collective.
CallShape check_ranks_agree(const char* op, const char* degree, const Tensor& q, const Tensor& k,
                            SequenceGroup& group);

}  // namespace seqpar::nn
