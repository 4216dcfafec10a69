#include "nn/sequence_shapes.h"

#include <array>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace seqpar::nn {

namespace {

constexpr int kFields = 6;  // three_dims, B, tokens, Hq, Hkv, D
using Fields = std::array<int64_t, kFields>;

Fields fields_of(const CallShape& s) {
  return {s.three_dims ? 1 : 0, s.batch, s.tokens, s.heads, s.kv_heads, s.dim};
}
CallShape shape_of(const Fields& f) { return {f[0] != 0, f[1], f[2], f[3], f[4], f[5]}; }

std::string text(const CallShape& s) {
  std::ostringstream out;
  const auto dims = [&](int64_t heads) {
    out << "[";
    if (!s.three_dims) out << s.batch << ", ";
    out << s.tokens << ", " << heads << ", " << s.dim << "]";
  };
  out << "q ";
  dims(s.heads);
  out << ", k and v ";
  dims(s.kv_heads);
  return out.str();
}

// Every rank's fields, through one small all-to-all. Each value goes as three floats of
// 21 bits: exact, whatever its size.
std::vector<CallShape> shapes_of_ranks(const CallShape& mine, SequenceGroup& group, Device device) {
  constexpr int kWords = 3 * kFields;
  const int ranks = group.size();
  const Fields fields = fields_of(mine);
  std::vector<float> send(static_cast<size_t>(ranks) * kWords);
  for (int r = 0; r < ranks; ++r) {
    for (int n = 0; n < kFields; ++n) {
      for (int w = 0; w < 3; ++w) {
        send[static_cast<size_t>(r * kWords + 3 * n + w)] =
            static_cast<float>((fields[n] >> (21 * (2 - w))) & 0x1fffff);
      }
    }
  }
  const Tensor input = Tensor::from_data({ranks, kWords}, send, Device::cpu()).to(device);
  Tensor output = Tensor::empty(input.shape(), device);
  group.all_to_all(output, input);
  const std::vector<float> got = output.to_vector();
  std::vector<CallShape> shapes;
  for (int r = 0; r < ranks; ++r) {
    Fields f{};
    for (int n = 0; n < kFields; ++n) {
      for (int w = 0; w < 3; ++w) {
        f[n] = (f[n] << 21) | static_cast<int64_t>(got[static_cast<size_t>(r * kWords + 3 * n + w)]);
      }
    }
    shapes.push_back(shape_of(f));
  }
  return shapes;
}

}  // namespace

CallShape check_ranks_agree(const char* op, const char* degree, const Tensor& q, const Tensor& k,
                            SequenceGroup& group) {
  const bool three = q.dim() == 3;
  const int64_t first = three ? 0 : 1;  // the tokens' dim
  const CallShape mine{three, three ? 1 : q.size(0), q.size(first), q.size(first + 1), k.size(first + 1),
                       q.size(first + 2)};
  const std::vector<CallShape> shapes = shapes_of_ranks(mine, group, q.device());
  bool same = true, same_tokens = true;
  int64_t sequence = 0;
  for (const CallShape& s : shapes) {
    Fields without_tokens = fields_of(s), first_without = fields_of(shapes[0]);
    without_tokens[2] = first_without[2] = 0;
    same = same && without_tokens == first_without;
    same_tokens = same_tokens && s.tokens == shapes[0].tokens;
    sequence += s.tokens;
  }
  std::ostringstream each;
  for (size_t r = 0; r < shapes.size(); ++r) each << (r ? "; " : "") << "rank " << r << " " << text(shapes[r]);
  SEQPAR_CHECK(same, op, ": the ranks of group ", group.name(),
               " passed different batches, heads or head dims (each must pass its own tokens of the same "
               "sequences, every head): ", each.str());
  std::ostringstream tokens;
  for (size_t r = 0; r < shapes.size(); ++r) tokens << (r ? ", " : "") << "rank " << r << ": " << shapes[r].tokens;
  SEQPAR_CHECK(same_tokens, op, ": the ranks of group ", group.name(), " hold different numbers of tokens (",
               tokens.str(), "): each rank holds S/", degree, " tokens of the sequence, and S = ", sequence,
               " does not split evenly over ", degree, " = ", group.size(), "; pad the sequence to a multiple of ",
               group.size());
  return mine;
}

}  // namespace seqpar::nn
