// What seqpar-repro shows: the text report, the JSON figures (--json), the drift
// picture (SVG) and the safetensors dump (--dump). All run on world rank 0.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "apps/repro/analysis.h"
#include "apps/repro/scenario.h"

namespace seqpar::repro {

void print_report(std::ostream& out, const RunResults& results,
                  const std::vector<PolicyFigures>& figures);

// The schema is documented in apps/repro/README.md ("JSON output").
void write_json(const std::string& path, const RunResults& results,
                const std::vector<PolicyFigures>& figures);

// Cross-rank drift (the largest parameter difference between ranks) against the step,
// one line per policy, on a log scale; bitwise-identical ranks sit on the floor line.
void write_drift_svg(const std::string& path, const RunResults& results,
                     const std::vector<PolicyFigures>& figures);

// DIR/inputs.safetensors, DIR/<policy>/rank<R>.safetensors, DIR/reference.safetensors.
void write_dump(const std::string& directory, const RunResults& results);

}  // namespace seqpar::repro
