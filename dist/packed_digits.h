// Which words of exact sums an all-reduce must carry, and the packing that carries only
// those (ProcessGroup::all_reduce_sums, dist/process_group.cpp).
//
// A sum's ten words (core/exact_bins.h: nine bins and the flags of non-finite terms)
// are mostly zero: gradients of one magnitude fill two or three neighbouring bins, and
// the flags are set only by a NaN or an infinity. So the sums are cut into chunks of
// kSumsPerChunk, and for each chunk every rank states the hull of the words it holds a
// nonzero digit in (two integers, as `kDigits - first` and `last + 1`, so that their
// maxima over the ranks are the hull of every rank's words). The ranks take those
// maxima with a small all-reduce, then add only the words inside each chunk's agreed
// hull, packed side by side, and unpack the totals into place. Every word outside a
// hull is zero on every rank, so its total is zero too: the digits end word for word as
// a full all-reduce leaves them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_buffer.h"
#include "core/exact_sums.h"
#include "seqpar/config.h"

namespace seqpar::dist::detail {

// Small enough that sums of different magnitudes side by side (a layer's dW and db) keep
// their own hulls, large enough that the hulls cost under 2 % of what they save.
constexpr int64_t kSumsPerChunk = 128;
constexpr int64_t kSpanWords = 2;  // per chunk: kDigits - first nonzero word, last + 1

int64_t digit_chunks(int64_t count);

// `count` words between any two devices; returns once they are there when the
// destination is the host, in stream order otherwise.
void copy_words(int64_t* destination, Device destination_device, const int64_t* source,
                Device source_device, int64_t count);

// This rank's hulls: kSpanWords words per chunk of `sums` into `spans`, a buffer on the
// sums' device ((0, 0) for a chunk whose words are all zero). Stream-ordered on a GPU.
void find_digit_spans(const exact::ExactSums& sums, int64_t* spans);

// Where the agreed hulls put each chunk's words in the packed buffer: per chunk its first
// word, its number of words and the offset of its block, whose word w of sum j (of the
// chunk) is at offset + w * (the chunk's sums) + j.
class PackedDigits {
 public:
  // `spans`: the agreed hulls (host copy), for `sums` of the same count on any device.
  PackedDigits(const std::vector<int64_t>& spans, const exact::ExactSums& sums);

  int64_t words() const { return words_; }  // what the all-reduce of the words carries
  int64_t* data() const { return packed_.data(); }

  // The hulls' words of `sums` into the buffer, and the buffer's back into `sums` (the
  // words outside the hulls are left as they are: zero). Stream-ordered on a GPU.
  void pack(const exact::ExactSums& sums);
  void unpack(exact::ExactSums& sums) const;

 private:
  int64_t words_ = 0;
  std::vector<int64_t> table_;   // per chunk: first word, words, offset
  DeviceBuffer<int64_t> table_on_device_;
  DeviceBuffer<int64_t> packed_;
};

#ifdef SEQPAR_WITH_CUDA
// packed_digits.cu, on the device's current stream. `table`: PackedDigits' table.
void find_digit_spans_cuda(const int64_t* digits, int64_t count, int64_t* spans, int device);
void pack_digits_cuda(const int64_t* digits, int64_t count, const int64_t* table, int64_t* packed,
                      int device);
void unpack_digits_cuda(int64_t* digits, int64_t count, const int64_t* table, const int64_t* packed,
                        int device);
#endif

}  // namespace seqpar::dist::detail
