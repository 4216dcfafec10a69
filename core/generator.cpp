#include "core/generator.h"

#include <curand.h>

#include "core/curand_check.h"
#include "core/error.h"

namespace seqpar {

struct Generator::Handle {
  curandGenerator_t generator = nullptr;
  ~Handle() {
    if (generator) curandDestroyGenerator(generator);
  }
};

Generator::Generator(uint64_t seed, uint64_t offset)
    : handle_(std::make_unique<Handle>()), seed_(seed), offset_(offset) {
  CURAND_CHECK(curandCreateGeneratorHost(&handle_->generator, CURAND_RNG_PSEUDO_PHILOX4_32_10));
  CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(handle_->generator, seed));
}

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

Tensor Generator::draw(const Shape& shape, Distribution distribution, Device device) {
  Tensor host = Tensor::empty(shape);
  const size_t count = static_cast<size_t>(host.numel());
  if (count > 0) {
    CURAND_CHECK(curandSetGeneratorOffset(handle_->generator, offset_));
    if (distribution == Distribution::Normal) {
      CURAND_CHECK(curandGenerateNormal(handle_->generator, host.data(), count, 0.0f, 1.0f));
    } else {
      CURAND_CHECK(curandGenerateUniform(handle_->generator, host.data(), count));
    }
    offset_ += (count + 3) / 4 * 4;
  }
  return host.to(device);
}

Tensor Generator::randn(const Shape& shape, Device device) {
  return draw(shape, Distribution::Normal, device);
}

Tensor Generator::uniform(const Shape& shape, float low, float high, Device device) {
  SEQPAR_CHECK(low < high, "uniform: low (", low, ") must be below high (", high, ")");
  Tensor values = draw(shape, Distribution::Uniform, Device::cpu());
  float* data = values.data();
  // cuRAND gives (0, 1]; an affine map keeps the interval's shape.
  for (int64_t i = 0; i < values.numel(); ++i) data[i] = low + (high - low) * data[i];
  return values.to(device);
}

}  // namespace seqpar
