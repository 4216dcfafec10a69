#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "tests/cuda_test_util.h"
#include "tests/test_util.h"

#ifdef SEQPAR_WITH_CUDA
#include <cuda_runtime.h>
#endif

using namespace seqpar;

TEST_CASE("construction fills the requested values", "[core]") {
  CHECK(Tensor::zeros({2, 3}).to_vector() == std::vector<float>(6, 0.0f));
  CHECK(Tensor::ones({4}).to_vector() == std::vector<float>(4, 1.0f));
  CHECK(Tensor::full({3, 1}, 2.5f).to_vector() == std::vector<float>(3, 2.5f));
  const Tensor t = Tensor::from_data({2, 2}, {1, 2, 3, 4});
  CHECK(t.shape() == Shape{2, 2});
  CHECK(t.strides() == Shape{2, 1});
  CHECK(t.at({1, 0}) == 3.0f);
  CHECK(t.is_contiguous());
  CHECK_FALSE(Tensor().defined());
}

TEST_CASE("narrow is a view that shares storage", "[core]") {
  Tensor t = Tensor::from_data({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor rows = t.narrow(0, 1, 2);
  CHECK(rows.shape() == Shape{2, 4});
  CHECK(rows.storage() == t.storage());
  CHECK(rows.offset() == 4);
  Tensor columns = t.narrow(1, 1, 2);  // a strided view
  CHECK_FALSE(columns.is_contiguous());
  CHECK(columns.to_vector() == std::vector<float>{1, 2, 5, 6, 9, 10});
  columns.set({2, 1}, -1.0f);
  CHECK(t.at({2, 2}) == -1.0f);
  CHECK(columns.contiguous().is_contiguous());
  CHECK(columns.contiguous().to_vector() == std::vector<float>{1, 2, 5, 6, 9, -1});
}

TEST_CASE("chunk follows torch.chunk, tensor_split follows torch.tensor_split", "[core]") {
  const Tensor t = Tensor::zeros({10, 2});
  auto sizes = [](const std::vector<Tensor>& pieces) {
    std::vector<int64_t> out;
    for (const Tensor& p : pieces) out.push_back(p.size(0));
    return out;
  };
  CHECK(sizes(t.chunk(4)) == std::vector<int64_t>{3, 3, 3, 1});
  CHECK(sizes(t.tensor_split(4)) == std::vector<int64_t>{3, 3, 2, 2});
  // torch.chunk may return fewer pieces than asked for.
  CHECK(sizes(Tensor::zeros({5}).chunk(4)) == std::vector<int64_t>{2, 2, 1});
  CHECK(sizes(Tensor::zeros({6}).chunk(4)) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes(Tensor::zeros({2}).tensor_split(3)) == std::vector<int64_t>{1, 1, 0});
  CHECK(sizes(Tensor::zeros({12000, 1}).chunk(4)) == std::vector<int64_t>{3000, 3000, 3000, 3000});
  // The pieces tile the original exactly, in order.
  Generator generator(7);
  const Tensor x = generator.randn({11, 3});
  std::vector<float> joined;
  for (const Tensor& piece : x.tensor_split(3)) {
    const auto values = piece.to_vector();
    joined.insert(joined.end(), values.begin(), values.end());
  }
  CHECK(joined == x.to_vector());
}

TEST_CASE("copy_ and clone copy across strides", "[core]") {
  Generator generator(3);
  const Tensor source = generator.randn({5, 7});
  const Tensor view = source.narrow(1, 2, 4);
  Tensor destination = Tensor::zeros({5, 4});
  destination.copy_(view);
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 4; ++j) CHECK(destination.at({i, j}) == source.at({i, j + 2}));
  }
  Tensor copy = source.clone();
  CHECK(copy.storage() != source.storage());
  CHECK(copy.to_vector() == source.to_vector());
}

TEST_CASE("print shows shape, device and values", "[core]") {
  const std::string text = Tensor::from_data({2, 2}, {1, 2, 3, 4}).str();
  CHECK_THAT(text, Catch::Contains("shape=[2, 2]"));
  CHECK_THAT(text, Catch::Contains("device=cpu"));
  CHECK_THAT(text, Catch::Contains("4"));
  const std::string long_text = Tensor::zeros({100}).str();
  CHECK_THAT(long_text, Catch::Contains("..."));
}

TEST_CASE("bad arguments throw errors that name the values", "[core][errors]") {
  const Tensor t = Tensor::zeros({3, 4});
  CHECK_THROWS_WITH(t.narrow(0, 2, 2), Catch::Contains("out of range") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(t.narrow(2, 0, 1), Catch::Contains("dimension 2"));
  CHECK_THROWS_WITH(t.chunk(0), Catch::Contains("positive"));
  CHECK_THROWS_WITH(Tensor::from_data({2, 2}, {1, 2, 3}), Catch::Contains("3 values"));
  CHECK_THROWS_WITH(t.narrow(1, 1, 2).view({6}), Catch::Contains("not contiguous"));
  CHECK_THROWS_WITH(Tensor::zeros({-1}), Catch::Contains("negative"));
  Tensor destination = Tensor::zeros({4, 3});
  CHECK_THROWS_WITH(destination.copy_(t), Catch::Contains("[4, 3]") && Catch::Contains("[3, 4]"));
  CHECK_THROWS_WITH(t.item(), Catch::Contains("12 elements"));
  // The message carries the file:line of the check, relative to the project.
  CHECK_THROWS_WITH(t.narrow(0, 9, 1), Catch::StartsWith("seqpar error at core/tensor.cpp:"));
  CHECK_THROWS_AS(t.narrow(0, 9, 1), seqpar::Error);
}

TEST_CASE("zero CUDA devices is a normal state", "[core]") {
  const int devices = cuda_device_count();
  CHECK(devices >= 0);
  if (devices == 0) {
    CHECK_THROWS_WITH(Tensor::zeros({2}, Device::cuda(0)), Catch::Contains("0 CUDA device(s)"));
  }
  CHECK(Device::parse("cuda:1") == Device::cuda(1));
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK_THROWS_WITH(Device::parse("gpu"), Catch::Contains("'gpu'"));
}

TEST_CASE("fill_ on a GPU writes the value's bits (a memset of its 32 bits)", "[core][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  const auto from_bits = [](uint32_t bits) {
    float value = 0.0f;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  };
  // +0 (a byte memset), -0, a normal, a subnormal, infinity, NaNs with payloads and signs.
  const float values[] = {0.0f,       -0.0f, 1.5f, -3.25e-41f, std::numeric_limits<float>::infinity(),
                          from_bits(0x7fc01234u), from_bits(0xffa00001u)};
  for (const float value : values) {
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    INFO("value bits 0x" << std::hex << bits);
    // A view in the middle of a poisoned buffer: the fill must stop at its ends.
    const Tensor buffer = test::poisoned({1003}, Device::cuda());
    buffer.narrow(0, 1, 1001).fill_(value);
    Tensor expected = test::poisoned({1003}, Device::cpu());
    expected.narrow(0, 1, 1001).fill_(value);
    CHECK(test::bitwise_equal(buffer.to(Device::cpu()), expected));
  }
}

TEST_CASE("the block cache hands a freed block to the next allocation of its size, never one block "
          "to two owners, and keeps no large block",
          "[core][cuda]") {
  SEQPAR_REQUIRE_CUDA();
  cuda::release_cached(0);
  REQUIRE(cuda::cached_bytes(0) == 0);
  void* first = cuda::allocate(1000, 0);
  cuda::release(first, 1000, 0);
  CHECK(cuda::cached_bytes(0) == 1024);  // rounded up to 512 bytes
  void* again = cuda::allocate(1000, 0);
  CHECK(again == first);
  CHECK(cuda::cached_bytes(0) == 0);
  void* second = cuda::allocate(1000, 0);  // `again` is still owned
  CHECK(second != again);
  void* other = cuda::allocate(5000, 0);  // another size: not from the 1000-byte blocks
  CHECK(other != again);
  CHECK(other != second);
  cuda::release(second, 1000, 0);
  cuda::release(other, 5000, 0);
  cuda::release(again, 1000, 0);
  CHECK(cuda::cached_bytes(0) == 2 * 1024 + 5120);
  const size_t large = size_t{32} << 20;  // past the largest cached block: back to the pool
  cuda::release(cuda::allocate(large, 0), large, 0);
  CHECK(cuda::cached_bytes(0) == 2 * 1024 + 5120);
  cuda::release_cached(0);
  CHECK(cuda::cached_bytes(0) == 0);

  // A tensor's block reused at once by the next tensor of its size: the stream orders
  // the old owner's kernels before the new owner's.
  const Tensor expected = Tensor::full({300000}, 2.0f, Device::cpu());
  for (int round = 0; round < 3; ++round) {
    const float* before = nullptr;
    {
      const Tensor a = Tensor::full({300000}, 1.0f, Device::cuda());
      before = a.data();
    }
    const Tensor b = Tensor::full({300000}, 2.0f, Device::cuda());
    CHECK(b.data() == before);
    CHECK(test::bitwise_equal(b.to(Device::cpu()), expected));
  }
}

TEST_CASE("the block cache stays out of a stream capture: the graph's blocks come from the pool "
          "and go back to it",
          "[core][cuda]") {
  SEQPAR_REQUIRE_CUDA();
#ifdef SEQPAR_WITH_CUDA
  cuda::release_cached(0);
  cuda::set_device(0);
  void* cached = cuda::allocate(4096, 0);
  cuda::release(cached, 4096, 0);
  REQUIRE(cuda::cached_bytes(0) == 4096);
  cudaStream_t stream = cuda::current_stream(0);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  void* in_graph = cuda::allocate(4096, 0);  // a graph allocation, not the cached block
  const bool distinct = in_graph != cached;
  cuda::release(in_graph, 4096, 0);         // a free node of the graph, not the cache
  const size_t cached_during = cuda::cached_bytes(0);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(cudaGraphDestroy(graph) == cudaSuccess);
  CHECK(distinct);
  CHECK(cached_during == 4096);
  cuda::release_cached(0);
#endif
}
