// The safetensors writer, read back byte by byte in the test (the PyTorch cross-check
// reads the app's dumps independently in CI as well).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/generator.h"
#include "apps/common/safetensors.h"

using namespace seqpar;

TEST_CASE("safetensors: header, offsets and data", "[core][safetensors]") {
  Generator generator(11);
  const Tensor a = generator.randn({3, 5});
  const Tensor b = generator.randn({7}).narrow(0, 2, 4);  // a view: written row-major
  const std::string path = "/tmp/seqpar_safetensors_test.safetensors";
  save_safetensors(path, {{"a", a}, {"grad.b", b}}, {{"note", "x\"y"}});

  std::ifstream file(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[i]);
  REQUIRE(8 + length + (15 + 4) * 4 == bytes.size());
  CHECK(length % 8 == 0);
  const std::string header = bytes.substr(8, length);
  CHECK_THAT(header, Catch::Contains(R"("a":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]})"));
  CHECK_THAT(header, Catch::Contains(R"("grad.b":{"dtype":"F32","shape":[4],"data_offsets":[60,76]})"));
  CHECK_THAT(header, Catch::Contains(R"("__metadata__":{"note":"x\"y"})"));
  std::vector<float> data(19);
  std::memcpy(data.data(), bytes.data() + 8 + length, 19 * sizeof(float));
  const auto expected_a = a.to_vector(), expected_b = b.to_vector();
  CHECK(std::vector<float>(data.begin(), data.begin() + 15) == expected_a);
  CHECK(std::vector<float>(data.begin() + 15, data.end()) == expected_b);
  CHECK_THROWS_WITH(save_safetensors("/nonexistent/dir/x.safetensors", {{"a", a}}),
                    Catch::Contains("No such file or directory"));
}
