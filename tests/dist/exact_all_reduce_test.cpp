// The exact all-reduce carries only the words some rank needs (dist/packed_digits.h):
// its digits must equal, word for word, every rank's digits added in full (by the plain
// all-reduce, ProcessGroup::all_reduce_sums_plain, and on the host), whatever the
// magnitudes; and on the gradients it must carry at least 3x fewer bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/variable.h"
#include "core/exact_bins.h"
#include "core/generator.h"
#include "dist/local_process_group.h"
#include "dist/packed_digits.h"
#include "nn/exact_gradients.h"
#include "nn/l1_loss.h"
#include "nn/linear.h"
#include "tests/dist/digit_cases.h"
#include "tests/dist/dist_test_util.h"

using namespace seqpar;
using test::Magnitudes;

namespace {

uint64_t case_seed(uint64_t base) {
  return base + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(Catch::rngSeed());
}

// Each rank's all_reduce_sums result (host words) and its traffic.
struct RankResults {
  std::vector<std::vector<int64_t>> digits;
  std::vector<dist::ProcessGroup::DigitTraffic> traffic;
};

RankResults all_reduce_on_threads(uint64_t seed, int world_size, int64_t count, Magnitudes m,
                                  Device device) {
  RankResults results{std::vector<std::vector<int64_t>>(static_cast<size_t>(world_size)),
                      std::vector<dist::ProcessGroup::DigitTraffic>(static_cast<size_t>(world_size))};
  dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
    exact::ExactSums sums = test::copy_to(test::random_sums(seed, world->rank(), count, m), device);
    world->all_reduce_sums(sums);
    results.digits[static_cast<size_t>(world->rank())] = sums.to_host();
    results.traffic[static_cast<size_t>(world->rank())] = world->digit_traffic();
  });
  return results;
}

// The words that must travel, counted from the full result's inputs: per chunk, the
// hull of the words any rank holds a nonzero digit in, times the chunk's sums.
int64_t hull_words(uint64_t seed, int world_size, int64_t count, Magnitudes m) {
  std::vector<std::vector<int64_t>> ranks;
  for (int rank = 0; rank < world_size; ++rank) ranks.push_back(test::random_sums(seed, rank, count, m).to_host());
  int64_t words = 0;
  for (int64_t begin = 0; begin < count; begin += dist::detail::kSumsPerChunk) {
    const int64_t end = std::min(count, begin + dist::detail::kSumsPerChunk);
    int first = exact::kDigits, last = -1;
    for (const auto& digits : ranks) {
      for (int word = 0; word < exact::kDigits; ++word) {
        for (int64_t i = begin; i < end; ++i) {
          if (digits[static_cast<size_t>(word * count + i)] != 0) {
            first = std::min(first, word);
            last = std::max(last, word);
          }
        }
      }
    }
    if (last >= 0) words += (last - first + 1) * (end - begin);
  }
  return words;
}

// Every rank's result against every rank's sums added in full, and its traffic against
// the hulls counted here.
void check_packed_all_reduce(Device device) {
  for (int world_size : {2, 3, 4}) {
    for (Magnitudes m : test::all_magnitudes()) {
      for (int64_t count : {1, 127, 128, 129, 700}) {
        const uint64_t seed = case_seed(static_cast<uint64_t>(world_size * 1000 + count + 17 * static_cast<int>(m)));
        INFO(world_size << " ranks, " << test::magnitudes_name(m) << ", " << count << " sums");
        const std::vector<int64_t> expected = test::full_all_reduce(seed, world_size, count, m);
        const RankResults results = all_reduce_on_threads(seed, world_size, count, m, device);
        const int64_t spans = dist::detail::kSpanWords * dist::detail::digit_chunks(count);
        const int64_t packed = hull_words(seed, world_size, count, m);
        for (int rank = 0; rank < world_size; ++rank) {
          INFO("rank " << rank);
          CHECK(results.digits[static_cast<size_t>(rank)] == expected);
          const auto& traffic = results.traffic[static_cast<size_t>(rank)];
          CHECK(traffic.calls == 1);
          CHECK(traffic.digit_words == exact::kDigits * count);
          CHECK(traffic.sent_words == spans + packed);
        }
      }
    }
  }
}

// Every rank's packed result against its plain result (ProcessGroup::all_reduce_sums_plain,
// every word added) on the same sums, and the plain result against the ranks' sums added
// here on the host; the plain all-reduce's traffic is every word.
void check_packed_against_plain(Device device) {
  for (int world_size : {2, 3}) {
    for (Magnitudes m : test::all_magnitudes()) {
      for (int64_t count : {1, 128, 300}) {
        const uint64_t seed = case_seed(static_cast<uint64_t>(world_size * 7000 + count + 31 * static_cast<int>(m)));
        INFO(world_size << " ranks, " << test::magnitudes_name(m) << ", " << count << " sums");
        std::vector<std::vector<int64_t>> packed(static_cast<size_t>(world_size));
        std::vector<std::vector<int64_t>> plain(static_cast<size_t>(world_size));
        std::vector<dist::ProcessGroup::DigitTraffic> plain_traffic(static_cast<size_t>(world_size));
        dist::run_local_world(world_size, [&](std::shared_ptr<dist::ProcessGroup> world) {
          const auto r = static_cast<size_t>(world->rank());
          exact::ExactSums sums = test::copy_to(test::random_sums(seed, world->rank(), count, m), device);
          exact::ExactSums same = test::copy_to(sums, device);
          world->all_reduce_sums_plain(same);
          plain_traffic[r] = world->digit_traffic();
          world->all_reduce_sums(sums);
          plain[r] = same.to_host();
          packed[r] = sums.to_host();
        });
        const std::vector<int64_t> expected = test::full_all_reduce(seed, world_size, count, m);
        for (int rank = 0; rank < world_size; ++rank) {
          INFO("rank " << rank);
          CHECK(plain[static_cast<size_t>(rank)] == expected);
          CHECK(packed[static_cast<size_t>(rank)] == plain[static_cast<size_t>(rank)]);
          CHECK(plain_traffic[static_cast<size_t>(rank)].sent_words == exact::kDigits * count);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("the packed exact all-reduce leaves the plain one's digits, word for word", "[dist][cpu]") {
  check_packed_against_plain(Device::cpu());
}

TEST_CASE("the packed exact all-reduce on one GPU leaves the plain one's digits", "[dist][cuda]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  check_packed_against_plain(Device::cuda(0));
}

TEST_CASE("the packed exact all-reduce leaves the full all-reduce's digits, word for word, over "
          "2 to 4 ranks and every magnitude",
          "[dist][cpu]") {
  check_packed_all_reduce(Device::cpu());
}

TEST_CASE("the packed exact all-reduce on one GPU leaves the full all-reduce's digits", "[dist][cuda]") {
  if (cuda_device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  check_packed_all_reduce(Device::cuda(0));
}

TEST_CASE("the packed exact all-reduce rounds to the full all-reduce's floats, NaN and infinities "
          "included",
          "[dist][cpu]") {
  const int64_t count = 300;
  for (Magnitudes m : {Magnitudes::NonFinite, Magnitudes::Huge, Magnitudes::EachSumItsOwn}) {
    const uint64_t seed = case_seed(91 + static_cast<uint64_t>(m));
    exact::ExactSums full(count, Device::cpu());
    for (int rank = 0; rank < 3; ++rank) full.add(test::random_sums(seed, rank, count, m));
    Tensor expected = Tensor::empty({count});
    full.round_into(expected);
    std::vector<std::vector<float>> rounded(3);
    dist::run_local_world(3, [&](std::shared_ptr<dist::ProcessGroup> world) {
      exact::ExactSums sums = test::random_sums(seed, world->rank(), count, m);
      world->all_reduce_sums(sums);
      Tensor out = Tensor::empty({count});
      sums.round_into(out);
      rounded[static_cast<size_t>(world->rank())] = out.to_vector();
    });
    const std::vector<float> want = expected.to_vector();
    const bool has_nan = std::any_of(want.begin(), want.end(), [](float v) { return std::isnan(v); });
    if (m == Magnitudes::NonFinite) CHECK(has_nan);  // the case covers what it claims
    for (const auto& got : rounded) CHECK(test::same_bits(got, want));
  }
}

TEST_CASE("an all-zero exact all-reduce sends only the hulls", "[dist][cpu]") {
  // The ranks only record; Catch's checks run on this thread (they are not thread-safe).
  std::vector<int64_t> sent(2);
  std::vector<std::vector<int64_t>> digits(2);
  dist::run_local_world(2, [&](std::shared_ptr<dist::ProcessGroup> world) {
    exact::ExactSums sums(1000, Device::cpu());
    world->all_reduce_sums(sums);
    const size_t rank = static_cast<size_t>(world->rank());
    sent[rank] = world->digit_traffic().sent_words;
    digits[rank] = sums.to_host();
  });
  for (size_t rank = 0; rank < 2; ++rank) {
    CHECK(sent[rank] == dist::detail::kSpanWords * dist::detail::digit_chunks(1000));
    CHECK(std::all_of(digits[rank].begin(), digits[rank].end(), [](int64_t d) { return d == 0; }));
  }
}

// The step on 2 ranks: Linear(640, 16) from Generator(12345), x = randn(12000,
// 640), each rank its half of the rows, an L1 loss against x's first 16 columns as the
// share of the global mean. Each rank's dW and db digits (10256 sums, 820 KB in full).
TEST_CASE("on the issue's gradients over 2 ranks the exact all-reduce carries 3x fewer bytes, "
          "with the full all-reduce's digits",
          "[dist][cpu]") {
  constexpr int kRanks = 2;
  constexpr int64_t kRows = 12000, kIn = 640, kOut = 16;
  Generator generator(12345);
  const nn::Linear model(kIn, kOut, generator, Device::cpu());
  const Tensor x = generator.randn({kRows, kIn});
  const std::vector<Tensor> shards = x.tensor_split(kRanks);
  std::vector<exact::ExactSums> rank_sums;
  for (const Tensor& shard : shards) {
    nn::ExactGradients gradients;
    {
      const nn::ExactGradients::Recording recording(gradients);
      const autograd::Variable rows(shard), target(shard.narrow(1, 0, kOut));
      nn::l1_loss(model.forward(rows), target, nn::Reduction::sum_divided_by(kRows * kOut)).backward();
    }
    REQUIRE(gradients.sums().size() == 1);
    exact::ExactSums copy(gradients.sums()[0]->count(), Device::cpu());
    copy.copy_from(*gradients.sums()[0]);
    rank_sums.push_back(std::move(copy));
  }
  exact::ExactSums full(kOut * kIn + kOut, Device::cpu());
  for (const exact::ExactSums& sums : rank_sums) full.add(sums);

  std::vector<dist::ProcessGroup::DigitTraffic> traffic(kRanks);
  std::vector<std::vector<int64_t>> digits(kRanks);
  dist::run_local_world(kRanks, [&](std::shared_ptr<dist::ProcessGroup> world) {
    const size_t rank = static_cast<size_t>(world->rank());
    exact::ExactSums sums(rank_sums[rank].count(), Device::cpu());
    sums.copy_from(rank_sums[rank]);
    world->all_reduce_sums(sums);
    digits[rank] = sums.to_host();
    traffic[rank] = world->digit_traffic();
  });
  for (size_t rank = 0; rank < kRanks; ++rank) {
    CHECK(digits[rank] == full.to_host());
    const double full_bytes = 8.0 * static_cast<double>(traffic[rank].digit_words);
    const double sent_bytes = 8.0 * static_cast<double>(traffic[rank].sent_words);
    INFO("rank " << rank << ": " << sent_bytes / 1000 << " KB sent of " << full_bytes / 1000
                 << " KB (" << full_bytes / sent_bytes << "x fewer)");
    CHECK(full_bytes == 8.0 * exact::kDigits * (kOut * kIn + kOut));
    CHECK(full_bytes >= 3.0 * sent_bytes);
  }
}
