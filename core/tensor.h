// Tensor: a float32 view (shape, strides, offset) into shared Storage on one device.
//
// Views share storage: narrow(), chunk() and tensor_split() never copy, so a rank's
// shard of the sequence is a window into the full batch, exactly as in PyTorch.
// contiguous(), clone() and to() copy. A default-constructed Tensor is "undefined"
// (no storage); autograd uses that for "no gradient".
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/storage.h"

namespace seqpar {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // ---- construction ----
  static Tensor empty(const Shape& shape, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, Device device = Device::cpu());
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu());
  // Row-major values; values.size() must equal the shape's element count.
  static Tensor from_data(const Shape& shape, const std::vector<float>& values,
                          Device device = Device::cpu());

  // ---- metadata ----
  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t offset() const { return offset_; }
  int64_t numel() const { return shape_numel(shape_); }
  Device device() const;
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Pointer to the first element of this view (storage + offset), on the tensor's device.
  float* data() const;

  // ---- views (share storage) ----
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // torch.chunk: pieces of ceil(size / chunks); the last may be smaller, and fewer
  // than `chunks` pieces come back when the size does not fill them all
  // (torch.chunk(range(5), 4) gives sizes 2, 2, 1: three pieces).
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  // torch.tensor_split: exactly `sections` pieces whose sizes differ by at most one,
  // the larger ones first (10 rows into 4 gives 3, 3, 2, 2).
  std::vector<Tensor> tensor_split(int64_t sections, int64_t dim = 0) const;
  // Same elements, new shape; the tensor must be contiguous.
  Tensor view(const Shape& shape) const;

  // ---- copies ----
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(Device device) const;  // itself when already there
  // In-place writes are const, as in PyTorch: a Tensor is a handle, and const
  // protects the handle (shape, strides, storage), not the values it points at.
  void copy_(const Tensor& source) const;  // same shape, any devices, any strides
  void fill_(float value) const;

  // ---- element access (for tests and printing; copies from the GPU) ----
  std::vector<float> to_vector() const;  // row-major
  float item() const;                    // a one-element tensor's value
  float at(const std::vector<int64_t>& index) const;
  void set(const std::vector<int64_t>& index, float value) const;

  // Readable print: shape, device and the values (long dimensions elided).
  std::string str() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset);
  int64_t normalize_dim(int64_t dim, const char* what) const;
  int64_t element_offset(const std::vector<int64_t>& index) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace seqpar
