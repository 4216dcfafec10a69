// The project's exp: binary32 exp correctly rounded (to nearest, ties to even), the
// same bits on every IEEE host and device. libm's expf and CUDA's expf/__expf are
// not correctly rounded and differ in the last bits, so the softmax of the attention
// op (nn/attention.h) takes its exponentials from here.
//
// Correct rounding makes the definition independent of this code: any correctly
// rounded binary32 exp gives these bits. This one evaluates e^x in double, and where
// that cannot decide the rounding (correctly_rounded_exp below), in double-double:
//
//   N  = nearest integer to x · 64/ln2      (fma(x, 64/ln2, 1.5·2^52) - 1.5·2^52)
//   r  = x - N · ln2/64                     (ln2/64 = C1 + C2, C1 of 39 bits, so
//                                            x - N·C1 is exact; r as rh + rl)
//   e^x = 2^(N div 64) · T[N mod 64] · (1 + r + q),   q = r²/2! + ... + r^7/7!
//
// with T[j] = 2^(j/64) as a double-double (hi + lo, the lo correct to 2^-106) and
// |r| <= ln2/128 + 2^-40. The terms are combined with exact products (fma) and
// two-sums into y_hi + y_lo whose relative error is below 2^-64 (the truncated series
// 2^-75, each rounding at most 2^-69, the cross terms left out 2^-67). y_hi + y_lo is
// then rounded to double "to odd" (y_hi, or its neighbour towards y_lo when y_lo is not
// 0 and y_hi's last bit is even) and that double to float: rounding to odd with 29
// spare bits makes the two roundings one correct rounding of y_hi + y_lo
// (Boldo-Melquiond). So the float is e^x correctly rounded unless e^x lies within
// 2^-64 (relative) of a midpoint between two floats; the exhaustive test over all 2^32
// floats (tests/core/exp_test.cpp, [.exhaustive]) finds no such input, through the
// function and through the double-double path alone: the bound is 0.5 ulp, every input.
//
// Edges: NaN gives NaN; x > 89 gives +inf and x < -104 gives +0 (e^x there is beyond
// float's range or below half the smallest subnormal); in between, overflow to +inf
// and underflow into subnormals and 0 are the correct rounding's.
//
// Every operation is written out: std::fma where a multiply-add is fused, and
// rounded_product (__dmul_rn on a device, which nvcc never fuses into a later add) for
// every product that feeds an addition; the host's code is built with
// -ffp-contract=off. So the host and a CUDA device agree on every intermediate, and the
// error-free transformations stay error-free.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace seqpar {

namespace exp_detail {

struct DoubleDouble {
  double hi, lo;
};

// 2^(j/64), j = 0..63: hi the double nearest, lo the double nearest the rest.
#define SEQPAR_EXP2_64THS_TABLE \
  { \
    {0x1.0000000000000p+0, 0x0.0p+0}, \
    {0x1.02c9a3e778061p+0, -0x1.19083535b085dp-56}, \
    {0x1.059b0d3158574p+0, 0x1.d73e2a475b465p-55}, \
    {0x1.0874518759bc8p+0, 0x1.186be4bb284ffp-57}, \
    {0x1.0b5586cf9890fp+0, 0x1.8a62e4adc610bp-54}, \
    {0x1.0e3ec32d3d1a2p+0, 0x1.03a1727c57b53p-59}, \
    {0x1.11301d0125b51p+0, -0x1.6c51039449b3ap-54}, \
    {0x1.1429aaea92de0p+0, -0x1.32fbf9af1369ep-54}, \
    {0x1.172b83c7d517bp+0, -0x1.19041b9d78a76p-55}, \
    {0x1.1a35beb6fcb75p+0, 0x1.e5b4c7b4968e4p-55}, \
    {0x1.1d4873168b9aap+0, 0x1.e016e00a2643cp-54}, \
    {0x1.2063b88628cd6p+0, 0x1.dc775814a8495p-55}, \
    {0x1.2387a6e756238p+0, 0x1.9b07eb6c70573p-54}, \
    {0x1.26b4565e27cddp+0, 0x1.2bd339940e9d9p-55}, \
    {0x1.29e9df51fdee1p+0, 0x1.612e8afad1255p-55}, \
    {0x1.2d285a6e4030bp+0, 0x1.0024754db41d5p-54}, \
    {0x1.306fe0a31b715p+0, 0x1.6f46ad23182e4p-55}, \
    {0x1.33c08b26416ffp+0, 0x1.32721843659a6p-54}, \
    {0x1.371a7373aa9cbp+0, -0x1.63aeabf42eae2p-54}, \
    {0x1.3a7db34e59ff7p+0, -0x1.5e436d661f5e3p-56}, \
    {0x1.3dea64c123422p+0, 0x1.ada0911f09ebcp-55}, \
    {0x1.4160a21f72e2ap+0, -0x1.ef3691c309278p-58}, \
    {0x1.44e086061892dp+0, 0x1.89b7a04ef80d0p-59}, \
    {0x1.486a2b5c13cd0p+0, 0x1.3c1a3b69062f0p-56}, \
    {0x1.4bfdad5362a27p+0, 0x1.d4397afec42e2p-56}, \
    {0x1.4f9b2769d2ca7p+0, -0x1.4b309d25957e3p-54}, \
    {0x1.5342b569d4f82p+0, -0x1.07abe1db13cadp-55}, \
    {0x1.56f4736b527dap+0, 0x1.9bb2c011d93adp-54}, \
    {0x1.5ab07dd485429p+0, 0x1.6324c054647adp-54}, \
    {0x1.5e76f15ad2148p+0, 0x1.ba6f93080e65ep-54}, \
    {0x1.6247eb03a5585p+0, -0x1.383c17e40b497p-54}, \
    {0x1.6623882552225p+0, -0x1.bb60987591c34p-54}, \
    {0x1.6a09e667f3bcdp+0, -0x1.bdd3413b26456p-54}, \
    {0x1.6dfb23c651a2fp+0, -0x1.bbe3a683c88abp-57}, \
    {0x1.71f75e8ec5f74p+0, -0x1.16e4786887a99p-55}, \
    {0x1.75feb564267c9p+0, -0x1.0245957316dd3p-54}, \
    {0x1.7a11473eb0187p+0, -0x1.41577ee04992fp-55}, \
    {0x1.7e2f336cf4e62p+0, 0x1.05d02ba15797ep-56}, \
    {0x1.82589994cce13p+0, -0x1.d4c1dd41532d8p-54}, \
    {0x1.868d99b4492edp+0, -0x1.fc6f89bd4f6bap-54}, \
    {0x1.8ace5422aa0dbp+0, 0x1.6e9f156864b27p-54}, \
    {0x1.8f1ae99157736p+0, 0x1.5cc13a2e3976cp-55}, \
    {0x1.93737b0cdc5e5p+0, -0x1.75fc781b57ebcp-57}, \
    {0x1.97d829fde4e50p+0, -0x1.d185b7c1b85d1p-54}, \
    {0x1.9c49182a3f090p+0, 0x1.c7c46b071f2bep-56}, \
    {0x1.a0c667b5de565p+0, -0x1.359495d1cd533p-54}, \
    {0x1.a5503b23e255dp+0, -0x1.d2f6edb8d41e1p-54}, \
    {0x1.a9e6b5579fdbfp+0, 0x1.0fac90ef7fd31p-54}, \
    {0x1.ae89f995ad3adp+0, 0x1.7a1cd345dcc81p-54}, \
    {0x1.b33a2b84f15fbp+0, -0x1.2805e3084d708p-57}, \
    {0x1.b7f76f2fb5e47p+0, -0x1.5584f7e54ac3bp-56}, \
    {0x1.bcc1e904bc1d2p+0, 0x1.23dd07a2d9e84p-55}, \
    {0x1.c199bdd85529cp+0, 0x1.11065895048ddp-55}, \
    {0x1.c67f12e57d14bp+0, 0x1.2884dff483cadp-54}, \
    {0x1.cb720dcef9069p+0, 0x1.503cbd1e949dbp-56}, \
    {0x1.d072d4a07897cp+0, -0x1.cbc3743797a9cp-54}, \
    {0x1.d5818dcfba487p+0, 0x1.2ed02d75b3707p-55}, \
    {0x1.da9e603db3285p+0, 0x1.c2300696db532p-54}, \
    {0x1.dfc97337b9b5fp+0, -0x1.1a5cd4f184b5cp-54}, \
    {0x1.e502ee78b3ff6p+0, 0x1.39e8980a9cc8fp-55}, \
    {0x1.ea4afa2a490dap+0, -0x1.e9c23179c2893p-54}, \
    {0x1.efa1bee615a27p+0, 0x1.dc7f486a4b6b0p-54}, \
    {0x1.f50765b6e4540p+0, 0x1.9d3e12dd8a18bp-54}, \
    {0x1.fa7c1819e90d8p+0, 0x1.74853f3a5931ep-55}, \
  }

#ifdef __CUDACC__
static __device__ const DoubleDouble kExp2SixtyFourthsDevice[64] = SEQPAR_EXP2_64THS_TABLE;
#endif
inline constexpr DoubleDouble kExp2SixtyFourths[64] = SEQPAR_EXP2_64THS_TABLE;
#undef SEQPAR_EXP2_64THS_TABLE

SEQPAR_HOST_DEVICE DoubleDouble exp2_sixty_fourths(int j) {
#ifdef __CUDA_ARCH__
  return kExp2SixtyFourthsDevice[j];
#else
  return kExp2SixtyFourths[j];
#endif
}

constexpr double kSixtyFourOverLn2 = 0x1.71547652b82fep+6;
constexpr double kLn2Over64High = 0x1.62e42fefa4000p-7;   // 39 significant bits
constexpr double kLn2Over64Low = -0x1.8432a1b0e2634p-49;  // ln2/64 - high, to 2^-102
constexpr double kRoundingShifter = 0x1.8p52;             // 1.5 · 2^52

// a · b rounded once, never fused with an add that uses it.
SEQPAR_HOST_DEVICE double rounded_product(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// 2^k for -1022 <= k <= 1023, from its bits.
SEQPAR_HOST_DEVICE double power_of_two(int k) {
  const uint64_t bits = static_cast<uint64_t>(k + 1023) << 52;
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// hi + lo rounded to double "to odd": hi = RN(hi + lo) is kept if lo is 0 or hi is
// odd, else its neighbour towards lo (which is odd). hi > 0.
SEQPAR_HOST_DEVICE double round_to_odd(double hi, double lo) {
  uint64_t bits;
  std::memcpy(&bits, &hi, sizeof bits);
  if (lo != 0.0 && (bits & 1u) == 0) bits = lo > 0.0 ? bits + 1 : bits - 1;
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// N: the nearest integer to x · 64/ln2, so that x ≈ N · ln2/64.
SEQPAR_HOST_DEVICE double nearest_ln2_sixty_fourths(double x) {
  return std::fma(x, kSixtyFourOverLn2, kRoundingShifter) - kRoundingShifter;
}

// The double-double evaluation described above, for -104 <= x <= 89.
SEQPAR_HOST_DEVICE float double_double_exp(float x) {
  const double xd = x;
  // N, and r1 = x - N·C1, exact (|N| < 2^14, C1 of 39 bits).
  const double n = nearest_ln2_sixty_fourths(xd);
  const double r1 = std::fma(-n, kLn2Over64High, xd);
  const double p = rounded_product(n, kLn2Over64Low);
  const double p_error = std::fma(n, kLn2Over64Low, -p);
  const double rh = r1 - p;  // a two-sum: rh + rh_error = r1 - p exactly
  const double r1_part = rh + p;
  const double rh_error = (r1 - r1_part) - (p - (r1_part - rh));
  const double rl = rh_error - p_error;
  // q = e^r - 1 - r from rh (rl's part of it is below 2^-67).
  double series = 1.0 / 5040;
  series = std::fma(series, rh, 1.0 / 720);
  series = std::fma(series, rh, 1.0 / 120);
  series = std::fma(series, rh, 1.0 / 24);
  series = std::fma(series, rh, 1.0 / 6);
  series = std::fma(series, rh, 0.5);
  const double q = rounded_product(rh * rh, series);
  // T (1 + rh + rl + q) = T_hi + T_hi rh + [T_hi (rl + q) + T_lo (1 + rh)].
  const int ni = static_cast<int>(n);
  const int j = ni & 63;
  const DoubleDouble t = exp2_sixty_fourths(j);
  const double a = rounded_product(t.hi, rh);
  const double a_error = std::fma(t.hi, rh, -a);
  const double b = std::fma(t.hi, rl + q, a_error + std::fma(t.lo, rh, t.lo));
  const double s = t.hi + a;  // |t.hi| >= |a|: the two-sum's error is exact
  const double s_error = (t.hi - s) + a;
  const double low = s_error + b;
  const double y_hi = s + low;
  const double y_lo = (s - y_hi) + low;
  const double scale = power_of_two((ni - j) / 64);  // 2^k, k in [-151, 129]: exact scaling
  return static_cast<float>(round_to_odd(y_hi * scale, y_lo * scale));
}

}  // namespace exp_detail

// e^x correctly rounded to binary32 (see above): error at most 0.5 ulp.
//
// A first evaluation in plain double (relative error below 2^-51: the table's hi, the
// series' roundings, the last fma) settles almost every input: when y (1 - 2^-49) and
// y (1 + 2^-49) round to the same float, so does e^x, which lies between them. Only
// the others take the double-double evaluation: those whose e^x lies within a relative
// 2^-49 of a point halfway between two floats. That is one in 2^24 to 2^25 of the
// inputs whose e^x may fall anywhere in its binade, and far fewer of all floats, most
// of which are so close to 0 that e^x is close to 1, where no halfway point is near.
// Either way the result is the correctly rounded e^x, so the path taken changes no bit.
SEQPAR_HOST_DEVICE float correctly_rounded_exp(float x) {
  using namespace exp_detail;
  if (x != x) return x;
  if (x > 89.0f) return INFINITY;
  if (x < -104.0f) return 0.0f;
  const double xd = x;
  // N, and r1 = x - N·C1, exact (|N| < 2^14, C1 of 39 bits).
  const double n = nearest_ln2_sixty_fourths(xd);
  const double r1 = std::fma(-n, kLn2Over64High, xd);
  const double r = std::fma(-n, kLn2Over64Low, r1);
  double series = 1.0 / 5040;
  series = std::fma(series, r, 1.0 / 720);
  series = std::fma(series, r, 1.0 / 120);
  series = std::fma(series, r, 1.0 / 24);
  series = std::fma(series, r, 1.0 / 6);
  series = std::fma(series, r, 0.5);
  series = std::fma(series, r, 1.0);
  const int ni = static_cast<int>(n);
  const int j = ni & 63;
  const double t = exp2_sixty_fourths(j).hi;
  const double y = std::fma(t, series * r, t) * power_of_two((ni - j) / 64);
  const float below = static_cast<float>(y * (1.0 - 0x1p-49));
  const float above = static_cast<float>(y * (1.0 + 0x1p-49));
  if (below == above) return below;
  return double_double_exp(x);
}

}  // namespace seqpar
