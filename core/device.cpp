#include "core/device.h"

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace seqpar {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "reference") return reference();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos) {
    return cuda(std::stoi(text.substr(5)));
  }
  SEQPAR_FAIL("unknown device '", text, "' (expected cpu, reference, cuda or cuda:N)");
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::Reference: return "reference";
    case DeviceType::CUDA: break;
  }
  return "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

bool cuda_built() { return cuda::built(); }

int cuda_device_count() { return cuda::device_count(); }

}  // namespace seqpar
