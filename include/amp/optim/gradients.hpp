#pragma once
// The gradients one optimizer steps with, for one iteration. They start in the
// models' gradient arenas (in grad_type, scaled by a loss scaler); a scaler's
// unscale() moves them, divided by its scale, into fp32 buffers here, where
// they can be read and edited before the step (so a gradient of 2e-8 at scale
// 2^16 survives under O2, as Apex unscales into fp32 master gradients). Each
// check ORs the overflow it finds into this optimizer's device flag, and the
// step is skipped on the device when it is set: the verdict is per optimizer,
// as in PyTorch. Several scalers may check and unscale one optimizer's
// gradients (Apex's num_losses): their shares add, and an overflow in any
// skips the step. The fp32 buffers are allocated at the first unscale().
// Under ZeRO-1 all of this covers this rank's shard only, and the ranks'
// statistics are combined before the verdict (one decision for all ranks).
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/model/parameters.hpp"
#include "amp/scaling/grad_stats.hpp"

namespace amp::optim {

// What data parallel (amp::parallel::DataParallel) plugs into an optimizer:
// the gradients are summed over the ranks just before they are checked, so
// every rank sees the same overflow and takes the same step, and the step
// multiplies them by gradient_factor() (1/ranks) in its gradient coefficient
// instead of a separate averaging pass. Under ZeRO-1 (shards() true) each
// rank receives the sums of its shard only: the statistics of the ranks'
// shards are combined into one (combine_stats, on the device), and after the
// step each rank's updated values go to the others (gather_parameters).
class GradientReducer {
 public:
  virtual void reduce_gradients() = 0;
  virtual float gradient_factor() const = 0;
  virtual bool shards() const { return false; }
  virtual void combine_stats(GradStats* /*stats*/) {}
  virtual void gather_parameters() {}

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

  // The gradients of one role of one store, and their fp32 unscaled copy.
  template <nn::role R>
  struct Role {
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
    const Store* store;
    Role<nn::role::weight> weights;
    Role<nn::role::norm> norms;
  };

  Gradients(Context<B>& ctx, const std::vector<Store*>& stores, bool per_tensor_norms)
      : ctx_(&ctx), found_(ctx, 1, memory_kind::optimizer), stats_(ctx, 1, memory_kind::optimizer),
        scratch_(ctx, 1, memory_kind::optimizer) {
    std::size_t tensors = 0;
    for (Store* s : stores) {
      AMP_REQUIRE(!per_tensor_norms || !s->sharded(), "optimizer: per_tensor_norms is not available under ZeRO-1 (a "
                                                      "rank holds the summed gradients of its shard only)");
      stores_.push_back({s, {}, {}});
      tensors += describe(*s, stores_.back().weights) + describe(*s, stores_.back().norms);
    }
    if (per_tensor_norms) {
      per_tensor_ = Buffer<GradStats, B>(ctx, tensors, memory_kind::optimizer);
      each_role([&](auto& r) { r.tensor_stats = TensorStats<B>(ctx, r.tensors, r.counts); });
    }
    check(nullptr);  // sizes the reduction workspace now, not in the loop
    end_iteration();
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  // --- what a loss scaler calls -----------------------------------------------------
  // Reduces the gradients in the models' arenas (scaled) into this
  // iteration's statistics and ORs an overflow into this optimizer's flag and
  // into *also (the scaler's own; nullptr: none). Data parallel sums them over
  // the ranks first.
  void check(int* also) {
    if (reducer_) reducer_->reduce_gradients();
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
      } else {
        grad_stats(*ctx_, grads, scratch_.data());
        accumulate(scratch_.data(), first);
      }
    });
    if (reducer_) reducer_->combine_stats(stats_.data());
    for_each(*ctx_, 1, detail::OrOverflowOp{found_.data(), also, stats_.data()});
  }

  // Moves the gradients, divided by *scale (nullptr: 1), into the fp32 copy,
  // adding to what an earlier unscale() of this iteration left there.
  void unscale(const float* scale) {
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
    unscaled_ = true;
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
      const std::size_t begin = p.kind == nn::role::weight ? s.weights.begin : s.norms.begin;
      auto& r = p.kind == nn::role::weight ? s.weights.unscaled : s.norms.unscaled;
      return r.span().subspan(p.offset - begin, p.count);
    }
    fail("Gradients::unscaled(): this optimizer does not train that model's parameters");
  }
  // The last check's statistics: sum of squares, max |g| and non-finite count (one sync).
  GradStats last_stats() const { return download_one(*ctx_, static_cast<const GradStats*>(stats_.data())); }
  // Each parameter's gradient norm at the last check (per_tensor_norms): weights, then norms, store by store.
  std::vector<float> per_tensor_norms() const {
    AMP_REQUIRE(per_tensor_.data(), "per_tensor_norms(): construct the optimizer with per_tensor_norms = true");
    const auto s = download(*ctx_, Span<const GradStats>(per_tensor_.span()));
    std::vector<float> out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<float>(std::sqrt(s[i].sumsq));
    return out;
  }

  // --- what the optimizer reads -------------------------------------------------------
  const int* found_inf() const { return found_.data(); }
  const GradStats* stats() const { return stats_.data(); }
  // The statistics of the fp32 copy, for clipping what the step will use (it may have been edited).
  void restat_unscaled() {
    bool first = true;
    each_role([&](auto& r) {
      grad_stats(*ctx_, Span<const float>(r.unscaled.data(), r.unscaled.data() ? r.count : 0), scratch_.data());
      accumulate(scratch_.data(), first);
    });
    if (reducer_) reducer_->combine_stats(stats_.data());
  }
  // Scales the fp32 copy so that its global norm is at most max_norm, on the
  // device; the norm before clipping stays in the statistics.
  void clip_unscaled(float max_norm, float eps) {
    restat_unscaled();
    each_role([&](auto& r) {
      if (r.unscaled.data()) for_each(*ctx_, r.count, detail::ClipOp{r.unscaled.data(), stats_.data(), max_norm, eps});
    });
  }
  float factor() const { return reducer_ ? reducer_->gradient_factor() : 1.0f; }
  void set_reducer(GradientReducer* r) { reducer_ = r; }
  GradientReducer* reducer() const { return reducer_; }
  std::vector<StoreGradients>& stores() { return stores_; }
  // The iteration's gradients are consumed (a step) or dropped (zero_grad).
  void end_iteration() {
    unscaled_ = false;
    fill(*ctx_, found_.span(), 0);
  }

 private:
  template <nn::role R>
  static std::size_t describe(Store& store, Role<R>& r) {
    r.arena = &store.template arena<R>();
    r.begin = r.arena->shard_begin(), r.count = r.arena->shard_count();
    for (const auto& p : store.table())
      if (p.kind == R) r.tensors.push_back(p.offset), r.counts.push_back(p.count);
    return r.tensors.size();
  }
  template <class F>
  void each_role(F&& f) {
    for (auto& s : stores_) {
      f(s.weights);
      f(s.norms);
    }
  }
  void accumulate(const GradStats* from, bool& first) {
    for_each(*ctx_, 1, amp::detail::AddGradStatsOp{stats_.data(), from, first});
    first = false;
  }

  Context<B>* ctx_;
  std::vector<StoreGradients> stores_;
  Buffer<int, B> found_;  // an overflow in this iteration, from any scaler's check
  Buffer<GradStats, B> stats_, scratch_, per_tensor_;
  bool unscaled_ = false;
  GradientReducer* reducer_ = nullptr;
};

}  // namespace amp::optim
