#pragma once
// One optimizer's gradients of one iteration, as the loss scalers check them
// and its update consumes them. They start in the models' gradient arenas (in
// grad_type, scaled by a loss scaler). A check reduces them into statistics
// and ORs an overflow into this optimizer's device flag (the verdict is per
// optimizer, as in PyTorch). A scaler's unscale() moves them, divided by its
// scale, into fp32 buffers here, where they can be read and edited before the
// step (so a gradient of 2e-8 at scale 2^16 survives under O2, as Apex
// unscales into fp32 master gradients). Several scalers may check and unscale
// one optimizer's gradients (Apex's num_losses): their shares add, and an
// overflow in any skips the step. What the update needs comes out as a
// StepRecord; the update decides nothing about scaling.
//
// This object also knows whether the gradients are new: a step with no
// backward since the last step (the same gradients applied twice), or a
// backward that skipped the loss scale at a level that scales, is an error.
// (Inside a captured step nothing is checked: a replay reads whatever the
// buffers hold, and runs no host code.)
// Under ZeRO-1 all of this covers this rank's shard only, and the ranks'
// statistics are combined before the verdict (one decision for all ranks).
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/model/parameters.hpp"
#include "amp/scaling/grad_stats.hpp"
#include "amp/scaling/step_record.hpp"

namespace amp {

// What data parallel (amp::parallel::DataParallel) plugs into an optimizer's
// gradients: what each backward wrote is summed over the ranks before it is
// checked, so every rank sees the same overflow and takes the same step,
// and the update multiplies them by gradient_factor() (1/ranks) in its
// gradient coefficient instead of a separate averaging pass. Under ZeRO-1
// (shards() true) each rank receives the sums of its shard only, and the
// statistics of the ranks' shards are combined into one (on the device).
class GradientReducer {
 public:
  virtual void reduce_gradients() = 0;
  virtual float gradient_factor() const = 0;
  virtual bool shards() const { return false; }
  virtual void combine_stats(GradStats* /*stats*/) {}

 protected:
  ~GradientReducer() = default;
};

namespace detail {
// fp32 (+)= g / scale x factor, then g = 0; factor is data parallel's 1/ranks,
// so unscaled gradients read as averages.
template <class G>
struct UnscaleOp {
  G* g;
  float* out;
  const float* scale;
  float factor;
  bool add;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = cast<float>(g[i]) / (scale ? *scale : 1.0f) * factor;
    out[i] = add ? out[i] + v : v;
    g[i] = cast<G>(0.0f);
  }
};

// g *= min(1, max_norm / (norm + eps)) with the norm of *stats (PyTorch's
// clip_grad_norm_); gradients that overflowed are left for the skipped step.
struct ClipOp {
  float* g;
  const GradStats* stats;
  float max_norm, eps;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    if (overflowed(*stats)) return;
    const float norm = static_cast<float>(sqrt(stats->sumsq));
    if (norm > max_norm) g[i] *= max_norm / (norm + eps);
  }
};

struct OrOverflowOp {
  int* into;
  int* also;  // nullptr: none
  const GradStats* stats;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    if (!overflowed(*stats)) return;
    *into = 1;
    if (also) *also = 1;
  }
};
}  // namespace detail

template <Policy P, Backend B>
class Gradients {
 public:
  using Store = nn::ParameterStore<P, B>;

  struct Options {
    bool per_tensor_norms = false;  // keep each parameter's statistics too
    bool clips = false;             // the update clips: an edited fp32 copy gets fresh statistics
  };

  Gradients(Context<B>& ctx, const std::vector<Store*>& stores, Options options)
      : ctx_(&ctx), options_(options), found_(ctx, 1, memory_kind::optimizer), stats_(ctx, 1, memory_kind::optimizer),
        scratch_(ctx, 1, memory_kind::optimizer) {
    std::size_t tensors = 0;
    for (Store* s : stores) {
      AMP_REQUIRE(!options.per_tensor_norms || !s->sharded(), "optimizer: per_tensor_norms is not available under "
                  "ZeRO-1 (a rank holds the summed gradients of its shard only)");
      stores_.push_back({s, {}, {}});
      each_role_of(stores_.back(), [&](auto& r) { tensors += describe(*s, r); });
    }
    if (options.per_tensor_norms) {
      per_tensor_ = Buffer<GradStats, B>(ctx, tensors, memory_kind::optimizer);
      each_role([&](auto& r) { r.tensor_stats = TensorStats<B>(ctx, r.tensors, r.counts); });
    }
    views_.assign(nn::trained_roles * stores_.size(), nullptr);
    check_now(nullptr);  // sizes the reduction workspace now, not in the loop
    each_role([&](auto& r) { reserve_reduction<GradStats>(ctx, r.count); });  // the fp32 copy's statistics too
    fill(ctx, found_.span(), 0);  // (the gradients written before it are this optimizer's first iteration's)
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  // --- what a loss scaler calls -----------------------------------------------------
  // Reduces the gradients in the models' arenas (scaled) into this
  // iteration's statistics and ORs an overflow into this optimizer's flag and
  // into *also (the scaler's own; nullptr: none). Data parallel sums them over
  // the ranks first (once for what each backward wrote). `scales`: the
  // checking scaler multiplies the loss, so each backward of the iteration must have.
  void check(int* also, bool scales) {
    require_new("the check of this optimizer's gradients (step, unscale or clip_grad_norm)", scales);
    for (const auto& s : stores_)
      AMP_REQUIRE(!s.store->sharded() || (reducer_ && reducer_->shards()), "optimizer: the model is built with a "
                  "shard (ZeRO-1, ", s.store->shard().ranks, " ranks): train it under parallel::DataParallel with zero = 1");
    check_now(also);
    for (const auto& s : stores_) {  // the numerics report, when on (model/numerics.hpp)
      nn::observe_parameters(*s.store);
      nn::observe_fp8(*s.store);
      nn::observe_gradients(*s.store, found_.data());
    }
  }

  // Moves the gradients, divided by *scale (nullptr: 1), into the fp32 copy,
  // adding to what an earlier unscale() of this iteration left there.
  void unscale(const float* scale) {
    observe_loss_scale(scale);
    each_role([&](auto& r) {
      using G = typename std::remove_reference_t<decltype(r)>::G;
      if (!r.unscaled.data() && r.count) r.unscaled = Buffer<float, B>(*ctx_, r.count, memory_kind::grads);
      for_each(*ctx_, r.count,
               detail::UnscaleOp<G>{r.arena->grads().data + r.begin, r.unscaled.data(), scale, factor(), unscaled_});
      // ZeRO-1: the other ranks' parts (this rank's unsummed shares) are zeroed too, for the next loss's backward.
      const Span<G> all = r.arena->grads();
      if (r.begin > 0) fill(*ctx_, all.subspan(0, r.begin), cast<G>(0.0f));
      if (r.begin + r.count < all.size) fill(*ctx_, all.subspan(r.begin + r.count, all.size - r.begin - r.count), cast<G>(0.0f));
    });
    std::size_t k = 0;
    each_role([&](auto& r) { views_[k++] = r.unscaled.data(); });  // in place: a record's pointer stays valid
    unscaled_ = true;
    reduced_ = false;  // the arenas are empty: the next loss's backward (num_losses) is summed anew
  }

  // What the update consumes, after a check: the scale to divide by (or the
  // fp32 copy, with fresh statistics when the update clips what may have been edited).
  StepRecord record(const float* scale) {
    observe_loss_scale(scale);
    if (!unscaled_) return {scale, found_.data(), stats_.data(), factor(), nullptr};
    if (options_.clips) restat_unscaled();
    return {nullptr, found_.data(), stats_.data(), 1.0f, views_.data()};
  }

  // The iteration's gradients are consumed (a step) or dropped (zero_grad):
  // what backward writes from now on is the next iteration's.
  void end_iteration() {
    unscaled_ = false, reduced_ = false;
    fill(*ctx_, found_.span(), 0);
    saw_writes();
  }
  // A step that accumulates (not the last micro-batch): its backward must be new too.
  void end_micro_batch(bool scales) {
    require_new("step()", scales);
    saw_writes();
  }

  // --- what users read and edit ---------------------------------------------------------
  // The gradients are in the fp32 copy (a scaler's unscale() ran in this iteration).
  bool unscaled() const { return unscaled_; }
  // Parameter `index` of `store`: its unscaled fp32 gradient, to read or change before the step.
  Span<float> unscaled(const Store& store, int index) {
    AMP_REQUIRE(unscaled_, "Gradients::unscaled(): the gradients are not unscaled in this iteration; call "
                           "scaler.unscale(opt) first");
    for (auto& s : stores_) {
      if (s.store != &store) continue;
      const nn::ParamInfo& p = store.table().at(static_cast<std::size_t>(index));
      AMP_REQUIRE(p.kind != nn::role::buffer, "Gradients::unscaled(): '", p.name, "' is a buffer and has no gradient");
      AMP_REQUIRE(store.owns(p), "Gradients::unscaled(): '", p.name, "' is not all in this rank's shard (ZeRO-1): rank ",
                  store.shard().rank, " holds the summed gradients of its shard only");
      Span<float> out;
      each_role_of(s, [&](auto& r) {
        if (r.kind == p.kind) out = r.unscaled.span().subspan(p.offset - r.begin, p.count);
      });
      return out;
    }
    fail("Gradients::unscaled(): this optimizer does not train that model's parameters");
  }
  // Scales the fp32 copy so that its global norm is at most max_norm, on the
  // device; the norm before clipping stays in the statistics.
  void clip_unscaled(float max_norm, float eps) {
    restat_unscaled();
    each_role([&](auto& r) {
      if (r.unscaled.data()) for_each(*ctx_, r.count, detail::ClipOp{r.unscaled.data(), stats_.data(), max_norm, eps});
    });
  }
  // The last check's statistics: sum of squares, max |g| and non-finite count (one sync).
  GradStats last_stats() const { return download_one(*ctx_, static_cast<const GradStats*>(stats_.data())); }
  // Each parameter's gradient norm at the last check (per_tensor_norms): by role (weights, norms, fp32), store by store.
  std::vector<float> per_tensor_norms() const {
    AMP_REQUIRE(per_tensor_.data(), "per_tensor_norms(): construct the optimizer with per_tensor_norms = true");
    const auto s = download(*ctx_, Span<const GradStats>(per_tensor_.span()));
    std::vector<float> out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<float>(std::sqrt(s[i].sumsq));
    return out;
  }

  // Data parallel's hook (nullptr: none).
  void set_reducer(GradientReducer* r) { reducer_ = r; }

 private:
  // The gradients of one role of one store, and their fp32 unscaled copy.
  template <nn::role R>
  struct Role {
    static constexpr nn::role kind = R;
    using Arena = nn::RoleArena<P, B, R>;
    using G = typename Arena::grad_type;
    Arena* arena = nullptr;
    std::size_t begin = 0, count = 0;  // this rank's shard of the role (all of it without ZeRO-1)
    std::vector<std::size_t> tensors;  // offsets of its parameters, for per-tensor norms
    std::vector<std::size_t> counts;
    TensorStats<B> tensor_stats;       // per_tensor_norms: their statistics in three launches
    Buffer<float, B> unscaled;
  };
  struct StoreGradients {
    Store* store;
    std::tuple<Role<nn::role::weight>, Role<nn::role::norm>, Role<nn::role::fp32>> roles;  // nn::for_each_trained_role's order
    nn::GradientWrites seen;  // the store's writes when this iteration began
  };

  // A check or step needs gradients written since the iteration began, by
  // a backward that carried the loss scale where the checking scaler scales.
  void require_new(const char* what, bool scales) const {
    if (ctx_->capturing()) return;
    bool written = false, unscaled_backward = false;
    for (const auto& s : stores_) {
      const nn::GradientWrites w = s.store->gradient_writes();
      written = written || w.writes != s.seen.writes;
      unscaled_backward = unscaled_backward || w.unscaled_backwards != s.seen.unscaled_backwards;
    }
    AMP_REQUIRE(written, what, ": no backward since this optimizer's last step() or zero_grad(): the step would "
                "apply the same gradients again (run a backward first)");
    AMP_REQUIRE(!scales || !unscaled_backward, what, ": a backward of this iteration ran without the loss scale "
                "(loss.backward()), and this level scales the loss: write amp::scale_loss(loss, opt).backward() or "
                "scaler.scale(loss).backward(), so the step does not divide unscaled gradients by the scale");
  }

  void saw_writes() {
    ctx_->each_run_on_host([this] {
      for (auto& s : stores_) s.seen = s.store->gradient_writes();
    });
  }

  void check_now(int* also) {
    if (reducer_ && !std::exchange(reduced_, true)) reducer_->reduce_gradients();
    bool first = true;
    std::size_t tensor = 0;
    each_role([&](auto& r) {
      using G = typename std::remove_reference_t<decltype(r)>::G;
      const Span<const G> grads = Span<const G>(r.arena->grads()).subspan(r.begin, r.count);
      if (per_tensor_.data()) {
        if (!r.tensors.empty()) {
          r.tensor_stats(*ctx_, grads, per_tensor_.data() + tensor, stats_.data(), first);
          first = false;
        }
        tensor += r.tensors.size();
      } else if (r.count || first) {  // an empty role adds nothing (unless its statistics start the total)
        grad_stats(*ctx_, grads, scratch_.data());
        accumulate(scratch_.data(), first);
      }
    });
    if (reducer_) reducer_->combine_stats(stats_.data());
    for_each(*ctx_, 1, detail::OrOverflowOp{found_.data(), also, stats_.data()});
  }
  // The statistics of the fp32 copy (it may have been edited since the check).
  void restat_unscaled() {
    bool first = true;
    each_role([&](auto& r) {
      if (!r.count && !first) return;  // an empty role adds nothing
      grad_stats(*ctx_, Span<const float>(r.unscaled.data(), r.unscaled.data() ? r.count : 0), scratch_.data());
      accumulate(scratch_.data(), first);
    });
    if (reducer_) reducer_->combine_stats(stats_.data());
  }
  void observe_loss_scale(const float* scale) {
    for (const auto& s : stores_) s.store->numerics().observe_loss_scale(scale);
  }
  float factor() const { return reducer_ ? reducer_->gradient_factor() : 1.0f; }

  template <nn::role R>
  static std::size_t describe(Store& store, Role<R>& r) {
    r.arena = &store.template arena<R>();
    r.begin = r.arena->shard_begin(), r.count = r.arena->shard_count();
    for (const auto& p : store.table())
      if (p.kind == R) r.tensors.push_back(p.offset), r.counts.push_back(p.count);
    return r.tensors.size();
  }
  template <class F>
  static void each_role_of(StoreGradients& s, F&& f) {
    std::apply([&](auto&... r) { (f(r), ...); }, s.roles);
  }
  template <class F>
  void each_role(F&& f) {
    for (auto& s : stores_) each_role_of(s, f);
  }
  void accumulate(const GradStats* from, bool& first) {
    for_each(*ctx_, 1, amp::detail::AddGradStatsOp{stats_.data(), from, first});
    first = false;
  }

  Context<B>* ctx_;
  Options options_;
  std::vector<StoreGradients> stores_;
  Buffer<int, B> found_;  // an overflow in this iteration, from any scaler's check
  Buffer<GradStats, B> stats_, scratch_, per_tensor_;
  std::vector<const float*> views_;  // the fp32 copy per role, for the record (sized once: its address stays)
  bool unscaled_ = false, reduced_ = false;
  GradientReducer* reducer_ = nullptr;
};

}  // namespace amp
