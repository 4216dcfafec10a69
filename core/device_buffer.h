// DeviceBuffer<T>: `count` elements of a trivially copyable T on one device, owned.
//
// For device-side scratch of types other than float (Tensor holds float32): counters,
// double partial sums, tables of structs. CUDA memory comes from the same
// stream-ordered allocator as Storage (cuda::allocate / cuda::release, freed in
// stream order on the device's current stream); CPU memory is 64-byte aligned. The
// contents start uninitialized. Move-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/device.h"

namespace seqpar {

namespace detail {
void* buffer_allocate(size_t bytes, Device device);
void buffer_release(void* data, size_t bytes, Device device) noexcept;
// Stream-ordered on the device's current stream for CUDA memory.
void buffer_zero(void* data, size_t bytes, Device device);
// From host memory; returns once `data` holds the bytes (as Tensor::copy_ from the host).
void buffer_copy_from_host(void* data, Device device, const void* host, size_t bytes);
}  // namespace detail

template <typename T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "DeviceBuffer holds plain data");

 public:
  DeviceBuffer() = default;
  DeviceBuffer(int64_t count, Device device)
      : data_(static_cast<T*>(detail::buffer_allocate(static_cast<size_t>(count) * sizeof(T), device))),
        size_(count),
        device_(device) {}
  ~DeviceBuffer() { detail::buffer_release(data_, bytes(), device_); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
        device_(other.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      detail::buffer_release(data_, bytes(), device_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      device_ = other.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  int64_t size() const { return size_; }
  Device device() const { return device_; }

  // Every byte 0 (stream-ordered on a GPU).
  void zero() { detail::buffer_zero(data_, bytes(), device_); }
  // The first `count` elements from host memory.
  void copy_from_host(const T* host, int64_t count) {
    detail::buffer_copy_from_host(data_, device_, host, static_cast<size_t>(count) * sizeof(T));
  }

 private:
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }

  T* data_ = nullptr;
  int64_t size_ = 0;
  Device device_;
};

}  // namespace seqpar
