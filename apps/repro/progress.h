// Progress of a long run on stderr: a run that has gone on for more than two seconds
// says what it is doing (drawing the data, the baseline's or a policy's step k of N,
// with the steps' rate and the time left of that part) and for how long. On a
// terminal one line is rewritten in place every second and erased at the end; into a
// file or pipe it prints a few lines, at intervals that double (10 s, 20 s, 40 s, ...).
// Short runs print nothing, so the report stays the only output; -q turns it off.
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
  enum class Style {
    Lines,         // a line every `interval`
    DoublingLines, // a line after `interval`, then after twice as long each time
    InPlace,       // one line rewritten every `interval`, erased when done (a terminal)
  };

  // Prints to `out` after `quiet_period`, then as `style` says.
  Progress(std::ostream& out, Clock::duration quiet_period, Clock::duration interval,
           Style style = Style::Lines);
  ~Progress();  // stops the ticker (and erases an in-place line)
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // stderr: two seconds of silence, then in place on a terminal, doubling lines
  // otherwise. nullptr when `quiet`.
  static std::unique_ptr<Progress> on_stderr(bool quiet = false);

  void set_phase(const std::string& phase);
  // "policy exact" at step `step` (from 0) of `steps`: "policy exact, step 3/1000",
  // with the rate since this phase began and the time its remaining steps would take.
  void set_step(const std::string& what, int64_t step, int64_t steps);

  // "policy exact, step 3/1000 (2.5 steps/s, about 7 min left)": what a tick prints
  // after the elapsed time.
  std::string describe(Clock::time_point now);

 private:
  void tick();
  std::string describe_locked(Clock::time_point now) const;  // with mutex_ held

  std::ostream& out_;
  const Clock::time_point start_;
  const Clock::duration quiet_period_, interval_;
  const Style style_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string phase_ = "starting";
  int64_t step_ = -1, steps_ = 0, first_step_ = 0;  // step_ -1: a phase without steps
  Clock::time_point phase_start_;
  bool stop_ = false;
  bool line_shown_ = false;
  std::thread ticker_;
};

}  // namespace seqpar::repro
