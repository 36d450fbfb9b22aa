#pragma once
// The fused optimizers: their state and the update over the flat arenas
// (optim/step.hpp has the per-element math). The update consumes a
// StepRecord (scaling/step_record.hpp) from a loss scaler's check of this
// optimizer's gradients (scaling/gradients.hpp): the scale,
// this optimizer's overflow verdict and the statistics, all in backend
// memory. It decides nothing about scaling and calls nothing back: it is one
// fused pass, skipped on the device when the verdict says so, so a skipped
// step needs no host sync and leaves every bit as it was.
//
// The three-line form's step() reads top to bottom: the policy's own scaler
// checks the gradients and hands over the record, the update consumes it,
// the scaler updates its scale. What follows an update belongs to others:
// data parallel's gather (an UpdateHook, parallel/), the models' FP8 scales
// and cast caches (ParameterStore::after_step).
//
// Under ZeRO-1 (models built with a Shard) the state and the update cover
// this rank's shard of each role; data parallel (zero = 1) brings the shard's
// summed gradients and afterwards the other ranks' updated values.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "amp/model/parameters.hpp"
#include "amp/optim/options.hpp"
#include "amp/optim/rate.hpp"
#include "amp/optim/state.hpp"
#include "amp/optim/step.hpp"
#include "amp/scaling/gradients.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp::optim {

// Work that follows each update (data parallel's ZeRO-1 gather: every rank's
// updated shard to every rank).
class UpdateHook {
 public:
  virtual void after_update() = 0;

 protected:
  ~UpdateHook() = default;
};

namespace detail {
struct Wiring;
}

// Shared by SGD, Adam, AdamW and LAMB; Rule holds the per-element update.
template <Policy P, Backend B, class Rule>
class FusedOptimizer {
 public:
  using policy = P;
  using backend = B;
  using Store = nn::ParameterStore<P, B>;
  static constexpr int state_buffers = Rule::state_buffers;
  static constexpr const char* rule_name = Rule::name;

  using Scaler = default_scaler_t<P, B>;

  FusedOptimizer(std::vector<Store*> stores, Rule rule, float lr, float weight_decay, StepOptions options)
      : stores_(std::move(stores)),
        rule_(rule),
        options_(std::move(options)),
        ctx_(&check_stores(stores_)),
        rate_(*ctx_, lr, weight_decay, options_.groups),
        gradients_(*ctx_, stores_, {options_.per_tensor_norms, options_.max_grad_norm > 0}),
        state_(*ctx_, 1, memory_kind::optimizer),
        values_(*ctx_, 1, memory_kind::optimizer),
        scaler_(*ctx_, options_.scaler.value_or(default_scaler_config<P>())) {
    AMP_REQUIRE(options_.accumulation_steps >= 1, "optimizer: accumulation_steps must be >= 1, got ",
                options_.accumulation_steps);
    AMP_REQUIRE(options_.max_grad_norm >= 0, "optimizer: max_grad_norm must be >= 0, got ", options_.max_grad_norm);
    ctx_->template require<P>();
    for (Store* s : stores_) states_.emplace_back(*ctx_, *s, options_.groups);
    const OptimizerState init{};
    upload(*ctx_, state_.span(), &init, 1);
  }
  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;

  Context<B>& context() const { return *ctx_; }
  const std::vector<Store*>& stores() const { return stores_; }
  const StepOptions& options() const { return options_; }

  // Zeroes the gradients at the start of each accumulation window.
  void zero_grad() {
    if (micro_ != 0) return;
    for (Store* s : stores_) s->zero_grad();
    gradients_.end_iteration();
  }
  // The three-line form, after the scaled backward: the policy's own scaler
  // checks (unless unscale() did), the update runs (skipped on the device on
  // overflow), the scaler updates. With accumulation_steps = N, only every
  // Nth call steps. A step with no backward since the last, or after a
  // backward without the loss scale at a level that scales, is an error.
  void step() {
    if (!steps_next()) {
      gradients_.end_micro_batch(scaler_.multiplies());  // a throw changes nothing
      ++micro_;
      return;
    }
    const StepRecord record = scaler_.for_step(gradients_);
    micro_ = 0;
    update(record);
    scaler_.update();
  }
  // The policy's scaler (dynamic for fp16 levels, static for O3, none otherwise).
  Scaler& scaler() { return scaler_; }
  // This iteration's gradients: after scaler.unscale(opt), gradients().unscaled(store, i) reads and edits them.
  Gradients<P, B>& gradients() { return gradients_; }

  // --- the learning rate ----------------------------------------------------------
  // The rate of the next step (with a schedule: one sync, for its position).
  float lr() const { return rate_.at(steps()); }
  // A constant rate from the next step on (ends a schedule); groups keep their ratio to it.
  void set_lr(float lr) { rate_.set_lr(lr); }
  // The rate follows schedule(step) (evaluated on the device by each step;
  // groups keep their ratio to it). StepLR, CosineLR and LinearWarmup convert;
  // a schedule without base_lr starts from the current rate, as PyTorch's.
  void set_schedule(Schedule schedule) { rate_.set_schedule(schedule); }
  // Any rate as a function of the step (skipped steps count), evaluated here
  // once for steps 0 .. steps-1 into backend memory; later steps keep the last
  // rate. So a schedule of your own costs a step no host work either, and a
  // replayed step follows it.
  void set_schedule(const std::function<float(std::int64_t)>& rate, std::int64_t steps) {
    rate_.set_schedule(rate, steps);
  }

  // --- inspection and checkpoints -----------------------------------------------
  // Steps taken (applied or skipped), as a schedule sees them (one sync).
  std::int64_t steps() const { return state().steps; }
  void set_steps(std::int64_t s) {
    OptimizerState st = state();
    st.steps = s;
    set_state(st);
  }
  // Applied steps on the device (one sync).
  std::int64_t applied_steps() const { return state().t; }
  OptimizerState state() const { return download_one(*ctx_, static_cast<const OptimizerState*>(state_.data())); }
  void set_state(const OptimizerState& s) { upload(*ctx_, state_.span(), &s, 1); }
  // torch.nn.utils.clip_grad_norm_ for this optimizer's parameters, between
  // the scaled backward and step(): unscales the gradients (through its own
  // scaler unless one has already), scales them to a global norm of at most
  // max_norm and returns their unscaled global norm before clipping (inf when
  // they overflowed: the step is then skipped). One sync, for the norm.
  float clip_grad_norm(float max_norm) {
    AMP_REQUIRE(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm: max_norm must be finite and > 0, got ",
                max_norm);
    AMP_REQUIRE(steps_next(), "clip_grad_norm: call it before the step() that applies, after the last of the ",
                options_.accumulation_steps, " accumulated micro-batches");
    if (!gradients_.unscaled()) {
      AMP_REQUIRE(Scaler::mode == scaling::none || scaler_.scaled_this_iteration(),
                  "clip_grad_norm: the loss was not scaled by this optimizer's own "
                  "scaler (amp::scale_loss(loss, opt)): call scaler.unscale(opt) with the scaler that scaled it first");
      scaler_.unscale_gradients(gradients_);
    }
    // The fp32 copy holds the micro-batches' sum; the step uses their mean.
    const auto n = static_cast<float>(options_.accumulation_steps);
    gradients_.clip_unscaled(max_norm * n, clip_epsilon<Rule>() * n);
    const GradStats s = gradients_.last_stats();
    if (s.nonfinite) return std::numeric_limits<float>::infinity();
    return static_cast<float>(std::sqrt(s.sumsq)) / n;
  }
  // The last check's statistics: sum of squares and max |g| of the gradients
  // as the check saw them: scaled by the loss scale, unless unscale() or
  // clip_grad_norm() ran first (clip_grad_norm returns the unscaled norm).
  GradStats last_stats() const { return gradients_.last_stats(); }
  std::vector<float> per_tensor_norms() const { return gradients_.per_tensor_norms(); }
  // State buffer k (moments) of role R of store `store`, for inspection and
  // checkpoints: element k is element shard_begin() + k of the role's arena.
  template <nn::role R>
  Span<float> state_buffer(int k, std::size_t store = 0) const {
    return std::get<static_cast<std::size_t>(R)>(states_.at(store).roles).state[k].span();
  }

 private:
  friend struct amp::detail::StepAccess;
  friend struct detail::Wiring;

  // The update, once a scaler's check produced the record: the prologue
  // (this step's values from the verdict, the statistics and the schedule),
  // one fused pass per role (two for a per-tensor rule), the step count; then
  // the work that follows an update, each part by its owner.
  void update(const StepRecord& r) {
    const float inv_acc = r.factor / static_cast<float>(options_.accumulation_steps);
    const amp::optim::detail::PrepareStep<Rule> prologue{rule_,         state_.data(), rate_.hyper(),
                                                         r.stats,       r.scale,       r.found_inf,
                                                         options_.max_grad_norm, inv_acc};
    after_prologue(*ctx_, values_.data(), prologue, [this, r](const auto& launch, auto values) {
      if (amp::optim::detail::known_skip(values)) return;
      for (std::size_t k = 0; k < states_.size(); ++k)
        std::apply([&](auto&... st) {
          const float* const* unscaled = r.unscaled ? r.unscaled + nn::trained_roles * k : nullptr;
          (pass(launch, st, values, unscaled ? unscaled[static_cast<std::size_t>(st.kind)] : nullptr), ...);
        }, states_[k].roles);
    });
    for_each(*ctx_, 1, amp::optim::detail::AdvanceStateOp{state_.data(), values_.data()});
    if (after_update_) after_update_->after_update();
    for (Store* s : stores_) s->after_step();
    gradients_.end_iteration();
  }
  // The next step() applies a step (the last micro-batch of an accumulation window).
  bool steps_next() const { return micro_ + 1 >= options_.accumulation_steps; }

  template <nn::role R>
  using State = RoleState<P, B, R, Rule>;
  struct StoreState {
    StoreState(Context<B>& ctx, Store& s, const std::vector<ParamGroup>& groups)
        : roles{State<nn::role::weight>(ctx, s, groups), State<nn::role::norm>(ctx, s, groups),
                State<nn::role::fp32>(ctx, s, groups)} {}
    std::tuple<State<nn::role::weight>, State<nn::role::norm>, State<nn::role::fp32>> roles;  // nn::for_each_trained_role's order
  };

  static Context<B>& check_stores(const std::vector<Store*>& stores) {
    AMP_REQUIRE(!stores.empty() && stores.front(), "optimizer: no parameters");
    for (Store* s : stores)
      AMP_REQUIRE(s && &s->context() == &stores.front()->context() && s->allocated(),
                  "optimizer: every model must be built, on one context");
    return stores.front()->context();
  }

  // One role's fused pass over its shard (the pointers start at the shard;
  // the masters, state and unscaled gradients hold the shard only), reading
  // the fp32 copy when `unscaled` is set, else the arena's gradients.
  template <class Launch, class S, class Values>
  void pass(const Launch& launch, S& st, Values values, const float* unscaled) const {
    using Arena = typename S::Arena;
    const std::size_t begin = st.arena->shard_begin(), count = st.arena->shard_count();
    float* master = nullptr;
    if constexpr (Arena::has_master) master = st.arena->master().data;
    float* s1 = Rule::state_buffers > 0 ? st.state[0].data() : nullptr;
    float* s2 = Rule::state_buffers > 1 ? st.state[1].data() : nullptr;
    auto run = [&]<class Grad, bool Grouped>(const Grad* g) {
      using Stored = typename Arena::stored_type;
      if constexpr (per_tensor_rule<Rule>) {
        constexpr bool M = Arena::has_master;
        const amp::optim::detail::ChunkPass<Stored, Grad, Rule, Values> a{
            st.arena->values().data + begin, master, g, s1, s2, st.ids.data(), st.chunks.data(), st.sums.data(), rule_, values};
        const auto width = static_cast<std::int64_t>(tensor_chunk);
        launch.rows(st.chunks.size(), width, amp::optim::detail::ChunkNormsOp<Stored, Grad, Rule, M, Grouped, Values>{a});
        launch.rows(st.chunks.size(), width, amp::optim::detail::ChunkStepOp<Stored, Grad, Rule, M, Grouped, Values>{a});
      } else {
        launch.each(count, amp::optim::detail::FusedStepOp<Stored, Grad, Rule, Arena::has_master, Grouped, Values>{
                               st.arena->values().data + begin, master, g, s1, s2, st.ids.data(), rule_, values});
      }
    };
    const bool grouped = !options_.groups.empty();
    if (unscaled) {
      grouped ? run.template operator()<float, true>(unscaled) : run.template operator()<float, false>(unscaled);
    } else {
      using G = typename Arena::grad_type;
      const G* g = st.arena->grads().data + begin;
      grouped ? run.template operator()<G, true>(g) : run.template operator()<G, false>(g);
    }
  }

  std::vector<Store*> stores_;
  Rule rule_;
  StepOptions options_;
  Context<B>* ctx_;
  LearningRate<B> rate_;
  Gradients<P, B> gradients_;
  Buffer<OptimizerState, B> state_;
  Buffer<StepValues, B> values_;
  std::vector<StoreState> states_;
  int micro_ = 0;
  Scaler scaler_;
  UpdateHook* after_update_ = nullptr;
};

namespace detail {
// What data parallel plugs into an optimizer (parallel/data_parallel.hpp);
// not the user's surface.
struct Wiring {
  template <class Optimizer>
  static void attach(Optimizer& opt, GradientReducer* reducer, UpdateHook* after_update) {
    opt.gradients_.set_reducer(reducer);
    opt.after_update_ = after_update;
  }
  template <class Optimizer>
  static bool steps_next(const Optimizer& opt) {
    return opt.steps_next();
  }
};
}  // namespace detail

}  // namespace amp::optim
