// parallel_for: the CPU paths' one way to use several cores. Each item writes only its
// own outputs and computes them as one thread would, so the bits depend neither on
// which thread ran an item nor on how many threads ran: a parallel CPU path stays
// bitwise its serial self, and the reference's.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace seqpar {

// The threads parallel_for uses: SEQPAR_CPU_THREADS when it is set to a number >= 1,
// else the hardware's.
inline int cpu_threads() {
  static const int threads = [] {
    if (const char* text = std::getenv("SEQPAR_CPU_THREADS")) {
      const int requested = std::atoi(text);
      if (requested >= 1) return requested;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return threads;
}

// Runs fn(item) for every item in [0, count), on up to cpu_threads() threads that take
// the next item as they finish one. An exception from any item stops the others from
// taking new items and is rethrown here after every thread has joined.
template <typename Fn>
void parallel_for(int64_t count, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(cpu_threads(), count);
  if (threads <= 1) {
    for (int64_t item = 0; item < count; ++item) fn(item);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    try {
      for (int64_t item = next++; item < count; item = next++) fn(item);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = count;
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace seqpar
