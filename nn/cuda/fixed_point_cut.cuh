// x in a column's fixed-point window (nn/one_magnitude.h), cut into the one-magnitude
// dW kernel's tensor-core operands (one_magnitude_dw_few_outputs.cuh) with float additions alone:
// v = x / 2^lsb, |v| < 2^44, as two 23-bit fields, each three bytes, so that
// v = 2^23 (F_H - 2^22) + F_L; and the byte planes that lay four rows' fields out as an
// m16n8k32 B fragment.
#pragma once

namespace seqpar::nn::detail {

constexpr int kFieldBits = 23;
constexpr int kLimbs = 3;  // bytes of each of an element's two 23-bit fields

// A column's window as the floats that cut its elements into fields, in float
// arithmetic alone (the FP32 pipe: no conversion to double, no integer shifts):
//   high = 1.5 * 2^(46 + lsb): h = x + high, rounded toward zero, is high + 2^(23+lsb) H
//          (its unit in the last place is 2^(23+lsb), and every |x| below 2^(44+lsb)
//          keeps it in [1.25, 1.75) 2^(46+lsb), one binade), so its 23 fraction bits
//          are F_H = 2^22 + H;
//   low  = 2^(23 + lsb): l = x - 2^(23+lsb) H + low = 2^lsb L + low has fraction bits
//          F_L = L ([1, 2) 2^(23+lsb), one binade again). It is worked out as x + c,
//          c = (high + low) - h = 2^(23+lsb) (1 - H), both steps exact, and it is
//          exact itself when x is a multiple of 2^lsb;
//   and whether it was: l - c is x rounded to a multiple of 2^lsb (exactly), so
//   x - (l - c) is 0 exactly when x is held. NaN and infinities give NaN there.
// The column's lsb is raised to -149 at least (a wider window: the exact sums' grid is
// still below it, and every float is a multiple of it), and a column whose high would
// overflow (its largest |x| at least 2^125) has no window.
struct Cut {
  float high, high_and_low, low;
};

__device__ inline float power_of_two(int exponent) {  // a normal float: -126 <= exponent <= 127
  return __uint_as_float(static_cast<unsigned>(exponent + 127) << 23);
}

__device__ inline Cut cut_of(int lsb) {
  const float high = 1.5f * power_of_two(46 + lsb), low = power_of_two(kFieldBits + lsb);
  return {high, high + low, low};
}

// x's two fields in the fraction bits of `high` and `low` (with the exponent's lowest bit
// above them, masked off later), and x minus x rounded to the window's unit: 0 when x is
// held, else (x outside the window, not finite) nonzero or NaN, and the fields are not
// x's: the caller then puts in the neutral ones, F_H = 2^22 and F_L = 0, which are what
// x = 0 gives.
__device__ inline float cut_fields(float x, const Cut& cut, unsigned& high, unsigned& low) {
  const float h = __fadd_rz(x, cut.high);
  const float c = __fsub_rn(cut.high_and_low, h);
  const float l = __fadd_rn(x, c);
  high = __float_as_uint(h);
  low = __float_as_uint(l);
  return __fsub_rn(x, __fsub_rn(l, c));
}

// The three byte planes of four fields w[first..first+3]: planes[l] holds byte l of
// each, low to high, byte 2 without the exponent bit above the 23-bit field.
__device__ inline void field_planes(const unsigned (&w)[8], int first, unsigned (&planes)[kLimbs]) {
  // __byte_perm(x, y, s): byte n of the result is byte (s >> 4n) & 7 of the pair (x, y).
  const unsigned low01 = __byte_perm(w[first], w[first + 1], 0x5140);   // b0 b0' b1 b1'
  const unsigned low23 = __byte_perm(w[first + 2], w[first + 3], 0x5140);
  const unsigned high01 = __byte_perm(w[first], w[first + 1], 0x0062);  // b2 b2'
  const unsigned high23 = __byte_perm(w[first + 2], w[first + 3], 0x0062);
  planes[0] = __byte_perm(low01, low23, 0x5410);
  planes[1] = __byte_perm(low01, low23, 0x7632);
  planes[2] = __byte_perm(high01, high23, 0x5410) & 0x7f7f7f7fu;
}

}  // namespace seqpar::nn::detail
