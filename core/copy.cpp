#include "core/copy.h"

#include <algorithm>

#include "core/error.h"

namespace seqpar::detail {

void fill(float* data, int64_t count, float value, Device device) {
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device.is_cuda()) return fill_cuda(data, count, value, device.index);
#endif
  SEQPAR_CHECK(device.is_host(), "fill on ", device, ": this seqpar was built without CUDA");
  std::fill(data, data + count, value);
}

// CPU path: walk the index space in row-major order with an odometer over the
// dimensions, so any strides (views, broadcasts) work.
static void strided_copy_cpu(float* destination, const Shape& destination_strides,
                             const float* source, const Shape& source_strides, const Shape& shape) {
  const size_t rank = shape.size();
  const int64_t count = shape_numel(shape);
  if (rank == 0) {
    *destination = *source;
    return;
  }
  const int64_t inner = shape[rank - 1];
  const int64_t inner_destination = destination_strides[rank - 1];
  const int64_t inner_source = source_strides[rank - 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t done = 0; done < count; done += inner) {
    int64_t destination_at = 0, source_at = 0;
    for (size_t d = 0; d + 1 < rank; ++d) {
      destination_at += index[d] * destination_strides[d];
      source_at += index[d] * source_strides[d];
    }
    for (int64_t i = 0; i < inner; ++i) {
      destination[destination_at + i * inner_destination] = source[source_at + i * inner_source];
    }
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

void strided_copy(float* destination, const Shape& destination_strides, const float* source,
                  const Shape& source_strides, const Shape& shape, Device device) {
  SEQPAR_CHECK(shape.size() <= static_cast<size_t>(kMaxCopyDims), "copy of a ", shape.size(),
               "-dimensional tensor; at most ", kMaxCopyDims, " dimensions are supported");
  if (shape_numel(shape) == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (device.is_cuda()) {
    return strided_copy_cuda(destination, destination_strides, source, source_strides, shape,
                             device.index);
  }
#endif
  SEQPAR_CHECK(device.is_host(), "copy on ", device, ": this seqpar was built without CUDA");
  strided_copy_cpu(destination, destination_strides, source, source_strides, shape);
}

}  // namespace seqpar::detail
