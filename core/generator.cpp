#include "core/generator.h"

#include "core/error.h"
#include "core/philox.h"

namespace seqpar {

Generator::Generator(uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {}

Tensor Generator::draw(const Shape& shape, Distribution distribution, Device device) {
  Tensor host = Tensor::empty(shape);
  const uint64_t count = static_cast<uint64_t>(host.numel());
  float* values = host.data();
  philox::HostStream stream(seed_);
  if (distribution == Distribution::Normal && offset_ % 4 == 0) {
    // Whole Philox blocks, two Box-Muller pairs each (the draws' usual alignment).
    for (uint64_t i = 0; i < count; i += 4) {
      const philox::Block bits = stream.block(offset_ / 4 + i / 4);
      const auto first = philox::normal_pair(bits[0], bits[1]);
      const auto second = philox::normal_pair(bits[2], bits[3]);
      const float four[4] = {first[0], first[1], second[0], second[1]};
      for (uint64_t j = 0; j < 4 && i + j < count; ++j) values[i + j] = four[j];
    }
  } else if (distribution == Distribution::Normal) {
    // Pairs from consecutive positions; an odd count keeps the first of the last pair.
    for (uint64_t i = 0; i < count; i += 2) {
      const auto pair = philox::normal_pair(stream.at(offset_ + i), stream.at(offset_ + i + 1));
      values[i] = pair[0];
      if (i + 1 < count) values[i + 1] = pair[1];
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) values[i] = philox::uniform(stream.at(offset_ + i));
  }
  offset_ += (count + 3) / 4 * 4;
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
