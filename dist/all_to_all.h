// The all-to-all's contract, shared by every ProcessGroup (ProcessGroup::all_to_all).
//
// Equal splits only, as torch.distributed.all_to_all_single without split sizes: the
// input's first dimension holds size() chunks of equal length, chunk j goes to rank j,
// and the chunk that rank i sent here lands in chunk i of the output:
//
//   output[rank r] chunk i  =  input[rank i] chunk r
//
// Bytes move unchanged (no arithmetic), so any placement gives the same bits. The
// exchange is its own inverse: applied twice, every chunk is back where it started.
//
// Uneven splits (all_to_all_single with split sizes) are not supported. Their one use
// here would be Ulysses attention with heads that the sequence-parallel size does not
// divide, and that layer refuses those instead (nn/ulysses_attention.h says why).
#pragma once

#include <string>

#include "core/tensor.h"

namespace seqpar::dist {

// Checks one rank's all_to_all arguments before any exchange: both defined, at least
// one dimension, the same shape and device, and a first dimension that `group_size`
// divides. `what` ("all_to_all on group sp[0-3]") opens the message. Every rank must
// pass the same shape; the groups check that across ranks where they can.
void check_all_to_all_arguments(const std::string& what, const Tensor& output,
                                const Tensor& input, int group_size);

}  // namespace seqpar::dist
