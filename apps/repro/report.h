// What seqpar-repro shows: the text report, the JSON figures (--json), the drift
// picture (SVG) and the safetensors dump (--dump). All run on world rank 0.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "apps/repro/analysis.h"
#include "apps/repro/scenario.h"
#include "apps/common/dump_directory.h"
#include "apps/common/text.h"
#include "apps/common/safetensors.h"

namespace seqpar::repro {

// The width report lines keep within.
constexpr size_t kReportWidth = 100;

// The report's "ignored" lines (keys accepted without changing the scenario, grouped by
// why) and its "not given" line (keys a user's config left to the scenario's defaults).
std::string config_notes(const ReproConfig& config);

// The lines under every report's first line of its run: config_notes, the placement and
// the mesh's layout.
void print_setup(std::ostream& out, const ReproConfig& config, const std::string& placement,
                 const std::string& mesh_layout);

// The per-step table shows the first steps, log-spaced ones (1, 2, 3, 5, 10, 20, 50,
// ...), each policy's first broken step and the last; --json holds every step.
void print_report(std::ostream& out, const RunResults& results);

// The steps (1-based, ascending) print_report shows out of `steps`, plus `also` (0: none).
std::vector<int64_t> steps_to_show(int64_t steps, int64_t also = 0);

// Cross-rank drift (the largest parameter difference between ranks) against the step,
// one line per policy, on a log scale; bitwise-identical ranks sit on the floor line.
// The distance of rank 0 from one-rank training, dashed, beside it. An SVG document.
std::string drift_svg(const RunResults& results);

// The picture's series as CSV: policy,step,max_difference_across_ranks,
// max_difference_from_one_rank (a line per policy and step).
std::string drift_csv(const RunResults& results);

// The flat [weight..., bias...] vector as the tensors `prefix`weight and `prefix`bias.
NamedTensors unflatten(const std::vector<float>& flat, const ReproConfig& config,
                       const std::string& prefix);
// A dump file's tensors: weight, bias, grad.weight and grad.bias.
NamedTensors parameters_and_gradients(const std::vector<float>& parameters, const std::vector<float>& gradients,
                                      const ReproConfig& config);

}  // namespace seqpar::repro
