#include "dist/all_to_all.h"

#include "core/error.h"

namespace seqpar::dist {

void check_all_to_all_arguments(const std::string& what, const Tensor& output,
                                const Tensor& input, int group_size) {
  SEQPAR_CHECK(input.defined() && output.defined(), what, ": undefined tensor");
  SEQPAR_CHECK(input.dim() >= 1, what, ": the input must have at least one dimension");
  SEQPAR_CHECK(output.shape() == input.shape() && output.device() == input.device(), what,
               ": output ", output.shape(), " on ", output.device(), " should be the input's ",
               input.shape(), " on ", input.device());
  SEQPAR_CHECK(input.size(0) % group_size == 0, what, ": the first dimension (", input.size(0),
               ") must split into ", group_size,
               " equal chunks, one per rank; uneven splits are not supported");
}

}  // namespace seqpar::dist
