// What the bench programs share: one way of parsing arguments; and, for seqpar-bench,
// timing and reporting: CUDA events around each call on the device's stream, a
// warm-up, the median of many calls; one JSON record per figure.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/common/command_line.h"
#include "core/cuda_check.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "seqpar/version.h"

namespace seqpar::bench {

// Every bench program parses its arguments with this (after dist::maybe_launch has
// taken --nproc), through the parser all seqpar programs share (apps/common/command_line.h):
// --help prints `usage` to stdout and returns 0, --version likewise; an unknown option,
// a missing or malformed value is one line on stderr and returns 2. Returns -1 when the
// program should go on.
inline int parse_arguments(int argc, char** argv, const std::string& program,
                           const std::string& usage, std::vector<CommandLineOption> options) {
  bool help = false, version = false;
  options.push_back({{"--help", "-h"}, false, [&](const std::string&) { help = true; }, "", ""});
  options.push_back({{"--version"}, false, [&](const std::string&) { version = true; }, "", ""});
  try {
    parse_command_line(std::vector<std::string>(argv + 1, argv + argc), options);
  } catch (const InputError& error) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), error.what());
    return 2;
  }
  if (help) std::printf("%s", usage.c_str());
  if (version && !help) std::printf("%s %s\n", program.c_str(), kSeqparVersion);
  return help || version ? 0 : -1;
}

// An option whose value is an integer of at least `minimum`.
inline CommandLineOption integer_option(const std::string& name, int& target, int minimum) {
  return {{name}, true, [name, &target, minimum](const std::string& value) {
            target = static_cast<int>(parse_integer_option(name, value, minimum, 1 << 30));
          }, "N", ""};
}

struct Timing {
  double median_us = 0.0, min_us = 0.0;
  int repeats = 0;
};

// Back to back: every call is bracketed by events recorded on the stream without a
// host wait in between, so the GPU never idles (clocks stay up, the next launch is
// already queued) and each interval is one call's device time as a steady stream of
// steps sees it. Work that launches slower than the GPU runs it shows its host time.
inline Timing time_calls(const std::function<void()>& work, int warmup, int repeats) {
  cudaStream_t stream = cuda::current_stream(0);
  std::vector<cudaEvent_t> events(static_cast<size_t>(repeats) + 1);
  for (cudaEvent_t& event : events) CUDA_CHECK(cudaEventCreate(&event));
  for (int i = 0; i < warmup; ++i) work();
  CUDA_CHECK(cudaEventRecord(events[0], stream));
  for (int i = 0; i < repeats; ++i) {
    work();
    CUDA_CHECK(cudaEventRecord(events[static_cast<size_t>(i) + 1], stream));
  }
  CUDA_CHECK(cudaEventSynchronize(events.back()));
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    float milliseconds = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&milliseconds, events[i], events[i + 1]));
    times.push_back(1000.0 * milliseconds);
  }
  for (cudaEvent_t& event : events) CUDA_CHECK(cudaEventDestroy(event));
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), repeats};
}

// The host's time to enqueue one call: the stream drained before each call, so no
// launch waits for room in the queue, and the clock stopped when the call returns,
// before its work has run. Set beside time_calls' figure, it says whether a step is
// bound by the host's launches or by the GPU's kernels.
inline Timing time_host_calls(const std::function<void()>& work, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) work();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    cuda::synchronize(0);
    const auto start = std::chrono::steady_clock::now();
    work();
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    times.push_back(elapsed.count());
  }
  cuda::synchronize(0);
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front(), repeats};
}

// One measured figure. bytes: the fewest bytes the work must move through device
// memory (0 when not meaningful); flops: its floating-point operations (0 likewise).
struct Record {
  std::string name, what;
  Timing timing;
  double bytes = 0.0, flops = 0.0;
};

class Report {
 public:
  void add(const std::string& name, const std::string& what, const Timing& timing,
           double bytes = 0.0, double flops = 0.0) {
    records_.push_back({name, what, timing, bytes, flops});
    std::printf("%-44s %12.2f us  (min %10.2f, %5d reps)  %s\n", name.c_str(),
                timing.median_us, timing.min_us, timing.repeats, what.c_str());
    std::fflush(stdout);
  }
  // A JSON writer, so names and descriptions are escaped whatever they hold.
  void write_json(const std::string& path, const std::string& gpu) const {
    nlohmann::json results = nlohmann::json::array();
    for (const Record& r : records_) {
      results.push_back({{"name", r.name}, {"what", r.what}, {"median_us", r.timing.median_us},
                         {"min_us", r.timing.min_us}, {"repeats", r.timing.repeats},
                         {"bytes", r.bytes}, {"flops", r.flops}});
    }
    const nlohmann::json root = {{"source", "seqpar-bench"}, {"gpu", gpu}, {"results", results}};
    std::ofstream file(path);
    if (!file) {
      std::fprintf(stderr, "seqpar-bench: cannot write %s\n", path.c_str());
      return;
    }
    file << root.dump(1) << '\n';
  }

 private:
  std::vector<Record> records_;
};

}  // namespace seqpar::bench
