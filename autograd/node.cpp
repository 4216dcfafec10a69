#include "autograd/node.h"

#include "core/error.h"

namespace seqpar::autograd {

void Node::add_input(const Variable& input) {
  SEQPAR_CHECK(input.defined(), name(), ": input ", next_edges_.size(), " is undefined");
  next_edges_.push_back(input.gradient_edge());
  input_metadata_.push_back(InputMetadata{input.shape(), input.device()});
}

}  // namespace seqpar::autograd
