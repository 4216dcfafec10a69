#include <catch2/catch.hpp>

#include <sstream>
#include <thread>

#include "apps/repro/progress.h"

using seqpar::repro::Progress;
using namespace std::chrono_literals;

TEST_CASE("progress: silent during the quiet period, then the phase and the time",
          "[repro][progress]") {
  std::ostringstream quiet;
  {
    Progress progress(quiet, 1h, 1ms);
    progress.set_step("policy exact", 2, 1000);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(quiet.str().empty());  // a short run prints nothing

  std::ostringstream out;
  {
    Progress progress(out, 0s, 5ms);
    progress.set_step("policy exact", 2, 1000);
    std::this_thread::sleep_for(100ms);
  }
  CHECK_THAT(out.str(), Catch::StartsWith("seqpar-repro: ") &&
                            Catch::Contains(" s: policy exact, step 3/1000\n"));
}
