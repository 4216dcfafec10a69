#include <catch2/catch.hpp>

#include <algorithm>
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

TEST_CASE("progress: the rate and the time left of the phase", "[repro][progress]") {
  std::ostringstream out;
  Progress progress(out, 1h, 1h);
  const auto start = Progress::Clock::now();
  progress.set_step("policy exact", 0, 1000);
  CHECK(progress.describe(start) == "policy exact, step 1/1000");
  progress.set_step("policy exact", 10, 1000);
  // 10 steps in about as long as it took to get here: some rate, and a time left.
  CHECK_THAT(progress.describe(Progress::Clock::now() + 1s),
             Catch::StartsWith("policy exact, step 11/1000 (") && Catch::Contains(" steps/s, about ") &&
                 Catch::EndsWith(" left)"));
  progress.set_phase("deciding the verdicts");
  CHECK(progress.describe(Progress::Clock::now()) == "deciding the verdicts");
}

TEST_CASE("progress: in place on a terminal, a few lines into a file", "[repro][progress]") {
  std::ostringstream terminal;
  {
    Progress progress(terminal, 0s, 2ms, Progress::Style::InPlace);
    progress.set_step("policy exact", 2, 1000);
    std::this_thread::sleep_for(50ms);
  }
  CHECK(terminal.str().find('\n') == std::string::npos);
  CHECK_THAT(terminal.str(), Catch::StartsWith("\r\033[Kseqpar-repro: ") &&
                                 Catch::EndsWith("\r\033[K"));  // erased at the end

  std::ostringstream file;
  {
    Progress progress(file, 0s, 2ms, Progress::Style::DoublingLines);
    progress.set_step("policy exact", 2, 1000);
    std::this_thread::sleep_for(100ms);
  }
  // Lines at 0, 2, 6, 14, 30, 62 ms (and perhaps 126): never one every 2 ms.
  const std::string text = file.str();
  const auto lines = std::count(text.begin(), text.end(), '\n');
  CHECK(lines >= 2);
  CHECK(lines <= 8);
}
