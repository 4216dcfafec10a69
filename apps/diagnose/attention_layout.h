// The attention tensors as the ranks saved them, read back as rows of tokens in the
// baseline's order (attention_evidence.h compares those rows). The layouts users save:
// tokens first ([S/sp, ...]: seqpar-repro's, DeepSpeed's [s, b, h, d]), batch first
// ([b, S/sp, h*d]: Hugging Face's), or head-sharded inside the all-to-all ([S, H/sp*D]);
// which one is read from the shapes against the baseline's whole tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/diagnose/attention_evidence.h"
#include "apps/diagnose/inputs.h"

namespace seqpar::diagnose {

// The ranks' `name` and the baseline's, both as rows of tokens in the baseline's order
// (sequence after sequence, tokens first): what compare_by_shard reads.
struct AttentionRows {
  std::vector<float> values, baseline;
  int64_t rows = 0, width = 0;
  AttentionLayout layout = AttentionLayout::TokensFirst;
};

// Every rank's `name` stacked in rank order, and the baseline's; one file of every
// rank's rows (seqpar-repro's dumps) as it is. InputError when a rank lacks the tensor,
// the shapes differ between ranks, or fit no layout or two without `hint`.
AttentionRows gathered_rows(const RunFiles& run, const std::string& name, const StoredTensor& baseline, int sp,
                            int dp, std::optional<AttentionLayout> hint);

}  // namespace seqpar::diagnose
