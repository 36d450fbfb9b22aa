#pragma once
// FP8 scaling state of a model whose policy has an fp8 alias (policy.hpp's
// Fp8): for each Linear that runs in FP8, three operands (its input, its
// weight, its output gradient), each with an amax, an amax history, a scale
// and 1 / scale in backend memory; the weight's FP8 codes and their transpose
// (what the input-gradient GEMM reads), refreshed once per step like the
// other cast caches; and which Linears run in FP8: the policy keeps the first
// and last layers with weights in compute_type<gemm>, in the order of the
// model's first forward (Model's first planning pass finds it).
//
// A cast writes the codes (and their transpose) and finds the tensor's amax in
// the same pass (a per-row maximum, then one small pass over the rows). Its
// math is one functor; the mapping is the backend's: a thread a row on the
// host, and on the GPU a warp a row, or 32 x 32 tiles through shared memory
// where a transpose is written (backend/cuda/cast_transposed.cuh), since a row
// op would scatter the transpose one byte at a time. Both count one launch. Delayed scaling: casts
// use the scale and combine their amax into the operand's; the optimizer's
// step folds it into the history and sets the next scale, on the device
// (under data parallel, after a maximum of the amaxes over the ranks).
// Current scaling: each cast first finds its tensor's amax and scale.
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/backend/rows.hpp"
#include "amp/policy.hpp"
#if defined(__CUDACC__)
#include "amp/backend/cuda/cast_transposed.cuh"
#endif

namespace amp::nn {

enum class fp8_operand { input = 0, weight = 1, grad = 2 };
inline constexpr int fp8_operands = 3;
inline constexpr const char* fp8_operand_name(fp8_operand o) {
  return o == fp8_operand::input ? "input" : o == fp8_operand::weight ? "weight" : "grad";
}

// Where ops find one operand's scaling (backend memory).
struct Fp8Meta {
  float* amax;       // this iteration's amax so far: casts combine into it
  float* scale;      // codes = encode(x * scale)
  float* scale_inv;  // what the GEMM multiplies by
};

namespace detail {
AMP_HOST_DEVICE inline float magnitude(float x) { return x < 0.0f ? -x : x; }

// codes[r][c] = encode(x[r][c] * scale), the transpose into codes_t[c][r]
// (when asked), and row r's amax into row_amax[r] (when asked), in one pass.
// A finite value past the range saturates (a delayed scale meets a larger
// tensor); an infinity becomes NaN, not the largest code, so an overflow
// upstream still reaches the step's check instead of training on, saturated.
// A row op; value, factor and encode are the element math the GPU's tiled
// cast (backend/cuda/cast_transposed.cuh) runs too.
template <class T, class F>
struct Fp8CastOp {
  const T* x;
  F* codes;
  F* codes_t;
  std::int64_t rows, cols;
  const float* scale;
  float* row_amax;
  AMP_HOST_DEVICE float value(std::int64_t r, std::int64_t c) const { return cast<float>(x[r * cols + c]); }
  AMP_HOST_DEVICE float factor() const { return *scale; }
  AMP_HOST_DEVICE static F encode(float v, float s) {
    return fp8_from_float<F>(is_finite(v) ? v * s : v - v);  // inf - inf: NaN
  }
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const auto row = static_cast<std::int64_t>(r);
    const float s = factor();
    if (row_amax) {
      const float m = lanes.max(cols, [&](std::int64_t c) { return magnitude(value(row, c)); });
      lanes.each(1, [&](std::int64_t) { row_amax[r] = m; });
    }
    lanes.each(cols, [&](std::int64_t c) {
      const F q = encode(value(row, c), s);
      codes[row * cols + c] = q;
      if (codes_t) codes_t[c * rows + row] = q;
    });
  }
};

// Row r's amax alone (current scaling's first pass).
template <class T>
struct RowAmaxOp {
  const T* x;
  std::int64_t cols;
  float* row_amax;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const T* xr = x + static_cast<std::int64_t>(r) * cols;
    const float m = lanes.max(cols, [&](std::int64_t c) { return magnitude(cast<float>(xr[c])); });
    lanes.each(1, [&](std::int64_t) { row_amax[r] = m; });
  }
};

// The rows' amaxes into the operand: combined into its amax (delayed), or
// setting its amax and scale now (current). One row of `rows` values.
template <bool Current, int Margin>
struct Fp8AmaxOp {
  const float* row_amax;
  std::int64_t rows;
  Fp8Meta meta;
  float fp8_max;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t) const {
    const float m = lanes.max(rows, [&](std::int64_t c) { return row_amax[c]; });
    lanes.each(1, [&](std::int64_t) {
      if constexpr (Current) {
        *meta.amax = m;
        *meta.scale = fp8_scale_for(fp8_max, m, *meta.scale, Margin);
        *meta.scale_inv = 1.0f / *meta.scale;
      } else if (m > *meta.amax) {
        *meta.amax = m;
      }
    });
  }
};

// Delayed scaling's step for operand i, a row of its History amaxes: this
// iteration's amax takes the slot at *position (a non-finite amax counts as
// none, so it cannot pin the scale for a whole window), the scale follows the
// window's maximum, the amax restarts. The window's other slots are reduced by
// the lanes, the new one added after, so no lane reads a slot another writes.
template <int History, int Margin>
struct Fp8DelayedUpdateOp {
  float* history;  // [operands x History]
  float* amax;
  float* scale;
  float* scale_inv;
  const std::int32_t* position;
  float forward_max, backward_max;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t i) const {
    float* h = history + i * History;
    const std::int32_t at = *position;
    const float now = is_finite(amax[i]) ? amax[i] : 0.0f;
    const float rest = lanes.max(History, [&](std::int64_t k) { return k == at ? 0.0f : h[k]; });
    lanes.each(1, [&](std::int64_t) {
      h[at] = now;
      const float fp8_max = i % fp8_operands == static_cast<std::size_t>(fp8_operand::grad) ? backward_max : forward_max;
      scale[i] = fp8_scale_for(fp8_max, now > rest ? now : rest, scale[i], Margin);
      scale_inv[i] = 1.0f / scale[i];
      amax[i] = 0.0f;
    });
  }
};

struct Fp8InverseOp {
  const float* scale;
  float* inverse;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { inverse[i] = 1.0f / scale[i]; }
};

struct Fp8AdvanceOp {
  std::int32_t* position;
  int history;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *position = (*position + 1) % history; }
};
}  // namespace detail

// x [rows x cols] as FP8 codes with `meta`'s scale (and their transpose when
// codes_t is given), recording the amax when `record` (training forwards and
// backwards; not planning or evaluation).
template <class Recipe, class F, class Ctx, class T>
void fp8_cast(Ctx& ctx, const T* x, std::int64_t rows, std::int64_t cols, F* codes, F* codes_t, Fp8Meta meta,
              bool record) {
  constexpr float fp8_max = fp8_format<F>::max;
  // The GPU casts with a transpose in tiles, with a maximum per row and column chunk; otherwise one per row.
  bool tiled = false;
  std::int64_t partials = rows;
  if constexpr (std::is_same_v<Ctx, Context<cuda>>) {
    tiled = codes_t != nullptr;
    if (tiled) partials = rows * cast_transposed_partials(ctx, cols);
  }
  float* row_amax = ctx.template scratch<float>(scratch_slot::fp8_amax, static_cast<std::size_t>(partials));
  const auto n = static_cast<std::size_t>(rows);
  if constexpr (!Recipe::delayed) {
    for_each_row(ctx, n, cols, detail::RowAmaxOp<T>{x, cols, row_amax});
    for_each_row(ctx, 1, rows, detail::Fp8AmaxOp<true, Recipe::margin>{row_amax, rows, meta, fp8_max});
    record = false;
  }
  const detail::Fp8CastOp<T, F> op{x, codes, codes_t, rows, cols, meta.scale, record ? row_amax : nullptr};
  if (!tiled) for_each_row(ctx, n, cols, op);
  if constexpr (std::is_same_v<Ctx, Context<cuda>>)
    if (tiled) cast_transposed(ctx, rows, cols, op, codes, codes_t, op.row_amax);
  if (record) for_each_row(ctx, 1, partials, detail::Fp8AmaxOp<false, Recipe::margin>{row_amax, partials, meta, fp8_max});
}

// One Linear's FP8 record, as the store's summary shows it.
struct Fp8Layer {
  std::string name;
  int weight_index = -1;  // in the parameter table
  std::int64_t out = 0, in = 0;
  bool enabled = true;
};

template <Policy P, Backend B>
class Fp8State {
 public:
  static constexpr bool active = uses_fp8_v<P>;
  using config = fp8_config_t<P>;
  using Fw = typename config::forward_type;

  // A Linear declares its GEMMs while the model is built: its slot (-1 when the policy has no FP8).
  int declare(int weight_index, std::string name, std::int64_t out, std::int64_t in) {
    if constexpr (!active) {
      return -1;
    } else {
      layers_.push_back({std::move(name), weight_index, out, in, true});
      weights_.emplace_back();
      return static_cast<int>(layers_.size()) - 1;
    }
  }

  // Scales 1, histories and amaxes 0.
  void allocate(Context<B>& ctx) {
    if constexpr (active) {
      ctx_ = &ctx;
      const std::size_t n = layers_.size() * fp8_operands;
      history_ = Buffer<float, B>(ctx, n * history, memory_kind::optimizer);
      amax_ = Buffer<float, B>(ctx, n, memory_kind::optimizer);
      scale_ = Buffer<float, B>(ctx, n, memory_kind::optimizer);
      scale_inv_ = Buffer<float, B>(ctx, n, memory_kind::optimizer);
      position_ = Buffer<std::int32_t, B>(ctx, 1, memory_kind::optimizer);
      reset();
    }
  }
  void reset() {
    if constexpr (active) {
      fill(*ctx_, history_.span(), 0.0f);
      fill(*ctx_, amax_.span(), 0.0f);
      fill(*ctx_, scale_.span(), 1.0f);
      fill(*ctx_, scale_inv_.span(), 1.0f);
      fill(*ctx_, position_.span(), std::int32_t{0});
    }
  }

  // Which layers stay out of FP8: layers with weights report each call in
  // their forward (a tied head reports its embedding's weight again); during
  // a discovery pass the calls are recorded, and resolve() keeps the first
  // keep_first and the last keep_last distinct weights out of FP8.
  void begin_discovery() { discovering_ = true, calls_.clear(); }
  void visit(int weight_index) {
    if (discovering_) calls_.push_back(weight_index);
  }
  void resolve() {
    if constexpr (active) {
      discovering_ = false;
      std::vector<int> kept;
      const auto keep = [&](auto begin, auto end, int count) {
        std::vector<int> seen;
        for (auto it = begin; it != end && static_cast<int>(seen.size()) < count; ++it)
          if (std::find(seen.begin(), seen.end(), *it) == seen.end()) seen.push_back(*it);
        kept.insert(kept.end(), seen.begin(), seen.end());
      };
      keep(calls_.begin(), calls_.end(), config::keep_first);
      keep(calls_.rbegin(), calls_.rend(), config::keep_last);
      for (auto& l : layers_) l.enabled = std::find(kept.begin(), kept.end(), l.weight_index) == kept.end();
    }
  }
  bool enabled(int slot) const { return slot >= 0 && !discovering_ && layers_[static_cast<std::size_t>(slot)].enabled; }

  Fp8Meta meta(int slot, fp8_operand o) {
    const auto i = static_cast<std::size_t>(slot * fp8_operands + static_cast<int>(o));
    return {amax_.data() + i, scale_.data() + i, scale_inv_.data() + i};
  }

  // The weight's FP8 codes [out x in] and their transpose [in x out], cast
  // from `values` when the values changed (once per step), allocated at the
  // first use (the model's planning pass). `record`: a training forward.
  struct WeightCodes {
    const Fw* codes;       // [out x in]
    const Fw* transposed;  // [in x out]
  };
  template <class S>
  WeightCodes weights(int slot, const S* values, bool record) {
    const Fp8Layer& l = layers_[static_cast<std::size_t>(slot)];
    WeightCache& w = weights_[static_cast<std::size_t>(slot)];
    const auto count = static_cast<std::size_t>(l.out * l.in);
    if (!w.codes.data()) {
      w.codes = Buffer<Fw, B>(*ctx_, count, memory_kind::weights);
      w.codes_t = Buffer<Fw, B>(*ctx_, count, memory_kind::weights);
    }
    if (w.version != version_) {
      fp8_cast<recipe>(*ctx_, values, l.out, l.in, w.codes.data(), w.codes_t.data(), meta(slot, fp8_operand::weight),
                       record);
      // An unrecorded delayed cast (planning, evaluation) is redone by the next training forward.
      if (record || !recipe::delayed) w.version = version_;
    }
    return {w.codes.data(), w.codes_t.data()};
  }
  void mark_updated() { ++version_; }

  // The optimizer's step: delayed scaling's update, on the device (no sync).
  void step() {
    if constexpr (active && recipe::delayed) {
      if (layers_.empty()) return;
      for_each_row(*ctx_, layers_.size() * fp8_operands, history,
               detail::Fp8DelayedUpdateOp<history, recipe::margin>{
                   history_.data(), amax_.data(), scale_.data(), scale_inv_.data(), position_.data(),
                   fp8_format<Fw>::max, fp8_format<typename config::backward_type>::max});
      for_each(*ctx_, 1, detail::Fp8AdvanceOp{position_.data(), history});
    }
  }

  // This iteration's amaxes of every operand, contiguous: what a maximum over
  // data-parallel ranks combines before step(), so every rank scales alike.
  // Empty where step() reads none (no FP8; current scaling scales each cast
  // by its own tensor's amax). Never NaN (a NaN amax is not combined in),
  // so the maximum does not depend on the order.
  Span<float> step_amaxes() {
    if constexpr (active && recipe::delayed) return amax_.span();
    else return {};
  }

  // --- inspection and checkpoints -------------------------------------------
  const std::vector<Fp8Layer>& layers() const { return layers_; }
  std::size_t operands() const { return layers_.size() * fp8_operands; }
  Span<float> history_values() const { return history_.span(); }
  Span<float> amax_values() const { return amax_.span(); }
  Span<float> scale_values() const { return scale_.span(); }
  Span<std::int32_t> position() const { return position_.span(); }
  // After the scales were set from outside (a checkpoint): their inverses.
  void refresh_inverses() {
    if constexpr (active) for_each(*ctx_, operands(), detail::Fp8InverseOp{scale_.data(), scale_inv_.data()});
  }

 private:
  using recipe = typename config::recipe;
  static constexpr int history = recipe::history;
  struct WeightCache {
    Buffer<Fw, B> codes, codes_t;
    std::uint64_t version = 0;
  };

  Context<B>* ctx_ = nullptr;
  std::vector<Fp8Layer> layers_;
  std::vector<WeightCache> weights_;
  std::vector<int> calls_;  // weight indices of the layer calls of the discovery pass
  bool discovering_ = false;
  std::uint64_t version_ = 1;
  Buffer<float, B> history_, amax_, scale_, scale_inv_;
  Buffer<std::int32_t, B> position_;
};

}  // namespace amp::nn
