#include "dist/packed_digits.h"

#include <algorithm>
#include <cstring>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/exact_bins.h"

namespace seqpar::dist::detail {

using exact::kDigits;

int64_t digit_chunks(int64_t count) { return (count + kSumsPerChunk - 1) / kSumsPerChunk; }

void copy_words(int64_t* destination, Device destination_device, const int64_t* source,
                Device source_device, int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(int64_t);
  if (bytes == 0) return;
  if (destination_device.is_host() && source_device.is_host()) {
    std::memcpy(destination, source, bytes);
  } else {
    cuda::copy(destination, destination_device, source, source_device, bytes);
  }
}

void find_digit_spans(const exact::ExactSums& sums, int64_t* spans) {
  const int64_t count = sums.count();
  if (count == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (sums.device().is_cuda()) return find_digit_spans_cuda(sums.digits(), count, spans, sums.device().index);
#endif
  const int64_t* digits = sums.digits();
  for (int64_t chunk = 0; chunk < digit_chunks(count); ++chunk) {
    const int64_t begin = chunk * kSumsPerChunk, end = std::min(count, begin + kSumsPerChunk);
    int64_t first = kDigits, last = -1;
    for (int64_t word = 0; word < kDigits; ++word) {
      const int64_t* row = digits + word * count;
      if (std::any_of(row + begin, row + end, [](int64_t digit) { return digit != 0; })) {
        first = std::min(first, word);
        last = word;
      }
    }
    spans[kSpanWords * chunk] = kDigits - first;
    spans[kSpanWords * chunk + 1] = last + 1;
  }
}

PackedDigits::PackedDigits(const std::vector<int64_t>& spans, const exact::ExactSums& sums) {
  const int64_t chunks = digit_chunks(sums.count());
  SEQPAR_CHECK(static_cast<int64_t>(spans.size()) == kSpanWords * chunks,
               "PackedDigits: ", spans.size(), " span words for ", chunks, " chunks");
  table_.reserve(static_cast<size_t>(3 * chunks));
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = kDigits - spans[static_cast<size_t>(kSpanWords * chunk)];
    const int64_t end = spans[static_cast<size_t>(kSpanWords * chunk + 1)];
    // A rank's spans are in range or (0, 0); their maxima are too.
    SEQPAR_CHECK(first >= 0 && end <= kDigits, "PackedDigits: chunk ", chunk, " has the span ",
                 first, " .. ", end, " outside the ", kDigits, " words of a sum");
    const int64_t words = std::max<int64_t>(0, end - first);
    const int64_t sums_in_chunk = std::min(kSumsPerChunk, sums.count() - chunk * kSumsPerChunk);
    table_.insert(table_.end(), {first, words, words_});
    words_ += words * sums_in_chunk;
  }
  if (sums.device().is_cuda() && chunks > 0) {
    table_on_device_ = DeviceBuffer<int64_t>(static_cast<int64_t>(table_.size()), sums.device());
    table_on_device_.copy_from_host(table_.data(), static_cast<int64_t>(table_.size()));
  }
  packed_ = DeviceBuffer<int64_t>(words_, sums.device());
}

namespace {

// Calls move(digit index, packed index) for every word of every chunk's hull.
template <typename Move>
void for_each_packed_word(const std::vector<int64_t>& table, int64_t count, Move move) {
  for (size_t chunk = 0; chunk * 3 < table.size(); ++chunk) {
    const int64_t first = table[3 * chunk], words = table[3 * chunk + 1], offset = table[3 * chunk + 2];
    const int64_t begin = static_cast<int64_t>(chunk) * kSumsPerChunk;
    const int64_t sums = std::min(kSumsPerChunk, count - begin);
    for (int64_t w = 0; w < words; ++w) {
      for (int64_t j = 0; j < sums; ++j) move((first + w) * count + begin + j, offset + w * sums + j);
    }
  }
}

}  // namespace

void PackedDigits::pack(const exact::ExactSums& sums) {
  if (words_ == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (sums.device().is_cuda()) {
    return pack_digits_cuda(sums.digits(), sums.count(), table_on_device_.data(), packed_.data(),
                            sums.device().index);
  }
#endif
  const int64_t* digits = sums.digits();
  int64_t* packed = packed_.data();
  for_each_packed_word(table_, sums.count(), [&](int64_t d, int64_t p) { packed[p] = digits[d]; });
}

void PackedDigits::unpack(exact::ExactSums& sums) const {
  if (words_ == 0) return;
#ifdef SEQPAR_WITH_CUDA
  if (sums.device().is_cuda()) {
    return unpack_digits_cuda(sums.digits(), sums.count(), table_on_device_.data(), packed_.data(),
                              sums.device().index);
  }
#endif
  int64_t* digits = sums.digits();
  const int64_t* packed = packed_.data();
  for_each_packed_word(table_, sums.count(), [&](int64_t d, int64_t p) { digits[d] = packed[p]; });
}

}  // namespace seqpar::dist::detail
