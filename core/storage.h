// A flat block of float32 elements on one device, shared by every tensor that
// views it (a narrow() or chunk() of a tensor shares its parent's storage).
#pragma once

#include <cstddef>

#include "core/device.h"

namespace seqpar {

class Storage {
 public:
  Storage(size_t elements, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  float* data() const { return data_; }
  size_t elements() const { return elements_; }
  Device device() const { return device_; }

 private:
  float* data_ = nullptr;
  size_t elements_ = 0;
  Device device_;
};

}  // namespace seqpar
