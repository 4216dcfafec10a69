// The drift picture: largest cross-rank parameter difference per step, per policy,
// as a standalone SVG (opens in any browser). Log scale from 1e-9 up; a policy whose
// ranks stay bitwise identical runs along the floor, labelled as such.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "apps/repro/report.h"
#include "core/error.h"
#include "core/output_file.h"

namespace seqpar::repro {

namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 90, kRight = 190, kTop = 50, kBottom = 60;
constexpr double kFloorExponent = -9;  // 1e-9: below float32 rounding of these weights
constexpr size_t kMostDots = 60;       // a dot per step up to this many steps
const char* const kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};

struct Axes {
  int64_t steps;
  double top_exponent;
  double x(double step) const {
    const double span = std::max<double>(double(steps - 1), 1);
    return kLeft + (kWidth - kLeft - kRight) * (steps == 1 ? 0.5 : (step - 1) / span);
  }
  // A difference that is not finite (the run overflowed) is drawn at the top.
  double y(double difference) const {
    const double exponent =
        std::isnan(difference) || difference > std::pow(10.0, top_exponent)
            ? top_exponent
            : difference > 0 ? std::max(std::log10(difference), kFloorExponent) : kFloorExponent;
    return kTop + (kHeight - kTop - kBottom) * (top_exponent - exponent) /
                      (top_exponent - kFloorExponent);
  }
};

void draw_axes(std::ostringstream& svg, const Axes& axes, double lr) {
  svg << "<text x='" << kWidth / 2 << "' y='28' text-anchor='middle' font-size='16'>"
      << "Largest parameter difference between ranks, per step</text>\n";
  for (double exponent = kFloorExponent; exponent <= axes.top_exponent; ++exponent) {
    const double y = axes.y(std::pow(10.0, exponent));
    svg << "<line x1='" << kLeft << "' x2='" << kWidth - kRight << "' y1='" << y << "' y2='" << y
        << "' stroke='#ddd'/><text x='" << kLeft - 8 << "' y='" << y + 4
        << "' text-anchor='end' font-size='11'>"
        << (exponent == kFloorExponent ? "identical" : "1e" + std::to_string(int(exponent)))
        << "</text>\n";
  }
  const double two_lr = axes.y(2 * lr);
  svg << "<line x1='" << kLeft << "' x2='" << kWidth - kRight << "' y1='" << two_lr << "' y2='"
      << two_lr << "' stroke='#999' stroke-dasharray='4 3'/><text x='" << kLeft + 4 << "' y='"
      << two_lr - 4 << "' font-size='11' fill='#666'>2 lr</text>\n";
  // Every step labelled in short runs; about ten round steps in long ones.
  int64_t every = 1;
  for (int64_t unit = 1; axes.steps / every > 12; unit *= 10) {
    for (const int64_t factor : {1, 2, 5}) {
      every = unit * factor;
      if (axes.steps / every <= 12) break;
    }
  }
  for (int64_t step = 1; step <= axes.steps; step = (step == 1 && every > 1) ? every : step + every) {
    svg << "<text x='" << axes.x(double(step)) << "' y='" << kHeight - kBottom + 18
        << "' text-anchor='middle' font-size='11'>" << step << "</text>\n";
  }
  svg << "<text x='" << (kLeft + kWidth - kRight) / 2 << "' y='" << kHeight - 18
      << "' text-anchor='middle' font-size='12'>optimizer step</text>\n";
}

void draw_policy(std::ostringstream& svg, const Axes& axes, const PolicyFigures& figures,
                 size_t index) {
  const char* color = kColors[index % 4];
  std::ostringstream points;
  for (size_t step = 0; step < figures.steps.size(); ++step) {
    const double x = axes.x(double(step + 1)) + 3.0 * double(index);  // overlapping lines stay visible
    const double y = axes.y(figures.steps[step].max_cross_rank_difference);
    points << x << ',' << y << ' ';
    if (figures.steps.size() > kMostDots) continue;  // a long run: the line alone
    svg << "<circle cx='" << x << "' cy='" << y << "' r='4' fill='" << color << "'/>\n";
  }
  svg << "<polyline points='" << points.str() << "' fill='none' stroke='" << color
      << "' stroke-width='2'/>\n";
  const double legend_y = kTop + 20.0 * double(index);
  svg << "<rect x='" << kWidth - kRight + 16 << "' y='" << legend_y - 9
      << "' width='12' height='12' fill='" << color << "'/><text x='" << kWidth - kRight + 34
      << "' y='" << legend_y + 1 << "' font-size='12'>" << figures.policy->name
      << (figures.skipped.empty() ? "" : " (skipped)") << "</text>\n";
}

}  // namespace

void write_drift_svg(const std::string& path, const RunResults& results) {
  std::vector<const PolicyFigures*> figures;
  for (const PolicyRun& run : results.policies) figures.push_back(&run.figures);
  // The axis ends above the largest finite difference, and never beyond float32's range:
  // one grid line per power of ten is drawn up to it.
  double largest = 2 * results.config.adamw.lr;
  for (const PolicyFigures* policy : figures) {
    for (const StepFigures& step : policy->steps) {
      if (std::isfinite(step.max_cross_rank_difference)) {
        largest = std::max<double>(largest, step.max_cross_rank_difference);
      }
    }
  }
  const double top = std::ceil(std::log10(largest));
  const Axes axes{results.config.steps,
                  std::isfinite(top) ? std::clamp(top, kFloorExponent + 1, 39.0) : 39.0};
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth << "' height='" << kHeight
      << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  draw_axes(svg, axes, results.config.adamw.lr);
  for (size_t i = 0; i < figures.size(); ++i) draw_policy(svg, axes, *figures[i], i);
  svg << "</svg>\n";
  write_output_file(path, svg.str());
}

}  // namespace seqpar::repro
