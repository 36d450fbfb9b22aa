#pragma once
// The fused optimizers: masters, state and the update over the flat arenas
// (optim/step.hpp has the per-element math). The optimizer owns what it
// updates; its gradients of the iteration (optim/gradients.hpp) are checked and
// unscaled by a loss scaler, which owns the verdict and calls one entry,
// apply(scale): the fused step with the device-side scale, skipped on the
// device when this optimizer's gradients overflowed, so a skipped step needs no
// host sync and leaves every bit as it was. On the CPU the prologue runs on the
// host and the pass gets its values by value (so it vectorises), or is not
// launched at all when the step is skipped.
//
// The three-line form's step() is its own scaler's PyTorch sequence:
// scaler().step(*this); scaler().update().
//
// Under ZeRO-1 (models built with a Shard) the state and the update cover
// this rank's shard of each role; data parallel (zero = 1) brings the shard's
// summed gradients and afterwards the other ranks' updated values.
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/model/parameters.hpp"
#include "amp/optim/gradients.hpp"
#include "amp/optim/step.hpp"
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

struct CommonOptions {
  float max_grad_norm = 0.0f;         // > 0: clip by global L2 norm (of the unscaled gradients)
  int accumulation_steps = 1;         // micro-batches summed before each step
  std::vector<ParamGroup> groups;     // parameters they do not select form the default group
  bool per_tensor_norms = false;      // keep each parameter's gradient norm (Apex's per_tensor l2norm)
};

// Shared by SGD, Adam and AdamW; Rule holds the per-element update.
template <Policy P, Backend B, class Rule>
class FusedOptimizer {
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
        gradients_(*ctx_, stores_, common_.per_tensor_norms),
        state_(*ctx_, 1, memory_kind::optimizer),
        hyper_(*ctx_, 1, memory_kind::optimizer),
        values_(*ctx_, 1, memory_kind::optimizer),
        scaler_(*ctx_, scaler) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: learning rate must be finite and >= 0, got ", lr);
    AMP_REQUIRE(common_.accumulation_steps >= 1, "optimizer: accumulation_steps must be >= 1, got ",
                common_.accumulation_steps);
    AMP_REQUIRE(common_.max_grad_norm >= 0, "optimizer: max_grad_norm must be >= 0, got ", common_.max_grad_norm);
    AMP_REQUIRE(common_.groups.size() + 1 <= max_groups, "optimizer: at most ", max_groups - 1, " parameter groups");
    if constexpr (std::is_same_v<B, cuda>) ctx_->template require<P>();
    for (Store* s : stores_) {
      states_.emplace_back();
      init_state(*s, states_.back().weights);
      init_state(*s, states_.back().norms);
    }
    const OptimizerState init{};
    upload(*ctx_, state_.span(), &init, 1);
    upload_hyper();
  }
  FusedOptimizer(Store& store, Rule rule, float lr, float weight_decay, CommonOptions common,
                 ScalerConfig scaler = default_scaler_config<P>())
      : FusedOptimizer(std::vector<Store*>{&store}, rule, lr, weight_decay, std::move(common), scaler) {}
  FusedOptimizer(const FusedOptimizer&) = delete;
  FusedOptimizer& operator=(const FusedOptimizer&) = delete;

  Context<B>& context() const { return *ctx_; }
  const std::vector<Store*>& stores() const { return stores_; }
  // The rate of the next step (with a schedule: one sync, for its position).
  float lr() const {
    if (!scheduled_) return lr_;
    Schedule here = schedule_;
    if (here.k == Schedule::kind::table) here.table = table_.data();  // the host's copy
    return here(steps());
  }
  // A constant rate from the next step on (ends a schedule); groups keep their ratio to it.
  void set_lr(float lr) {
    AMP_REQUIRE(lr >= 0 && std::isfinite(lr), "optimizer: set_lr(", lr, "): the rate must be finite and >= 0");
    lr_ = lr, scheduled_ = false;
    upload_hyper();
  }
  // The rate follows schedule(step) (evaluated on the device by each step;
  // groups keep their ratio to it). StepLR, CosineLR and LinearWarmup convert;
  // a schedule without base_lr starts from the current rate, as PyTorch's.
  void set_schedule(Schedule schedule) {
    if (schedule.base_lr == Schedule::optimizer_lr) schedule.base_lr = lr_;
    const auto need = [](bool ok, const char* what, auto got) {
      AMP_REQUIRE(ok, "optimizer: set_schedule: need ", what, ", got ", got);
    };
    need(schedule.step_size > 0, "step_size > 0", schedule.step_size);
    need(schedule.total_steps > 0, "total_steps > 0", schedule.total_steps);
    need(schedule.warmup_steps >= 0, "warmup_steps >= 0", schedule.warmup_steps);
    need(std::isfinite(schedule.base_lr) && schedule.base_lr >= 0, "a finite base_lr >= 0", schedule.base_lr);
    need(std::isfinite(schedule.min_lr) && schedule.min_lr >= 0, "a finite min_lr >= 0", schedule.min_lr);
    AMP_REQUIRE(schedule.k != Schedule::kind::table || schedule.table == table_device_.data(),
                "optimizer: set_schedule: a table schedule comes from set_schedule(function, steps)");
    schedule_ = schedule, scheduled_ = true;
    upload_hyper();
  }
  // Any rate as a function of the step (skipped steps count), evaluated here
  // once for steps 0 .. steps-1 into backend memory; later steps keep the last
  // rate. So a schedule of your own costs a step no host work either, and a
  // replayed step follows it.
  void set_schedule(const std::function<float(std::int64_t)>& rate, std::int64_t steps) {
    AMP_REQUIRE(rate && steps > 0, "optimizer: set_schedule(function, steps): need a function and steps > 0, got ",
                steps);
    std::vector<float> table(static_cast<std::size_t>(steps));
    for (std::int64_t i = 0; i < steps; ++i) {
      const float r = rate(i);
      AMP_REQUIRE(std::isfinite(r) && r >= 0, "optimizer: set_schedule: the rate of step ", i, " is ", r,
                  "; rates must be finite and >= 0");
      table[static_cast<std::size_t>(i)] = r;
    }
    // The step reads the table's address from the hyper-parameters in backend
    // memory too, so a captured step follows a new table.
    table_device_ = Buffer<float, B>(*ctx_, table.size(), memory_kind::optimizer);
    upload(*ctx_, table_device_.span(), table);
    table_ = std::move(table);
    Schedule s;
    s.k = Schedule::kind::table, s.base_lr = base_lr_, s.table = table_device_.data(), s.table_size = steps;
    set_schedule(s);
  }
  // Steps taken (applied or skipped), as a schedule sees them (one sync).
  std::int64_t steps() const { return state().steps; }
  void set_steps(std::int64_t s) {
    OptimizerState st = state();
    st.steps = s;
    set_state(st);
  }
  const CommonOptions& options() const { return common_; }

  // Data parallel's hook (nullptr: none).
  void set_gradient_reducer(GradientReducer* r) { gradients_.set_reducer(r); }
  // The next step() applies a step (the last micro-batch of an accumulation window).
  bool steps_next() const { return micro_ + 1 >= common_.accumulation_steps; }

  // Zeroes the gradients at the start of each accumulation window.
  void zero_grad() {
    if (micro_ != 0) return;
    for (Store* s : stores_) s->zero_grad();
    gradients_.end_iteration();
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
  // This iteration's gradients: after scaler.unscale(opt), gradients().unscaled(store, i) reads and edits them.
  Gradients<P, B>& gradients() { return gradients_; }

  // The update, once a loss scaler has checked this iteration's gradients:
  // times 1 / *scale (nullptr: no scaling; ignored when they are unscaled in
  // fp32 already), clipped, skipped on the device if they overflowed.
  void apply(const float* scale) {
    GradientReducer* reducer = gradients_.reducer();
    for (Store* s : stores_)
      AMP_REQUIRE(!s->sharded() || (reducer && reducer->shards()), "optimizer: the model is built with a shard (ZeRO-1, ",
                  s->shard().ranks, " ranks): train it under parallel::DataParallel with zero = 1");
    const bool unscaled = gradients_.unscaled();
    if (unscaled) scale = nullptr;
    // Unscaled gradients carry data parallel's factor already.
    const float inv_acc = (unscaled ? 1.0f : gradients_.factor()) / static_cast<float>(common_.accumulation_steps);
    if (unscaled && common_.max_grad_norm > 0) gradients_.restat_unscaled();  // clip what the step will use
    if constexpr (std::is_same_v<B, host>) {
      // Host memory: the prologue runs in one launch with the passes, which get
      // its values by value (and vectorise), or are skipped.
      ctx_->count_launch();
      each_role([&](auto& st, auto&) { ctx_->count_launch(st.arena->shard_count() ? passes : 0); });  // as the GPU's
      ctx_->issue([this, scale, inv_acc, unscaled] {
        const StepValues v = detail::prepare_step(rule_, *state_.data(), *hyper_.data(), *gradients_.stats(), scale,
                                                  *gradients_.found_inf(), common_.max_grad_norm, inv_acc);
        *values_.data() = v;
        if (!v.skip) each_role([&](auto& st, auto& g) { pass(st, g, v, unscaled); });
      });
    } else {
      for_each(*ctx_, 1, detail::PrepareStepOp<Rule>{rule_, state_.data(), hyper_.data(), gradients_.stats(), scale,
                                                     gradients_.found_inf(), common_.max_grad_norm, inv_acc,
                                                     values_.data()});
      each_role([&](auto& st, auto& g) { pass(st, g, static_cast<const StepValues*>(values_.data()), unscaled); });
    }
    if (reducer) reducer->gather_parameters();  // ZeRO-1: every rank's shard to every rank (a no-op otherwise)
    for_each(*ctx_, 1, detail::AdvanceStateOp{state_.data(), values_.data()});
    for (Store* s : stores_) s->fp8().step();  // FP8 scales from this iteration's amaxes (delayed scaling)
    gradients_.end_iteration();
    mark_updated();
    // Each replay of a captured step updates the weights again: cast caches read after it must refresh.
    if (ctx_->capturing()) ctx_->after_each_replay([this] { mark_updated(); });
  }

  // --- inspection and checkpoints -----------------------------------------------
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
                common_.accumulation_steps, " accumulated micro-batches");
    if (!gradients_.unscaled()) {
      AMP_REQUIRE(Scaler::mode == scaling::none || scaler_.scaled_this_iteration(),
                  "clip_grad_norm: the loss was not scaled by this optimizer's own "
                  "scaler (amp::scale_loss(loss, opt)): call scaler.unscale(opt) with the scaler that scaled it first");
      scaler_.unscale(*this);
    }
    // The fp32 copy holds the micro-batches' sum; the step uses their mean.
    const auto n = static_cast<float>(common_.accumulation_steps);
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
    const auto& s = states_.at(store);
    if constexpr (R == nn::role::weight) return s.weights.state[k].span();
    else return s.norms.state[k].span();
  }

 private:
  static constexpr int passes = per_tensor_rule<Rule> ? 2 : 1;

  // The optimizer's own memory for one role of one store: state buffers,
  // group ids, and a per-tensor rule's chunks and their sums.
  template <nn::role R>
  struct RoleState {
    using Arena = nn::RoleArena<P, B, R>;
    Arena* arena = nullptr;
    Buffer<float, B> state[2];
    Buffer<std::uint8_t, B> ids;
    Buffer<TensorChunk, B> chunks;
    Buffer<float, B> sums;
  };
  struct StoreState {
    RoleState<nn::role::weight> weights;
    RoleState<nn::role::norm> norms;
  };

  void mark_updated() {
    for (Store* s : stores_) s->mark_updated();
  }

  // f(state, gradients) for each role of each store.
  template <class F>
  void each_role(F&& f) {
    auto& grads = gradients_.stores();
    for (std::size_t k = 0; k < states_.size(); ++k) {
      f(states_[k].weights, grads[k].weights);
      f(states_[k].norms, grads[k].norms);
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
  void init_state(Store& store, RoleState<R>& a) {
    a.arena = &store.template arena<R>();
    const std::size_t count = a.arena->shard_count(), begin = a.arena->shard_begin();
    for (int k = 0; k < Rule::state_buffers; ++k) {
      a.state[k] = Buffer<float, B>(*ctx_, count, memory_kind::optimizer);
      fill(*ctx_, a.state[k].span(), 0.0f);
    }
    if constexpr (per_tensor_rule<Rule>) init_chunks(store, a);
    if (common_.groups.empty() || !count) return;  // per-element group ids only when there are groups
    std::vector<std::uint8_t> ids(count, 0);
    for (const auto& p : store.table()) {
      const nn::Part q = store.part(p);  // ZeRO-1: the elements in this rank's shard
      if (p.kind != R || !q.size()) continue;
      for (std::size_t k = 0; k < common_.groups.size(); ++k)
        if (common_.groups[k].select && common_.groups[k].select(p)) {
          std::fill_n(ids.begin() + static_cast<std::ptrdiff_t>(p.offset + q.begin - begin), q.size(),
                      static_cast<std::uint8_t>(k + 1));
          break;
        }
    }
    a.ids = Buffer<std::uint8_t, B>(*ctx_, count, memory_kind::optimizer);
    upload(*ctx_, a.ids.span(), ids);
  }

  template <nn::role R>
  void init_chunks(Store& store, RoleState<R>& a) {
    std::vector<TensorChunk> chunks;
    for (const auto& p : store.table()) {
      if (p.kind != R || !p.count || !store.part(p).size()) continue;
      AMP_REQUIRE(store.owns(p), Rule::name, ": '", p.name, "' is split between ZeRO-1 shards; its per-tensor norms need "
                  "it whole: build the model with .shard = {rank, ranks, .whole_tensors = true}");
      const auto first = static_cast<std::uint32_t>(chunks.size());
      const auto n = static_cast<std::uint32_t>((p.count + tensor_chunk - 1) / tensor_chunk);
      for (std::uint32_t k = 0; k < n; ++k) {
        const std::size_t at = k * tensor_chunk;
        const auto size = static_cast<std::uint32_t>(std::min(tensor_chunk, p.count - at));
        chunks.push_back({p.offset - a.arena->shard_begin() + at, size, first, n});  // from the shard's start
      }
    }
    if (chunks.empty()) return;
    a.chunks = Buffer<TensorChunk, B>(*ctx_, chunks.size(), memory_kind::optimizer);
    upload(*ctx_, a.chunks.span(), chunks);
    a.sums = Buffer<float, B>(*ctx_, 2 * chunks.size(), memory_kind::optimizer);
  }

  // One role's fused step over its shard (the pointers start at the shard; the
  // masters, state and unscaled gradients hold the shard only); on the host it
  // runs inside the step's launch, so it launches directly and reads no host
  // flag that may change before a replay.
  template <class S, class G, class Values>
  void pass(S& st, G& grads, Values values, bool unscaled) {
    using Arena = typename S::Arena;
    const std::size_t begin = st.arena->shard_begin(), count = st.arena->shard_count();
    float* master = nullptr;
    if constexpr (Arena::has_master) master = st.arena->master().data;
    float* s1 = Rule::state_buffers > 0 ? st.state[0].data() : nullptr;
    float* s2 = Rule::state_buffers > 1 ? st.state[1].data() : nullptr;
    auto launch = [&]<class Grad, bool Grouped>(const Grad* g) {
      if constexpr (per_tensor_rule<Rule>) {
        using Stored = typename Arena::stored_type;
        constexpr bool M = Arena::has_master;
        const std::size_t n = st.chunks.size();
        const detail::ChunkPass<Stored, Grad, Rule, Values> a{
            st.arena->values().data + begin, master, g, s1, s2, st.ids.data(), st.chunks.data(), st.sums.data(), rule_, values};
        const detail::ChunkNormsOp<Stored, Grad, Rule, M, Grouped, Values> norms{a};
        const detail::ChunkStepOp<Stored, Grad, Rule, M, Grouped, Values> step{a};
        if constexpr (std::is_same_v<B, host>) {
          amp::detail::for_each_now(ctx_->threads(), n, amp::detail::RowAsItem<decltype(norms)>{norms}, tensor_chunk);
          amp::detail::for_each_now(ctx_->threads(), n, amp::detail::RowAsItem<decltype(step)>{step}, tensor_chunk);
        } else {
          for_each_row(*ctx_, n, static_cast<std::int64_t>(tensor_chunk), norms);
          for_each_row(*ctx_, n, static_cast<std::int64_t>(tensor_chunk), step);
        }
      } else {
        const detail::FusedStepOp<typename Arena::stored_type, Grad, Rule, Arena::has_master, Grouped, Values> op{
            st.arena->values().data + begin, master, g, s1, s2, st.ids.data(), rule_, values};
        if constexpr (std::is_same_v<B, host>) {
          if (count) amp::detail::for_each_now(ctx_->threads(), count, op, 1);
        } else {
          for_each(*ctx_, count, op);
        }
      }
    };
    const bool grouped = !common_.groups.empty();
    if (unscaled) {
      const float* g = grads.unscaled.data();
      grouped ? launch.template operator()<float, true>(g) : launch.template operator()<float, false>(g);
    } else {
      const typename Arena::grad_type* g = st.arena->grads().data + begin;
      grouped ? launch.template operator()<typename Arena::grad_type, true>(g)
              : launch.template operator()<typename Arena::grad_type, false>(g);
    }
  }

  // The hyper-parameters into backend memory: at construction and when they change, never per step.
  void upload_hyper() {
    Hyper h;
    h.lr = lr_, h.base_lr = base_lr_, h.scheduled = scheduled_ ? 1 : 0, h.schedule = schedule_;
    std::fill(std::begin(h.own_lr), std::end(h.own_lr), -1.0f);
    std::fill(std::begin(h.wd), std::end(h.wd), weight_decay_);
    for (std::size_t k = 0; k < common_.groups.size(); ++k) {
      const auto& g = common_.groups[k];
      if (g.lr) h.own_lr[k + 1] = *g.lr;  // a schedule scales every group alike
      if (g.weight_decay) h.wd[k + 1] = *g.weight_decay;
    }
    upload(*ctx_, hyper_.span(), &h, 1);
  }

  std::vector<Store*> stores_;
  Rule rule_;
  float lr_, base_lr_, weight_decay_;
  CommonOptions common_;
  Context<B>* ctx_;
  Gradients<P, B> gradients_;
  Buffer<OptimizerState, B> state_;
  Buffer<Hyper, B> hyper_;
  Buffer<StepValues, B> values_;
  std::vector<StoreState> states_;
  Schedule schedule_;
  bool scheduled_ = false;
  std::vector<float> table_;       // set_schedule(function, steps): the rates, on the host
  Buffer<float, B> table_device_;  // and in backend memory, where the step reads them
  int micro_ = 0;
  Scaler scaler_;
};

}  // namespace amp::optim
