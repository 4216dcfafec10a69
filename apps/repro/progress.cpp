#include "apps/repro/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

namespace seqpar::repro {

namespace {

std::string duration_text(double seconds) {
  char text[32];
  if (seconds < 90) {
    std::snprintf(text, sizeof text, "%.0f s", seconds);
  } else if (seconds < 90 * 60) {
    std::snprintf(text, sizeof text, "%.0f min", seconds / 60);
  } else {
    std::snprintf(text, sizeof text, "%.1f h", seconds / 3600);
  }
  return text;
}

}  // namespace

Progress::Progress(std::ostream& out, Clock::duration quiet_period, Clock::duration interval,
                   Style style)
    : out_(out), start_(Clock::now()), quiet_period_(quiet_period), interval_(interval),
      style_(style), phase_start_(start_) {
  ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  ticker_.join();
  if (style_ == Style::InPlace && line_shown_) out_ << "\r\033[K" << std::flush;
}

std::unique_ptr<Progress> Progress::on_stderr(bool quiet) {
  if (quiet) return nullptr;
  const bool terminal = isatty(STDERR_FILENO) == 1;
  if (terminal) {
    return std::make_unique<Progress>(std::cerr, std::chrono::seconds(2), std::chrono::seconds(1),
                                      Style::InPlace);
  }
  return std::make_unique<Progress>(std::cerr, std::chrono::seconds(10), std::chrono::seconds(10),
                                    Style::DoublingLines);
}

void Progress::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase;
  step_ = -1;
  phase_start_ = Clock::now();
}

void Progress::set_step(const std::string& what, int64_t step, int64_t steps) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (what != phase_ || step_ < 0) {
    phase_ = what;
    first_step_ = step;
    phase_start_ = Clock::now();
  }
  step_ = step;
  steps_ = steps;
}

std::string Progress::describe(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  return describe_locked(now);
}

std::string Progress::describe_locked(Clock::time_point now) const {
  if (step_ < 0) return phase_;
  std::string text = phase_ + ", step " + std::to_string(step_ + 1) + "/" + std::to_string(steps_);
  const double seconds = std::chrono::duration<double>(now - phase_start_).count();
  const int64_t done = step_ - first_step_;
  if (done > 0 && seconds > 0) {
    const double rate = static_cast<double>(done) / seconds;
    char figures[64];
    std::snprintf(figures, sizeof figures, rate >= 1 ? " (%.1f steps/s, " : " (%.2f steps/s, ", rate);
    text += figures + ("about " + duration_text(static_cast<double>(steps_ - step_) / rate) + " left)");
  }
  return text;
}

void Progress::tick() {
  std::unique_lock<std::mutex> lock(mutex_);
  Clock::time_point next = start_ + quiet_period_;
  Clock::duration interval = interval_;
  while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
    const Clock::time_point now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    char head[64];
    std::snprintf(head, sizeof head, "seqpar-repro: %.0f s: ", elapsed);
    if (style_ == Style::InPlace) {
      out_ << "\r\033[K" << head << describe_locked(now) << std::flush;
    } else {
      out_ << head << describe_locked(now) << '\n' << std::flush;
    }
    line_shown_ = true;
    next += interval;
    if (style_ == Style::DoublingLines) interval *= 2;
  }
}

}  // namespace seqpar::repro
