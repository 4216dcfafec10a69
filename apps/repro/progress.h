// Progress of a long run on stderr: a run that has gone on for more than two seconds
// says what it is doing (drawing the data, the reference's or a policy's step k of N)
// and for how long, every two seconds on a terminal and every ten seconds otherwise
// (a log file). Short runs print nothing, so the report stays the only output.
//
// The scenario sets the phase as it goes; a ticker thread prints it, so one long step
// (400,000 rows on the CPU) still shows that the program is alive.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>

namespace seqpar::repro {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;

  // Prints to `out` after `quiet_period`, then every `interval`.
  Progress(std::ostream& out, Clock::duration quiet_period, Clock::duration interval);
  ~Progress();  // stops the ticker
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // stderr; two seconds of silence, then every 2 s on a terminal, every 10 s otherwise.
  static std::unique_ptr<Progress> on_stderr();

  void set_phase(const std::string& phase);
  // "policy exact" at step `step` (from 0) of `steps`: "policy exact, step 3/1000".
  void set_step(const std::string& what, int64_t step, int64_t steps);

 private:
  void tick();

  std::ostream& out_;
  const Clock::time_point start_;
  const Clock::duration quiet_period_, interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string phase_ = "starting";
  bool stop_ = false;
  std::thread ticker_;
};

}  // namespace seqpar::repro
