#pragma once
// --numerics N: the library's numerics report (amp::nn::Numerics) every N
// steps, written beside --csv FILE as FILE's stem + "_numerics.csv" (one row
// per level, step and tensor, steps counted from 1 as in FILE;
// scripts/plot.py draws it as heat maps), and
// the skipped steps' log lines naming the tensor whose gradient backward
// found non-finite first (where the overflow began).
#include <cmath>
#include <cstdio>
#include <exception>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <amp/model/numerics.hpp>

#include "common/step_figures.hpp"

namespace examples {

// out/run.csv -> out/run_numerics.csv
inline std::string numerics_path(const std::string& csv) {
  const auto slash = csv.find_last_of('/');
  const auto dot = csv.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_ext ? csv.substr(0, dot) : csv) + "_numerics.csv";
}

struct LevelNumerics {
  std::string level;
  std::vector<amp::nn::NumericsRow> rows;
};

inline std::string numerics_csv(const std::vector<LevelNumerics>& levels) {
  std::ostringstream c;
  c.precision(9);
  c << "level,step,tensor,kind,dtype,count,zero,subnormal,overflow,underflow,amax,scale,range\n";
  for (const auto& l : levels)
    for (const auto& r : l.rows)
      c << l.level << "," << r.step + 1 << "," << r.tensor << "," << r.kind << "," << r.dtype << "," << r.count << ","
        << r.zero << "," << r.subnormal << "," << r.overflow << "," << r.underflow << "," << r.amax << "," << r.scale
        << "," << r.range << "\n";
  return c.str();
}

// Each skipped step of recs (the first `shown`, then a count; steps from 1), with the tensor where backward met
// the inf/NaN first, or the loss when it is not finite.
template <class Names>
void log_skips(const std::string& level, long long first_step, const std::vector<StepFigures>& recs,
               long long skipped_before, const Names& table, int shown = 5) {
  int told = 0, more = 0;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const long long before = i ? recs[i - 1].skipped : skipped_before;
    if (recs[i].skipped == before) continue;
    if (told++ >= shown) {
      ++more;
      continue;
    }
    const int t = recs[i].first_nonfinite;
    const std::string why = !std::isfinite(recs[i].loss) ? "the loss is inf/NaN: the forward overflowed (the report's "
                                                           "activation rows show where)"
                            : t >= 0 ? "backward met an inf/NaN first in the gradient of '" +
                                           table[static_cast<std::size_t>(t)].name + "'"
                                     : "the gradients' norm overflowed fp32";
    std::printf("  %-7s step %lld skipped: %s\n", level.c_str(), first_step + static_cast<long long>(i) + 1, why.c_str());
  }
  if (more) std::printf("  %-7s ... and %d more skipped steps\n", level.c_str(), more);
}

// Runs f when its scope is left by an exception (a diverged run's last words;
// an error of f's own is dropped: the first error is the one to report).
template <class F>
class SkipLogOnError {
 public:
  SkipLogOnError(bool on, F f) : on_(on), f_(std::move(f)), exceptions_(std::uncaught_exceptions()) {}
  SkipLogOnError(const SkipLogOnError&) = delete;
  SkipLogOnError& operator=(const SkipLogOnError&) = delete;
  ~SkipLogOnError() {
    if (!on_ || std::uncaught_exceptions() <= exceptions_) return;
    try {
      f_();
    } catch (...) {
    }
  }

 private:
  bool on_;
  F f_;
  int exceptions_;
};

}  // namespace examples
