#pragma once
// The fused optimizer step: one pass per parameter role over the flat arenas
// that, per element, unscales (and clips) the gradient, updates the fp32 value
// (the master copy where the role has one) and writes the stored value. A
// one-thread prologue turns the scaler's verdict into this step's values (skip,
// gradient coefficient, bias corrections) on the device, so a skipped step
// needs no host sync and leaves every bit as it was. On the CPU the prologue
// runs on the host and the pass gets its values by value (so it vectorises),
// or is not launched at all when the step is skipped.
//
// A loss scaler (scaling/loss_scaler.hpp) drives the optimizer through the
// Scalable interface: check(), unscale() and apply() with the scaler's state.
// The three-line form's step() is the same driving by the optimizer's own
// scaler: scaler().step(*this); scaler().update().
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/nn/parameters.hpp"
#include "amp/scaling/grad_stats.hpp"
#include "amp/scaling/loss_scaler.hpp"

namespace amp::optim {

// Parameters with their own learning rate and weight decay (PyTorch's param groups).
struct ParamGroup {
  std::function<bool(const nn::ParamInfo&)> select;  // which parameters (the first group that selects one wins)
  std::optional<float> lr;                           // default: the optimizer's
  std::optional<float> weight_decay;                 // default: the optimizer's
};

// Selectors for the usual groups.
namespace select {
// Biases and norm parameters: no weight decay (AdamW as GPT-2 is trained).
inline bool no_decay(const nn::ParamInfo& p) { return !p.decay; }
inline bool norms(const nn::ParamInfo& p) { return p.kind == nn::role::norm; }
inline std::function<bool(const nn::ParamInfo&)> prefix(std::string s) {
  return [s](const nn::ParamInfo& p) { return p.name.rfind(s, 0) == 0; };
}
}  // namespace select

inline constexpr int max_groups = 8;

// What data parallel (amp::parallel::DataParallel) plugs into an optimizer:
// the gradients are summed over the ranks just before they are checked, so
// every rank sees the same overflow and takes the same step, and the step
// multiplies them by gradient_factor() (1/ranks) in its gradient coefficient
// instead of a separate averaging pass.
class GradientReducer {
 public:
  virtual void reduce_gradients() = 0;
  virtual float gradient_factor() const = 0;

 protected:
  ~GradientReducer() = default;
};

struct CommonOptions {
  float max_grad_norm = 0.0f;         // > 0: clip by global L2 norm (of the unscaled gradients)
  int accumulation_steps = 1;         // micro-batches summed before each step
  std::vector<ParamGroup> groups;     // parameters they do not select form the default group
  bool per_tensor_norms = false;      // keep each parameter's gradient norm (Apex's per_tensor l2norm)
};

// Step count and bias-correction products, advanced on the device by good steps only.
struct OptimizerState {
  long long t = 0;
  float beta1_pow = 1.0f;
  float beta2_pow = 1.0f;
};

// This step's values, from the prologue: skip, the gradient coefficient
// (unscale x clip x 1/accumulation) and the bias-correction products after it.
struct StepValues {
  int skip = 0;
  float coef = 1.0f;
  long long t = 0;  // this step's number, from 1
  float beta1_pow = 1.0f, beta2_pow = 1.0f;
};

// Per-group hyper-parameters, by value into the pass.
struct GroupValues {
  float lr[max_groups] = {};
  float wd[max_groups] = {};
};

namespace detail {
// The prologue: one function for the host and the device.
template <class Rule>
AMP_HOST_DEVICE inline StepValues prepare_step(const Rule& rule, const OptimizerState& st, const GradStats& stats,
                                               const float* scale, int found_inf, float max_norm,
                                               float inv_accumulation) {
  StepValues v;
  v.skip = found_inf || overflowed(stats) ? 1 : 0;
  const float unscale = (scale ? 1.0f / *scale : 1.0f) * inv_accumulation;
  v.coef = unscale;
  if (max_norm > 0.0f) {
    const float norm = static_cast<float>(sqrt(stats.sumsq)) * unscale;
    if (norm > max_norm) v.coef *= max_norm / (norm + 1e-6f);
  }
  v.t = st.t + 1;
  v.beta1_pow = st.beta1_pow * rule.beta1_or_one();
  v.beta2_pow = st.beta2_pow * rule.beta2_or_one();
  return v;
}

template <class Rule>
struct PrepareStepOp {
  Rule rule;
  const OptimizerState* state;
  const GradStats* stats;
  const float* scale;
  const int* found_inf;
  float max_norm, inv_accumulation;
  StepValues* out;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    *out = prepare_step(rule, *state, *stats, scale, found_inf ? *found_inf : 0, max_norm, inv_accumulation);
  }
};

struct AdvanceStateOp {
  OptimizerState* state;
  const StepValues* values;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    if (values->skip) return;
    state->t = values->t;
    state->beta1_pow = values->beta1_pow;
    state->beta2_pow = values->beta2_pow;
  }
};

AMP_HOST_DEVICE inline const StepValues& step_values(const StepValues* p) { return *p; }
AMP_HOST_DEVICE inline const StepValues& step_values(const StepValues& v) { return v; }

// The pass. Master weights, state buffers, groups and where the step's values
// come from (device pointer or host value) are compile-time facts, so the
// per-element body has no pointer tests.
template <class Param, class Grad, class Rule, bool Master, bool Grouped, class Values>
struct FusedStepOp {
  Param* w;
  float* master;  // unused without master weights: the fp32 weights hold the value
  const Grad* g;
  float* s1;
  float* s2;
  const std::uint8_t* group;
  Rule rule;
  GroupValues hp;
  Values values;

  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const StepValues& v = step_values(values);
    if (v.skip) return;
    const int k = Grouped ? group[i] : 0;
    const float grad = cast<float>(g[i]) * v.coef;
    float x = Master ? master[i] : cast<float>(w[i]);
    x = rule.update(x, grad, Rule::state_buffers > 0 ? s1 + i : nullptr, Rule::state_buffers > 1 ? s2 + i : nullptr,
                    v, hp.lr[k], hp.wd[k]);
    if constexpr (Master) master[i] = x;
    w[i] = cast<Param>(x);
  }
};

// fp32 (+)= g / scale x factor, then g = 0: explicit unscaling, into fp32 so
// that no small gradient underflows in fp16 (Apex unscales into master
// gradients); factor is data parallel's 1/ranks, so they read as averages.
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

struct OrIntOp {
  int* into;
  const int* from;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *into |= *from; }
};

struct OrFlagOp {
  int* into;
  const GradStats* stats;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    if (overflowed(*stats)) *into = 1;
  }
};
}  // namespace detail

// Shared by SGD, Adam and AdamW; Rule holds the per-element update.
template <Policy P, Backend B, class Rule>
class FusedOptimizer : public Scalable<B> {
 public:
  using policy = P;
  using backend = B;
  using Store = nn::ParameterStore<P, B>;
  static constexpr int state_buffers = Rule::state_buffers;
  static constexpr const char* rule_name = Rule::name;

  using Scaler = default_scaler_t<P, B>;

  FusedOptimizer(std::vector<Store*> stores, Rule rule, float lr, float weight_decay, CommonOptions common,
                 ScalerConfig scaler = default_scaler_config<P>())
      : stores_(std::move(stores)),
        rule_(rule),
        lr_(lr),
        base_lr_(lr),
        weight_decay_(weight_decay),
        common_(std::move(common)),
        ctx_(&check_stores(stores_)),
        state_(*ctx_, 1, memory_kind::optimizer),
        values_(*ctx_, 1, memory_kind::optimizer),
        stats_(*ctx_, 1, memory_kind::optimizer),
        scratch_stats_(*ctx_, 1, memory_kind::optimizer),
        found_(*ctx_, 1, memory_kind::optimizer),
        scaler_(*ctx_, scaler) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: learning rate must be finite and >= 0, got ", lr);
    AMP_REQUIRE(common_.accumulation_steps >= 1, "optimizer: accumulation_steps must be >= 1, got ",
                common_.accumulation_steps);
    AMP_REQUIRE(common_.max_grad_norm >= 0, "optimizer: max_grad_norm must be >= 0, got ", common_.max_grad_norm);
    AMP_REQUIRE(common_.groups.size() + 1 <= max_groups, "optimizer: at most ", max_groups - 1, " parameter groups");
    if constexpr (std::is_same_v<B, cuda>) ctx_->template require<P>();
    for (Store* s : stores_) {
      arenas_.emplace_back();
      init_arena(*s, arenas_.back().weights);
      init_arena(*s, arenas_.back().norms);
    }
    if (common_.per_tensor_norms) per_tensor_ = Buffer<GradStats, B>(*ctx_, tensor_count_, memory_kind::optimizer);
    const OptimizerState init{};
    upload(*ctx_, state_.span(), &init, 1);
    check(nullptr);  // sizes the reduction workspace now, not in the loop
    fill(*ctx_, found_.span(), 0);
    this->end_iteration();
  }
  FusedOptimizer(Store& store, Rule rule, float lr, float weight_decay, CommonOptions common,
                 ScalerConfig scaler = default_scaler_config<P>())
      : FusedOptimizer(std::vector<Store*>{&store}, rule, lr, weight_decay, std::move(common), scaler) {}
  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;

  Context<B>& context() const { return *ctx_; }
  const std::vector<Store*>& stores() const { return stores_; }
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  // schedule(step) sets the learning rate before each step (groups keep their ratio to it).
  void set_schedule(std::function<float(std::int64_t)> schedule) { schedule_ = std::move(schedule); }
  // Steps taken (applied or skipped), as a schedule sees them.
  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t s) { steps_ = s; }
  const CommonOptions& options() const { return common_; }

  // Data parallel's hook (nullptr: none).
  void set_gradient_reducer(GradientReducer* r) { reducer_ = r; }
  // The next step() applies a step (the last micro-batch of an accumulation window).
  bool steps_next() const { return micro_ + 1 >= common_.accumulation_steps; }

  // Zeroes the gradients at the start of each accumulation window.
  void zero_grad() {
    if (micro_ != 0) return;
    for (Store* s : stores_) s->zero_grad();
  }
  // The three-line form: after the scaled backward, the policy's own scaler
  // checks, steps (skipped on the device on overflow) and updates. With
  // accumulation_steps = N, only every Nth call steps.
  void step() {
    if (++micro_ < common_.accumulation_steps) return;
    micro_ = 0;
    scaler_.step(*this);
    scaler_.update();
  }
  // The policy's scaler (dynamic for fp16 levels, static for O3, none otherwise).
  Scaler& scaler() { return scaler_; }

  // --- what a loss scaler calls ---------------------------------------------------
  void end_iteration() override {
    Scalable<B>::end_iteration();
    unscaled_ = false;
    fill(*ctx_, found_.span(), 0);
  }

  void check(int* found_inf) override {
    if (reducer_) reducer_->reduce_gradients();
    bool first = true;
    each_arena([&](auto& a) {
      using G = typename std::remove_reference_t<decltype(a)>::G;
      const Span<const G> grads(a.group->grads());
      if (common_.per_tensor_norms) {
        for (const auto& t : a.tensors) {
          GradStats* slot = per_tensor_.data() + t.index;
          grad_stats(*ctx_, grads.subspan(t.offset, t.count), slot);
          for_each(*ctx_, 1, amp::detail::AddGradStatsOp{stats_.data(), slot, first});
          first = false;
        }
      } else {
        grad_stats(*ctx_, grads, scratch_stats_.data());
        for_each(*ctx_, 1, amp::detail::AddGradStatsOp{stats_.data(), scratch_stats_.data(), first});
        first = false;
      }
    });
    for_each(*ctx_, 1, detail::OrFlagOp{found_.data(), stats_.data()});
    if (found_inf) for_each(*ctx_, 1, detail::OrFlagOp{found_inf, stats_.data()});
  }

  void unscale(const float* scale) override {
    each_arena([&](auto& a) {
      using G = typename std::remove_reference_t<decltype(a)>::G;
      if (!a.unscaled.data() && a.count) a.unscaled = Buffer<float, B>(*ctx_, a.count, memory_kind::grads);
      for_each(*ctx_, a.count,
               detail::UnscaleOp<G>{a.group->grads().data, a.unscaled.data(), scale, gradient_factor(), unscaled_});
    });
    unscaled_ = true;
  }

  void apply(const float* scale, const int* found_inf) override {
    if (schedule_) lr_ = schedule_(steps_);
    // Unscaled gradients carry data parallel's factor already.
    const float inv_acc = (unscaled_ ? 1.0f : gradient_factor()) / static_cast<float>(common_.accumulation_steps);
    if (unscaled_ && common_.max_grad_norm > 0) {  // clip by the norm of what the step will use
      bool first = true;
      each_arena([&](auto& a) {
        grad_stats(*ctx_, Span<const float>(a.unscaled.data(), a.unscaled.data() ? a.count : 0), scratch_stats_.data());
        for_each(*ctx_, 1, amp::detail::AddGradStatsOp{stats_.data(), scratch_stats_.data(), first});
        first = false;
      });
    }
    const GroupValues hp = group_values();
    if constexpr (std::is_same_v<B, host>) {
      // Host memory: the prologue runs here, and the pass gets its values by value (and vectorises).
      const StepValues v = detail::prepare_step(rule_, *state_.data(), *stats_.data(), scale,
                                                *found_.data() || (found_inf && *found_inf), common_.max_grad_norm,
                                                inv_acc);
      *values_.data() = v;
      if (!v.skip) each_arena([&](auto& a) { pass(a, hp, v); });
    } else {
      if (found_inf) for_each(*ctx_, 1, detail::OrIntOp{found_.data(), found_inf});
      for_each(*ctx_, 1, detail::PrepareStepOp<Rule>{rule_, state_.data(), stats_.data(), scale, found_.data(),
                                                     common_.max_grad_norm, inv_acc, values_.data()});
      each_arena([&](auto& a) { pass(a, hp, static_cast<const StepValues*>(values_.data())); });
    }
    for_each(*ctx_, 1, detail::AdvanceStateOp{state_.data(), values_.data()});
    fill(*ctx_, found_.span(), 0);
    for (Store* s : stores_) s->mark_updated();
    ++steps_;
  }

  // --- inspection and checkpoints -----------------------------------------------
  // Applied steps on the device (one sync).
  std::int64_t applied_steps() const { return state().t; }
  OptimizerState state() const { return download_one(*ctx_, static_cast<const OptimizerState*>(state_.data())); }
  void set_state(const OptimizerState& s) { upload(*ctx_, state_.span(), &s, 1); }
  // The last check's statistics: norm and max |g| of the gradients as they were (scaled).
  GradStats last_stats() const { return download_one(*ctx_, static_cast<const GradStats*>(stats_.data())); }
  // Each parameter's gradient norm at the last check (per_tensor_norms), in the order of the stores' tables.
  std::vector<float> per_tensor_norms() const {
    AMP_REQUIRE(common_.per_tensor_norms, "per_tensor_norms(): construct the optimizer with per_tensor_norms = true");
    const auto s = download(*ctx_, Span<const GradStats>(per_tensor_.span()));
    std::vector<float> out(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<float>(std::sqrt(s[i].sumsq));
    return out;
  }
  // State buffer k (moments) of role R of store `store`, for inspection and checkpoints.
  template <nn::role R>
  Span<float> state_buffer(int k, std::size_t store = 0) const {
    const auto& s = arenas_.at(store);
    if constexpr (R == nn::role::weight) return s.weights.state[k].span();
    else return s.norms.state[k].span();
  }

 private:
  struct Tensor {
    std::size_t index, offset, count;
  };
  // One role of one store: its arenas, state buffers, group ids, unscaled gradients.
  template <nn::role R>
  struct RoleArena {
    using Group = nn::ParamGroup<P, B, R>;
    using S = typename Group::stored_type;
    using G = typename Group::grad_type;
    Group* group = nullptr;
    std::size_t count = 0;
    std::vector<Tensor> tensors;
    Buffer<float, B> state[2];
    Buffer<std::uint8_t, B> ids;
    Buffer<float, B> unscaled;  // explicit unscaling, allocated at its first use
  };
  struct StoreArenas {
    RoleArena<nn::role::weight> weights;
    RoleArena<nn::role::norm> norms;
  };

  template <class F>
  void each_arena(F&& f) {
    for (auto& s : arenas_) {
      f(s.weights);
      f(s.norms);
    }
  }

  static Context<B>& check_stores(const std::vector<Store*>& stores) {
    AMP_REQUIRE(!stores.empty() && stores.front(), "optimizer: no parameters");
    for (Store* s : stores)
      AMP_REQUIRE(s && &s->context() == &stores.front()->context() && s->allocated(),
                  "optimizer: every model must be built, on one context");
    return stores.front()->context();
  }

  template <nn::role R>
  void init_arena(Store& store, RoleArena<R>& a) {
    a.group = &store.template group<R>();
    a.count = a.group->count();
    for (int k = 0; k < Rule::state_buffers; ++k) {
      a.state[k] = Buffer<float, B>(*ctx_, a.count, memory_kind::optimizer);
      fill(*ctx_, a.state[k].span(), 0.0f);
    }
    std::vector<std::uint8_t> ids(a.count, 0);
    for (const auto& p : store.table()) {
      if (p.kind != R) continue;
      a.tensors.push_back({tensor_count_++, p.offset, p.count});
      for (std::size_t k = 0; k < common_.groups.size(); ++k)
        if (common_.groups[k].select && common_.groups[k].select(p)) {
          std::fill_n(ids.begin() + static_cast<std::ptrdiff_t>(p.offset), p.count, static_cast<std::uint8_t>(k + 1));
          break;
        }
    }
    if (!common_.groups.empty() && a.count) {  // per-element group ids only when there are groups
      a.ids = Buffer<std::uint8_t, B>(*ctx_, a.count, memory_kind::optimizer);
      upload(*ctx_, a.ids.span(), ids);
    }
  }

  template <class A, class Values>
  void pass(A& a, const GroupValues& hp, Values values) {
    using Group = typename A::Group;
    float* master = nullptr;
    if constexpr (Group::has_master) master = a.group->master().data;
    float* s1 = Rule::state_buffers > 0 ? a.state[0].data() : nullptr;
    float* s2 = Rule::state_buffers > 1 ? a.state[1].data() : nullptr;
    auto launch = [&]<class Grad, bool Grouped>(const Grad* grads) {
      for_each(*ctx_, a.count,
               detail::FusedStepOp<typename A::S, Grad, Rule, Group::has_master, Grouped, Values>{
                   a.group->values().data, master, grads, s1, s2, a.ids.data(), rule_, hp, values});
    };
    const bool grouped = !common_.groups.empty();
    if (unscaled_) {
      const float* g = a.unscaled.data();
      grouped ? launch.template operator()<float, true>(g) : launch.template operator()<float, false>(g);
    } else {
      const typename A::G* g = a.group->grads().data;
      grouped ? launch.template operator()<typename A::G, true>(g) : launch.template operator()<typename A::G, false>(g);
    }
  }

  float gradient_factor() const { return reducer_ ? reducer_->gradient_factor() : 1.0f; }

  GroupValues group_values() const {
    GroupValues hp;
    hp.lr[0] = lr_, hp.wd[0] = weight_decay_;
    for (std::size_t k = 0; k < common_.groups.size(); ++k) {
      const auto& g = common_.groups[k];
      hp.lr[k + 1] = g.lr ? *g.lr * (lr_ / base_lr_) : lr_;  // a schedule scales every group alike
      hp.wd[k + 1] = g.weight_decay ? *g.weight_decay : weight_decay_;
    }
    return hp;
  }

  std::vector<Store*> stores_;
  Rule rule_;
  float lr_, base_lr_, weight_decay_;
  CommonOptions common_;
  Context<B>* ctx_;
  Buffer<OptimizerState, B> state_;
  Buffer<StepValues, B> values_;
  Buffer<GradStats, B> stats_, scratch_stats_, per_tensor_;
  Buffer<int, B> found_;  // this optimizer's overflow in this iteration, from every scaler that checked it
  std::vector<StoreArenas> arenas_;
  std::size_t tensor_count_ = 0;
  std::function<float(std::int64_t)> schedule_;
  std::int64_t steps_ = 0;
  int micro_ = 0;
  bool unscaled_ = false;  // this iteration's gradients are in the fp32 buffers
  GradientReducer* reducer_ = nullptr;
  Scaler scaler_;
};

}  // namespace amp::optim
