// What the bench programs share: one way of parsing arguments; and, for seqpar-bench,
// timing and reporting: CUDA events around each call on the device's stream, a
// warm-up, the median of many calls; one JSON record per figure.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_runtime.h"

namespace seqpar::bench {

// One command-line option: "--name VALUE" when it takes a value, "--name" when not.
struct Option {
  std::string name;
  bool takes_value = true;
  std::function<void(const std::string& value)> set;
};

// Every bench program parses its arguments with this (after dist::maybe_launch has
// taken --nproc): --help prints `usage` to stdout and returns 0; an unknown option or
// an option missing its value is an error naming it, on stderr, and returns 2.
// Returns -1 when the program should go on.
inline int parse_arguments(int argc, char** argv, const std::string& usage,
                           const std::vector<Option>& options) {
  const std::string program = argc > 0 ? argv[0] : "bench";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage.c_str());
      return 0;
    }
    const Option* match = nullptr;
    for (const Option& option : options) {
      if (option.name == arg) match = &option;
    }
    if (match == nullptr) {
      std::fprintf(stderr, "%s: unknown option %s\n%s", program.c_str(), arg.c_str(), usage.c_str());
      return 2;
    }
    if (!match->takes_value) {
      match->set("");
    } else if (i + 1 < argc) {
      match->set(argv[++i]);
    } else {
      std::fprintf(stderr, "%s: option %s needs a value\n%s", program.c_str(), arg.c_str(),
                   usage.c_str());
      return 2;
    }
  }
  return -1;
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
  void write_json(const std::string& path, const std::string& gpu) const {
    std::FILE* file = std::fopen(path.c_str(), "w");
    if (file == nullptr) return;
    std::fprintf(file, "{\"source\": \"seqpar-bench\", \"gpu\": \"%s\", \"results\": [\n", gpu.c_str());
    for (size_t i = 0; i < records_.size(); ++i) {
      const Record& r = records_[i];
      std::fprintf(file,
                   "  {\"name\": \"%s\", \"what\": \"%s\", \"median_us\": %.3f, \"min_us\": %.3f, "
                   "\"repeats\": %d, \"bytes\": %.0f, \"flops\": %.0f}%s\n",
                   r.name.c_str(), r.what.c_str(), r.timing.median_us, r.timing.min_us,
                   r.timing.repeats, r.bytes, r.flops, i + 1 < records_.size() ? "," : "");
    }
    std::fprintf(file, "]}\n");
    std::fclose(file);
  }

 private:
  std::vector<Record> records_;
};

}  // namespace seqpar::bench
