#include "apps/repro/progress.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>

namespace seqpar::repro {

Progress::Progress(std::ostream& out, Clock::duration quiet_period, Clock::duration interval)
    : out_(out), start_(Clock::now()), quiet_period_(quiet_period), interval_(interval) {
  ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  ticker_.join();
}

std::unique_ptr<Progress> Progress::on_stderr() {
  const bool terminal = isatty(STDERR_FILENO) == 1;
  return std::make_unique<Progress>(std::cerr, std::chrono::seconds(2),
                                    terminal ? std::chrono::seconds(2) : std::chrono::seconds(10));
}

void Progress::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase;
}

void Progress::set_step(const std::string& what, int64_t step, int64_t steps) {
  set_phase(what + ", step " + std::to_string(step + 1) + "/" + std::to_string(steps));
}

void Progress::tick() {
  std::unique_lock<std::mutex> lock(mutex_);
  Clock::time_point next = start_ + quiet_period_;
  while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    char line[64];
    std::snprintf(line, sizeof line, "seqpar-repro: %.0f s: ", elapsed);
    out_ << line << phase_ << '\n' << std::flush;
    next += interval_;
  }
}

}  // namespace seqpar::repro
