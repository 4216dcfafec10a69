// Where a tensor lives, and so which implementation of every op runs on it (each op's
// dispatch table, a switch in its own file, says which):
//   cpu        host memory; the op's fast CPU path where it has one (nn/cpu/), else its
//              plain loops; bitwise the reference's either way
//   reference  host memory; the op's plain loops (nn/reference/; the host loops of
//              nn/dropout.cpp, optim/adamw.cpp and optim/clip.cpp): they define the
//              bits, and every fast path is tested against them
//   cuda:N     one GPU's memory; the op's CUDA kernels (nn/cuda/, optim/cuda/), bitwise
//              the reference's
#pragma once

#include <ostream>
#include <string>

namespace seqpar {

enum class DeviceType { CPU, Reference, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device reference() { return {DeviceType::Reference, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  // "cpu", "reference", "cuda" or "cuda:N"; anything else is an error naming the text.
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_reference() const { return type == DeviceType::Reference; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  // The CPU and the reference: host memory, one allocator, plain memcpy between them.
  bool is_host() const { return type != DeviceType::CUDA; }
  std::string str() const;

  bool operator==(const Device& other) const {
    return type == other.type && (type != DeviceType::CUDA || index == other.index);
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

std::ostream& operator<<(std::ostream& out, const Device& device);

// True when this build compiled the CUDA backend (-DSEQPAR_CUDA=ON or auto-detected).
bool cuda_built();

// The number of usable CUDA devices. Zero, not an error, when the build has no CUDA,
// the machine has no driver, or the driver is too old for this build.
int cuda_device_count();

}  // namespace seqpar
