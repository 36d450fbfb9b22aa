#pragma once
// A small SVG line chart: one panel per quantity, one polyline per series,
// linear or log10 y axis. Enough to see at a glance that opt levels train alike.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace examples {

struct Series {
  std::string name;
  std::vector<double> y;  // one value per step
};

struct Panel {
  std::string title;
  bool log_y = false;
  std::vector<Series> series;
};

inline std::string svg_plot(const std::string& title, const std::vector<Panel>& panels) {
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  const double w = 900, ph = 320, left = 70, right = 150, top = 40, gap = 50;
  const double h = top + panels.size() * (ph + gap);
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='" << w / 2 << "' y='22' text-anchor='middle' font-size='16'>" << title << "</text>\n";
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const Panel& panel = panels[p];
    const double y0 = top + p * (ph + gap), pw = w - left - right;
    auto tr = [&](double v) { return panel.log_y ? std::log10(std::max(v, 1e-30)) : v; };
    double lo = 1e300, hi = -1e300;
    std::size_t n = 1;
    for (const auto& ser : panel.series) {
      n = std::max(n, ser.y.size());
      for (double v : ser.y)
        if (std::isfinite(v)) lo = std::min(lo, tr(v)), hi = std::max(hi, tr(v));
    }
    if (!(hi > lo)) hi = lo + 1;
    const double pad = 0.05 * (hi - lo);
    lo -= pad, hi += pad;
    s << "<rect x='" << left << "' y='" << y0 << "' width='" << pw << "' height='" << ph
      << "' fill='none' stroke='#999'/>\n<text x='" << left << "' y='" << y0 - 8 << "'>" << panel.title
      << (panel.log_y ? " (log scale)" : "") << "</text>\n";
    for (int t = 0; t <= 4; ++t) {
      const double v = lo + (hi - lo) * t / 4, yy = y0 + ph - ph * t / 4;
      s << "<text x='" << left - 6 << "' y='" << yy + 4 << "' text-anchor='end'>"
        << (panel.log_y ? std::pow(10.0, v) : v) << "</text>\n";
    }
    s << "<text x='" << left + pw / 2 << "' y='" << y0 + ph + 18 << "' text-anchor='middle'>step (0.." << n - 1
      << ")</text>\n";
    for (std::size_t k = 0; k < panel.series.size(); ++k) {
      const auto& ser = panel.series[k];
      s << "<polyline fill='none' stroke-width='1.2' stroke='" << colors[k % 6] << "' points='";
      const std::size_t stride = std::max<std::size_t>(1, ser.y.size() / 1500);  // keep files small
      for (std::size_t i = 0; i < ser.y.size(); i += stride) {
        if (!std::isfinite(ser.y[i])) continue;
        s << left + pw * i / std::max<std::size_t>(1, n - 1) << "," << y0 + ph - ph * (tr(ser.y[i]) - lo) / (hi - lo)
          << " ";
      }
      s << "'/>\n<text x='" << left + pw + 10 << "' y='" << y0 + 16 + 16 * k << "' fill='" << colors[k % 6] << "'>"
        << ser.name << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace examples
