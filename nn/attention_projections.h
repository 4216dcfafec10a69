// The part of a transformer attention block that is the same however the attention is
// spread over ranks: q, k and v projected from the block's rows, RoPE on q and k at the
// rows' positions, the attention itself, and the output projection. UlyssesBlock and
// LongContextBlock each own one and differ only in the attention they call and in the
// positions they give RoPE.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/generator.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace seqpar::nn {

struct AttentionHeads {
  int64_t model_dim = 0;  // d_model
  int64_t heads = 0;      // Hq
  int64_t kv_heads = 0;   // Hkv dividing Hq; 0: Hq
  int64_t head_dim = 0;   // D, even (RoPE rotates pairs)
};

class AttentionProjections {
 public:
  // Checks `heads` (errors name `block`), resolves kv_heads 0 to Hq, and creates the
  // query, key, value and output projections in that order from `generator`.
  AttentionProjections(const char* block, const AttentionHeads& heads, Generator& generator, Device device);

  // The four projections under the names the owning block registers them by, in order.
  std::vector<std::pair<const char*, std::shared_ptr<Module>>> modules() const {
    return {{"query", query_}, {"key", key_}, {"value", value_}, {"output", output_}};
  }

  // q [.., rows, Hq, D], k and v [.., rows, Hkv, D] to the attention [.., rows, Hq · D].
  using Attend = std::function<autograd::Variable(const autograd::Variable& q, const autograd::Variable& k,
                                                  const autograd::Variable& v)>;

  // x [B, rows, d_model] or [rows, d_model] to the block's output of the same shape. The
  // projections see every row of the batch at once; `attend` sees sequences. RoPE puts
  // row i of every sequence at positions[i]. `attention`, when given, receives the
  // attention's output as the output projection takes it ([B, rows, Hq * D], or 2-D for
  // a 2-D x).
  autograd::Variable forward(const autograd::Variable& x, const std::function<std::vector<int64_t>(int64_t rows)>& positions,
                             float rope_base, const Attend& attend, autograd::Variable* attention = nullptr) const;

  const AttentionHeads& heads() const { return heads_; }

 private:
  const char* block_;
  AttentionHeads heads_;
  std::shared_ptr<Linear> query_, key_, value_, output_;
};

}  // namespace seqpar::nn
