#include "core/tensor.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/copy.h"
#include "core/cuda_runtime.h"
#include "core/error.h"

namespace seqpar {

int64_t shape_numel(const Shape& shape) {
  int64_t count = 1;
  for (int64_t size : shape) {
    SEQPAR_CHECK(size >= 0, "negative dimension in shape ", shape);
    SEQPAR_CHECK(!__builtin_mul_overflow(count, size, &count), "shape ", shape,
                 " has more elements than a 64-bit integer can count");
  }
  return count;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return strides;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset) {}

// ---------------------------------------------------------------- construction

Tensor Tensor::empty(const Shape& shape, Device device) {
  for (int64_t size : shape) {
    SEQPAR_CHECK(size >= 0, "negative dimension in shape ", shape);
  }
  if (device.is_cuda()) {
    SEQPAR_CHECK(device.index < cuda_device_count(), "tensor on ", device,
                 " requested but this machine has ", cuda_device_count(), " CUDA device(s)");
  }
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)), device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0);
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor tensor = empty(shape, device);
  tensor.fill_(value);
  return tensor;
}

Tensor Tensor::zeros(const Shape& shape, Device device) { return full(shape, 0.0f, device); }
Tensor Tensor::ones(const Shape& shape, Device device) { return full(shape, 1.0f, device); }

Tensor Tensor::from_data(const Shape& shape, const std::vector<float>& values, Device device) {
  SEQPAR_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_data: ",
               values.size(), " values do not fill shape ", shape);
  Tensor host = empty(shape);
  std::copy(values.begin(), values.end(), host.data());
  return host.to(device);
}

// ---------------------------------------------------------------- metadata

int64_t Tensor::normalize_dim(int64_t dim, const char* what) const {
  SEQPAR_CHECK(defined(), what, ": tensor is undefined");
  const int64_t rank = this->dim();
  SEQPAR_CHECK(dim >= -rank && dim < rank, what, ": dimension ", dim,
               " out of range for a tensor of shape ", shape_);
  return dim < 0 ? dim + rank : dim;
}

int64_t Tensor::size(int64_t dim) const { return shape_[normalize_dim(dim, "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides_[normalize_dim(dim, "stride")]; }

Device Tensor::device() const {
  SEQPAR_CHECK(defined(), "device(): tensor is undefined");
  return storage_->device();
}

float* Tensor::data() const {
  SEQPAR_CHECK(defined(), "data(): tensor is undefined");
  return storage_->data() + offset_;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

// ---------------------------------------------------------------- views

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  dim = normalize_dim(dim, "narrow");
  SEQPAR_CHECK(start >= 0 && length >= 0 && start + length <= shape_[dim], "narrow: rows [", start,
               ", ", start + length, ") out of range for dimension ", dim, " of shape ", shape_);
  Shape shape = shape_;
  shape[dim] = length;
  return Tensor(storage_, shape, strides_, offset_ + start * strides_[dim]);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  SEQPAR_CHECK(chunks > 0, "chunk: number of chunks must be positive, got ", chunks);
  dim = normalize_dim(dim, "chunk");
  const int64_t total = shape_[dim];
  const int64_t piece = std::max<int64_t>((total + chunks - 1) / chunks, 1);
  std::vector<Tensor> pieces;
  for (int64_t start = 0; start < total || (total == 0 && pieces.empty()); start += piece) {
    pieces.push_back(narrow(dim, start, std::min(piece, total - start)));
  }
  return pieces;
}

std::vector<Tensor> Tensor::tensor_split(int64_t sections, int64_t dim) const {
  SEQPAR_CHECK(sections > 0, "tensor_split: number of sections must be positive, got ", sections);
  dim = normalize_dim(dim, "tensor_split");
  const int64_t total = shape_[dim];
  const int64_t base = total / sections;
  const int64_t larger = total % sections;  // the first `larger` pieces get one extra
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t i = 0; i < sections; ++i) {
    const int64_t length = base + (i < larger ? 1 : 0);
    pieces.push_back(narrow(dim, start, length));
    start += length;
  }
  return pieces;
}

Tensor Tensor::view(const Shape& shape) const {
  SEQPAR_CHECK(is_contiguous(), "view: tensor of shape ", shape_, " with strides ", strides_,
               " is not contiguous; call contiguous() first");
  SEQPAR_CHECK(shape_numel(shape) == numel(), "view: shape ", shape, " does not match ", numel(),
               " elements of shape ", shape_);
  return Tensor(storage_, shape, contiguous_strides(shape), offset_);
}

// ---------------------------------------------------------------- copies

void Tensor::copy_(const Tensor& source) const {
  SEQPAR_CHECK(defined() && source.defined(), "copy_: undefined tensor");
  SEQPAR_CHECK(shape_ == source.shape_, "copy_: destination shape ", shape_,
               " differs from source shape ", source.shape_);
  if (numel() == 0) return;
  // The CPU and the reference share host memory: a copy between them is a host copy.
  if (device() == source.device() || (device().is_host() && source.device().is_host())) {
    detail::strided_copy(data(), strides_, source.data(), source.strides_, shape_, device());
    return;
  }
  // Across devices: move one contiguous block, then lay it out on this side.
  const Tensor packed = source.contiguous();
  const bool direct = is_contiguous();
  Tensor landing = direct ? *this : empty(shape_, device());
  cuda::copy(landing.data(), device(), packed.data(), packed.device(),
             static_cast<size_t>(numel()) * sizeof(float));
  if (!direct) copy_(landing);
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  Tensor copy = empty(shape_, device());
  copy.copy_(*this);
  return copy;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor moved = empty(shape_, device);
  moved.copy_(*this);
  return moved;
}

void Tensor::fill_(float value) const {
  SEQPAR_CHECK(defined(), "fill_: tensor is undefined");
  if (is_contiguous()) {
    detail::fill(data(), numel(), value, device());
  } else {
    copy_(full(shape_, value, device()));
  }
}

// ---------------------------------------------------------------- element access

std::vector<float> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu()).contiguous();
  return std::vector<float>(host.data(), host.data() + host.numel());
}

float Tensor::item() const {
  SEQPAR_CHECK(numel() == 1, "item: tensor of shape ", shape_, " has ", numel(),
               " elements, not one");
  return to_vector()[0];
}

int64_t Tensor::element_offset(const std::vector<int64_t>& index) const {
  SEQPAR_CHECK(static_cast<int64_t>(index.size()) == dim(), "index ", index,
               " does not match shape ", shape_);
  int64_t position = 0;
  for (int64_t d = 0; d < dim(); ++d) {
    SEQPAR_CHECK(index[d] >= 0 && index[d] < shape_[d], "index ", index, " out of range for shape ",
                 shape_);
    position += index[d] * strides_[d];
  }
  return position;
}

float Tensor::at(const std::vector<int64_t>& index) const {
  const int64_t position = element_offset(index);
  if (device().is_host()) return data()[position];
  float value = 0.0f;
  cuda::copy(&value, Device::cpu(), data() + position, device(), sizeof(float));
  return value;
}

void Tensor::set(const std::vector<int64_t>& index, float value) const {
  const int64_t position = element_offset(index);
  if (device().is_host()) {
    data()[position] = value;
  } else {
    cuda::copy(data() + position, device(), &value, Device::cpu(), sizeof(float));
  }
}

// ---------------------------------------------------------------- printing

static void print_values(std::ostringstream& out, const std::vector<float>& values,
                         const Shape& shape, size_t dim, int64_t base, int64_t indent) {
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dimension
  const int64_t size = shape[dim];
  const int64_t inner = shape_numel(Shape(shape.begin() + dim + 1, shape.end()));
  out << '[';
  for (int64_t i = 0; i < size; ++i) {
    if (size > 2 * kEdge && i == kEdge) {
      out << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = size - kEdge;
    }
    if (dim + 1 == shape.size()) {
      out << std::setw(10) << values[base + i];
    } else {
      print_values(out, values, shape, dim + 1, base + i * inner, indent + 1);
    }
    if (i + 1 < size) out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  out << ']';
}

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream out;
  out << "tensor(";
  if (dim() == 0) {
    out << to_vector()[0];
  } else if (numel() == 0) {
    out << "[]";
  } else {
    out << std::setprecision(4);
    print_values(out, to_vector(), shape_, 0, 0, 7);
  }
  out << ", shape=" << detail::concat(shape_) << ", device=" << device() << ')';
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.str(); }

}  // namespace seqpar
