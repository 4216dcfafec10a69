// cuRAND device generator: see device_generator.h for why it is test-only.
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/curand_check.h"
#include "core/device_generator.h"

namespace seqpar {

namespace {

enum class Distribution { Normal, Uniform };

// The generator lives for one draw: it is cheap next to the draws the tests make,
// and owning nothing between calls keeps this free of device-lifetime questions.
class DeviceGenerator {
 public:
  DeviceGenerator(uint64_t seed, uint64_t offset, int device) {
    cuda::set_device(device);
    CURAND_CHECK(curandCreateGenerator(&generator_, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    CURAND_CHECK(curandSetStream(generator_, cuda::current_stream(device)));
    CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(generator_, seed));
    CURAND_CHECK(curandSetGeneratorOffset(generator_, offset));
  }
  ~DeviceGenerator() { curandDestroyGenerator(generator_); }
  DeviceGenerator(const DeviceGenerator&) = delete;
  DeviceGenerator& operator=(const DeviceGenerator&) = delete;
  curandGenerator_t get() const { return generator_; }

 private:
  curandGenerator_t generator_ = nullptr;
};

Tensor draw(uint64_t seed, uint64_t offset, const Shape& shape, int device,
            Distribution distribution) {
  Tensor values = Tensor::empty(shape, Device::cuda(device));
  const size_t count = static_cast<size_t>(values.numel());
  if (count == 0) return values;
  DeviceGenerator generator(seed, offset, device);
  if (distribution == Distribution::Normal) {
    CURAND_CHECK(curandGenerateNormal(generator.get(), values.data(), count, 0.0f, 1.0f));
  } else {
    CURAND_CHECK(curandGenerateUniform(generator.get(), values.data(), count));
  }
  // The generator is destroyed on return: let its work finish first (test-only code,
  // so the wait costs nothing that matters).
  cuda::synchronize(device);
  return values;
}

}  // namespace

Tensor randn_on_device(uint64_t seed, uint64_t offset, const Shape& shape, int device) {
  return draw(seed, offset, shape, device, Distribution::Normal);
}

Tensor uniform_on_device(uint64_t seed, uint64_t offset, const Shape& shape, int device) {
  return draw(seed, offset, shape, device, Distribution::Uniform);
}

}  // namespace seqpar
