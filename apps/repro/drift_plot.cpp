// The drift picture: per step and policy, how far apart the ranks' parameters are
// (solid) and how far rank 0's are from one-rank training (dashed), as a standalone
// SVG (opens in any browser), with the same series as CSV beside it. Log scale from
// 1e-9 up; a policy whose ranks stay bitwise identical runs along the floor, labelled
// as such. Every label sits in the margins, clear of the data.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "apps/repro/report.h"
#include "core/error.h"
#include "apps/common/output_file.h"

namespace seqpar::repro {

namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 90, kRight = 200, kTop = 50, kBottom = 60;
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
      << "Largest parameter difference, per step</text>\n";
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
      << two_lr << "' stroke='#999' stroke-dasharray='1 3'/><text x='" << kWidth - kRight + 4
      << "' y='" << two_lr + 4 << "' font-size='11' fill='#666'>2 lr</text>\n";
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

void draw_series(std::ostringstream& svg, const Axes& axes, const PolicyFigures& figures,
                 size_t index, float StepFigures::*series, bool dashed) {
  const char* color = kColors[index % 4];
  std::ostringstream points;
  for (size_t step = 0; step < figures.steps.size(); ++step) {
    const double x = axes.x(double(step + 1)) + 3.0 * double(index);  // overlapping lines stay visible
    const double y = axes.y(figures.steps[step].*series);
    points << x << ',' << y << ' ';
    if (figures.steps.size() > kMostDots) continue;  // a long run: the line alone
    svg << "<circle cx='" << x << "' cy='" << y << "' r='" << (dashed ? 2.5 : 4) << "' fill='"
        << (dashed ? "white" : color) << "' stroke='" << color << "'/>\n";
  }
  svg << "<polyline points='" << points.str() << "' fill='none' stroke='" << color
      << "' stroke-width='2'" << (dashed ? " stroke-dasharray='6 4'" : "") << "/>\n";
}

void draw_policy(std::ostringstream& svg, const Axes& axes, const PolicyFigures& figures,
                 size_t index) {
  draw_series(svg, axes, figures, index, &StepFigures::max_cross_rank_difference, false);
  draw_series(svg, axes, figures, index, &StepFigures::max_difference_from_baseline, true);
  const double legend_y = kTop + 20.0 * double(index);
  svg << "<rect x='" << kWidth - kRight + 40 << "' y='" << legend_y - 9
      << "' width='12' height='12' fill='" << kColors[index % 4] << "'/><text x='"
      << kWidth - kRight + 58 << "' y='" << legend_y + 1 << "' font-size='12'>"
      << figures.policy->name << (figures.skipped.empty() ? "" : " (skipped)") << "</text>\n";
}

// Which line is which, under the policies' names.
void draw_key(std::ostringstream& svg, size_t policies) {
  const double x = kWidth - kRight + 40, y = kTop + 20.0 * double(policies) + 16;
  svg << "<line x1='" << x << "' x2='" << x + 24 << "' y1='" << y << "' y2='" << y
      << "' stroke='#333' stroke-width='2'/><text x='" << x + 30 << "' y='" << y + 4
      << "' font-size='11'>across ranks</text>\n"
      << "<line x1='" << x << "' x2='" << x + 24 << "' y1='" << y + 18 << "' y2='" << y + 18
      << "' stroke='#333' stroke-width='2' stroke-dasharray='6 4'/><text x='" << x + 30
      << "' y='" << y + 22 << "' font-size='11'>from one rank</text>\n";
}

}  // namespace

std::string drift_svg(const RunResults& results) {
  std::vector<const PolicyFigures*> figures;
  for (const PolicyRun& run : results.policies) figures.push_back(&run.figures);
  // The axis ends above the largest finite difference, and never beyond float32's range:
  // one grid line per power of ten is drawn up to it.
  double largest = 2 * results.config.adamw.lr();
  for (const PolicyFigures* policy : figures) {
    for (const StepFigures& step : policy->steps) {
      for (const float difference : {step.max_cross_rank_difference, step.max_difference_from_baseline}) {
        if (std::isfinite(difference)) largest = std::max<double>(largest, difference);
      }
    }
  }
  const double top = std::ceil(std::log10(largest));
  const Axes axes{results.config.steps,
                  std::isfinite(top) ? std::clamp(top, kFloorExponent + 1, 39.0) : 39.0};
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth << "' height='" << kHeight
      << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  draw_axes(svg, axes, results.config.adamw.lr());
  for (size_t i = 0; i < figures.size(); ++i) draw_policy(svg, axes, *figures[i], i);
  draw_key(svg, figures.size());
  svg << "</svg>\n";
  return svg.str();
}

std::string drift_csv(const RunResults& results) {
  std::ostringstream csv;
  csv << "policy,step,max_difference_across_ranks,max_difference_from_one_rank\n";
  csv.precision(9);  // a float's every digit
  for (const PolicyRun& run : results.policies) {
    for (size_t step = 0; step < run.figures.steps.size(); ++step) {
      const StepFigures& figures = run.figures.steps[step];
      csv << run.figures.policy->name << ',' << step + 1 << ',' << figures.max_cross_rank_difference
          << ',' << figures.max_difference_from_baseline << '\n';
    }
  }
  return csv.str();
}

}  // namespace seqpar::repro
