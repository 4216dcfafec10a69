// Correctly rounded binary32 values of elementary functions, from MPFR (for tests of
// core/exp.h and RoPE's table): the function at 24 bits in float's exponent range,
// subnormalized, as MPFR's manual emulates IEEE formats. Only with
// SEQPAR_TEST_HAVE_MPFR (tests/CMakeLists.txt).
#pragma once

#ifdef SEQPAR_TEST_HAVE_MPFR
#include <mpfr.h>

namespace seqpar::test {

class MpfrFloat {
 public:
  using Function = int (*)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t);

  MpfrFloat() : old_emin_(mpfr_get_emin()), old_emax_(mpfr_get_emax()) {
    mpfr_init2(argument_, 53);
    mpfr_init2(value_, 24);
  }
  ~MpfrFloat() {
    mpfr_clear(argument_);
    mpfr_clear(value_);
  }
  MpfrFloat(const MpfrFloat&) = delete;
  MpfrFloat& operator=(const MpfrFloat&) = delete;

  // function(x) rounded once to the nearest float (ties to even); x is exact in 53 bits.
  float operator()(Function function, double x) {
    mpfr_set_emin(old_emin_);
    mpfr_set_emax(old_emax_);
    mpfr_set_d(argument_, x, MPFR_RNDN);  // exact
    mpfr_set_emin(-148);  // float: 2^-149 = 0.5 · 2^-148 in MPFR's convention
    mpfr_set_emax(128);
    int ternary = function(value_, argument_, MPFR_RNDN);
    ternary = mpfr_check_range(value_, ternary, MPFR_RNDN);
    mpfr_subnormalize(value_, ternary, MPFR_RNDN);
    const float result = mpfr_get_flt(value_, MPFR_RNDN);
    mpfr_set_emin(old_emin_);
    mpfr_set_emax(old_emax_);
    return result;
  }

 private:
  mpfr_exp_t old_emin_, old_emax_;
  mpfr_t argument_, value_;
};

}  // namespace seqpar::test
#endif
