#pragma once
// The numerics report (opt in: ModelOptions::numerics_every = N). Every N-th
// iteration, for each parameter, its gradient, each layer's output and the
// gradient that reaches it, and each FP8 operand: how the values sit in the
// type they are stored in. The fractions that are zero, subnormal (losing
// precision, next to flush), non-finite, and that underflowed a wider source
// (an fp16 weight whose fp32 master is not zero), and the largest |value|;
// for FP8 operands their amax, scale and how much of the format's range the
// scaled tensor reaches. Reduced on the device inside the iteration (no sync);
// downloaded when the rows are taken (one sync per take).
// When on, every iteration's overflow check also finds, on the device, the
// parameter backward reached first among those whose gradient holds an
// inf/NaN (the last in the table: an inf in a layer's output gradient turns
// every earlier layer's gradient inf or NaN too), so a skipped step's log
// names where the overflow began.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/tensor_chunks.hpp"
#include "amp/core/numeric.hpp"
#include "amp/core/traits.hpp"

namespace amp::nn {

// What a row of the report describes.
enum class numerics_site { parameter, gradient, activation, activation_grad, fp8 };
inline constexpr const char* numerics_site_name(numerics_site k) {
  switch (k) {
    case numerics_site::parameter: return "parameter";
    case numerics_site::gradient: return "gradient";
    case numerics_site::activation: return "activation";
    case numerics_site::activation_grad: return "activation_grad";
    default: return "fp8";
  }
}

// Counts over one tensor in its stored type.
struct ValueStats {
  std::uint32_t zero = 0, subnormal = 0, nonfinite = 0, underflow = 0;
  float amax = 0.0f;  // of the finite values
};

// One row of the report. Fractions are of `count`.
struct NumericsRow {
  std::int64_t step = 0;  // the iteration, from 0
  std::string tensor, kind, dtype;
  std::size_t count = 0;
  double zero = 0, subnormal = 0, overflow = 0;
  double underflow = -1;  // parameters with an fp32 master: non-zero there, zero or subnormal here; -1: no source
  float amax = 0;
  float scale = 1;  // gradients (of parameters and of layer outputs): the loss scale they carry; FP8 operands: their scale
  float range = 0;  // FP8 operands: amax x scale / the format's largest value (1: the codes saturate)
};

namespace detail {
template <class T>
struct ValueStatsOf {
  const T* v;
  const float* source;  // the wider values v was rounded from (nullptr: none)
  AMP_HOST_DEVICE ValueStats operator()(std::size_t i) const {
    const float x = cast<float>(v[i]);
    const float a = x < 0.0f ? -x : x;
    const bool finite = is_finite(x), zero = x == 0.0f;
    const bool sub = !zero && finite && a < cast<float>(limits<T>::min_normal());
    const bool under = source && source[i] != 0.0f && (zero || sub);
    return {zero ? 1u : 0u, sub ? 1u : 0u, finite ? 0u : 1u, under ? 1u : 0u, finite ? a : 0.0f};
  }
};
struct CombineValueStats {
  AMP_HOST_DEVICE ValueStats operator()(const ValueStats& a, const ValueStats& b) const {
    return {a.zero + b.zero, a.subnormal + b.subnormal, a.nonfinite + b.nonfinite, a.underflow + b.underflow,
            a.amax > b.amax ? a.amax : b.amax};
  }
};

// Non-finite gradients, counted only when this iteration's check found an
// overflow: otherwise no gradient is read.
template <class G>
struct GatedNonfiniteOf {
  const G* g;
  const int* found;
  AMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const {
    return *found && !is_finite(cast<float>(g[i])) ? 1u : 0u;
  }
};
struct AddCounts {
  AMP_HOST_DEVICE std::uint32_t operator()(std::uint32_t a, std::uint32_t b) const { return a + b; }
};
// *at = the largest parameter index among chunks with a non-finite gradient
// (-1: none), after (unless reset) what it held. Chunks come in table order:
// the search runs from the end and stops at the first hit.
struct LastNonfiniteOp {
  const std::uint32_t* counts;
  const std::int32_t* param;  // each chunk's parameter
  std::size_t chunks;
  const int* found;
  std::int32_t* at;
  bool reset;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    if (reset) *at = -1;
    if (!*found) return;
    for (std::size_t c = chunks; c-- > 0;)
      if (counts[c]) {
        if (param[c] > *at) *at = param[c];
        return;
      }
  }
};
}  // namespace detail

template <Backend B>
class Numerics {
 public:
  // Parameters of one role, reduced per tensor in two launches.
  struct Group {
    TensorChunks<B> chunks;
    std::vector<int> params;  // their indices in the store's table
    std::vector<std::string> names;
    std::vector<std::size_t> counts;
    Buffer<ValueStats, B> chunk_stats;
    Buffer<std::uint32_t, B> chunk_counts;
    Buffer<std::int32_t, B> chunk_param;
  };

  void enable(Context<B>& ctx, int every) {
    AMP_REQUIRE(every >= 0, "ModelOptions::numerics_every must be >= 0 (0: off), got ", every);
    ctx_ = &ctx, every_ = every;
    if (on()) {
      first_nonfinite_ = Buffer<std::int32_t, B>(ctx, 1, memory_kind::optimizer);
      fill(ctx, first_nonfinite_.span(), std::int32_t{-1});
    }
  }
  bool on() const { return every_ > 0; }
  int every() const { return every_; }
  // This iteration is reported.
  bool due() const { return on() && step_ % every_ == 0; }
  std::int64_t step() const { return step_; }
  void set_step(std::int64_t s) { step_ = s; }
  // An optimizer step ended the iteration (host bookkeeping: in a captured
  // step after each replay; a replay records nothing, so report steps run eagerly).
  void end_step() {
    if (!on()) return;
    const bool replayed = ctx_->capturing();  // the bookkeeping runs after each replay
    ctx_->after_step_on_host([this, replayed] {
      missed_ += replayed && due();
      open_ = false;
      ++step_;
    });
  }
  // Reported steps that ran as replays of a captured step, which records no report.
  std::int64_t missed() const { return missed_; }

  // One tensor of n values as stored (T), rounded from `source` when given.
  template <class T>
  void observe(numerics_site kind, std::string name, const T* v, std::size_t n, const float* source = nullptr) {
    if (!due() || ctx_->capturing()) return;
    Report& r = report();
    const auto where = take_slots(r, 1);
    add_site(r, {std::move(name), kind, dtype_of<T>(), n, source != nullptr}, where);
    transform_reduce(*ctx_, n, detail::ValueStatsOf<T>{v, source}, detail::CombineValueStats{}, ValueStats{}, at(r, where));
  }
  // The tensors of a group laid out from `base` (a role's arena), by name.
  template <class T>
  void observe_group(numerics_site kind, Group& g, const T* base, const float* source) {
    if (!due() || ctx_->capturing() || g.params.empty()) return;
    Report& r = report();
    const auto where = take_slots(r, g.params.size());
    for (std::size_t t = 0; t < g.params.size(); ++t)
      add_site(r, {g.names[t], kind, dtype_of<T>(), g.counts[t], source != nullptr}, {where.first, where.second + t});
    g.chunks.reduce(*ctx_, detail::ValueStatsOf<T>{base, source}, detail::CombineValueStats{}, ValueStats{},
                    g.chunk_stats.data(), at(r, where));
  }
  // Every FP8 operand: this iteration's amax and the scale its casts used.
  void observe_fp8(const std::vector<std::string>& names, Span<const float> amax, Span<const float> scale,
                   const std::vector<float>& format_max) {
    if (!due() || ctx_->capturing() || names.empty()) return;
    Report& r = report();
    r.fp8_names = names, r.fp8_max = format_max;
    if (r.fp8.size() != 2 * names.size()) r.fp8 = Buffer<float, B>(*ctx_, 2 * names.size(), memory_kind::workspace);
    ctx_->copy(r.fp8.data(), amax.data, amax.size * sizeof(float));
    ctx_->copy(r.fp8.data() + names.size(), scale.data, scale.size * sizeof(float));
  }
  // The loss scale this iteration's gradients carry.
  void observe_loss_scale(const float* scale) {
    if (!due() || ctx_->capturing() || !scale) return;
    Report& r = report();
    if (!r.loss_scale.data()) r.loss_scale = Buffer<float, B>(*ctx_, 1, memory_kind::workspace);
    ctx_->copy(r.loss_scale.data(), scale, sizeof(float));
    r.has_loss_scale = true;
  }

  // This iteration's parameter (table index) that backward reached first among
  // those with an inf/NaN gradient, -1: none (backend memory, int32).
  std::int32_t* first_nonfinite() const { return first_nonfinite_.data(); }
  // The groups of the store's roles (made at the first use).
  Group& group(std::size_t k) {
    if (groups_.size() <= k) groups_.resize(k + 1);
    return groups_[k];
  }

  // The rows of every report so far, oldest first (one sync); the reports'
  // memory is kept for the next ones.
  std::vector<NumericsRow> take() {
    std::vector<NumericsRow> rows;
    if (reports_.empty()) return rows;
    ctx_->synchronize();
    for (Report& r : reports_) append_rows(r, rows);
    for (Report& r : reports_) spare_.push_back(std::move(r));
    reports_.clear(), open_ = false;
    return rows;
  }

 private:
  struct Site {
    std::string name;
    numerics_site kind;
    std::string_view dtype;
    std::size_t count;
    bool has_source;
    std::size_t block = 0, slot = 0;  // where its statistics are
    std::string base = {};            // the name before a repeat's suffix
  };
  static constexpr std::size_t block_slots = 256;
  struct Report {
    std::int64_t step = 0;
    std::vector<Site> sites;
    std::vector<Buffer<ValueStats, B>> blocks;  // the sites' statistics
    std::size_t block = 0, used = 0;           // the block in use, and its slots taken
    Buffer<float, B> loss_scale;
    bool has_loss_scale = false;
    std::vector<std::string> fp8_names;
    std::vector<float> fp8_max;
    Buffer<float, B> fp8;  // amaxes, then scales
  };

  static bool carries_loss_scale(numerics_site k) {
    return k == numerics_site::gradient || k == numerics_site::activation_grad;
  }
  template <class T>
  static std::string_view dtype_of() {
    return type_name<T>();
  }
  Report& report() {
    if (!open_) {
      if (spare_.empty()) {
        reports_.emplace_back();
      } else {  // an earlier report's memory
        reports_.push_back(std::move(spare_.back()));
        spare_.pop_back();
      }
      Report& r = reports_.back();
      r.step = step_, r.sites.clear(), r.block = 0, r.used = 0, r.has_loss_scale = false, r.fp8_names.clear();
      open_ = true;
    }
    return reports_.back();
  }
  // n consecutive slots of a block of this report's statistics: {block, first slot}.
  std::pair<std::size_t, std::size_t> take_slots(Report& r, std::size_t n) {
    if (!r.blocks.empty() && r.used + n > r.blocks[r.block].size()) ++r.block, r.used = 0;
    while (r.block < r.blocks.size() && n > r.blocks[r.block].size()) ++r.block;  // too small for n
    if (r.block >= r.blocks.size()) {
      r.block = r.blocks.size();
      r.blocks.emplace_back(*ctx_, std::max(block_slots, n), memory_kind::workspace);
    }
    r.used += n;
    return {r.block, r.used - n};
  }
  ValueStats* at(Report& r, std::pair<std::size_t, std::size_t> where) {
    return r.blocks[where.first].data() + where.second;
  }
  // The site's row; a layer run twice in one iteration: name#2, name#3, ...
  void add_site(Report& r, Site site, std::pair<std::size_t, std::size_t> where) {
    std::size_t repeats = 0;
    for (const Site& s : r.sites) repeats += s.kind == site.kind && s.base == site.name;
    site.base = site.name;
    if (repeats) site.name += "#" + std::to_string(repeats + 1);
    site.block = where.first, site.slot = where.second;
    r.sites.push_back(std::move(site));
  }
  void append_rows(Report& r, std::vector<NumericsRow>& rows) const {
    std::vector<std::vector<ValueStats>> blocks;
    for (std::size_t k = 0; k <= r.block && k < r.blocks.size(); ++k)
      blocks.push_back(download(*ctx_, Span<const ValueStats>(r.blocks[k].span())));
    const float loss_scale = r.has_loss_scale ? download_one(*ctx_, static_cast<const float*>(r.loss_scale.data())) : 1.0f;
    for (const Site& s : r.sites) {
      const ValueStats& v = blocks[s.block][s.slot];
      const double n = s.count ? static_cast<double>(s.count) : 1.0;
      rows.push_back({r.step, s.name, numerics_site_name(s.kind), std::string(s.dtype), s.count, v.zero / n,
                      v.subnormal / n, v.nonfinite / n, s.has_source ? v.underflow / n : -1.0, v.amax,
                      carries_loss_scale(s.kind) ? loss_scale : 1.0f, 0.0f});
    }
    if (const std::size_t n = r.fp8_names.size()) {
      const auto f = download(*ctx_, Span<const float>(r.fp8.data(), 2 * n));
      for (std::size_t i = 0; i < n; ++i)
        rows.push_back({r.step, r.fp8_names[i], "fp8", "fp8", 0, 0, 0, 0, -1, f[i], f[n + i],
                        f[i] * f[n + i] / r.fp8_max[i]});
    }
  }

  Context<B>* ctx_ = nullptr;
  int every_ = 0;
  std::int64_t step_ = 0, missed_ = 0;
  std::vector<Report> reports_, spare_;
  bool open_ = false;  // the last report is this iteration's
  std::vector<Group> groups_;
  Buffer<std::int32_t, B> first_nonfinite_;
};

}  // namespace amp::nn
