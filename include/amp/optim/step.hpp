#pragma once
// The per-element math of an optimizer step, for the host and the device: a
// one-thread prologue that turns the iteration's verdict and statistics into
// this step's values (skip, gradient coefficient, bias corrections), and the
// fused pass that, per element, scales the gradient by that coefficient,
// updates the fp32 value (the master copy where the role has one) and writes
// the stored value. A skipped step leaves every bit as it was.
#include <cmath>
#include <cstdint>

#include "amp/core/numeric.hpp"
#include "amp/optim/schedule.hpp"
#include "amp/scaling/grad_stats.hpp"

namespace amp::optim {

inline constexpr int max_groups = 8;

// Step count and bias-correction products, advanced on the device by good
// steps only; `steps` counts every step, skipped or not (a schedule's position).
struct OptimizerState {
  long long t = 0;
  float beta1_pow = 1.0f;
  float beta2_pow = 1.0f;
  long long steps = 0;
};

// Per-group learning rate and weight decay of one step.
struct GroupValues {
  float lr[max_groups] = {};
  float wd[max_groups] = {};
};

// The optimizer's hyper-parameters as the prologue reads them (backend
// memory, changed by set_lr / set_schedule between steps): the rate now (or
// its schedule), and per group an own base rate (< 0: the optimizer's, scaled
// alike by the schedule) and weight decay.
struct Hyper {
  float lr = 0.0f, base_lr = 0.0f;
  int scheduled = 0;
  Schedule schedule;
  float own_lr[max_groups] = {};
  float wd[max_groups] = {};
};

// This step's values, from the prologue: skip, the gradient coefficient
// (unscale x clip x 1/accumulation), the bias-correction products after it
// and the groups' rates.
struct StepValues {
  int skip = 0;
  float coef = 1.0f;
  long long t = 0;  // this step's number, from 1
  float beta1_pow = 1.0f, beta2_pow = 1.0f;
  GroupValues hp;
};

// The rate of step `steps` and each group's share of it.
AMP_HOST_DEVICE inline GroupValues group_values(const Hyper& h, long long steps) {
  GroupValues g;
  const float now = h.scheduled ? h.schedule(steps) : h.lr;
  for (int k = 0; k < max_groups; ++k) {
    g.lr[k] = h.own_lr[k] < 0.0f ? now : h.base_lr > 0.0f ? h.own_lr[k] * (now / h.base_lr) : h.own_lr[k];
    g.wd[k] = h.wd[k];
  }
  return g;
}

// Rules whose step depends on whole tensors (LAMB's trust ratio) declare
// per_tensor; their pass runs over tensor chunks (below).
template <class Rule>
inline constexpr bool per_tensor_rule = requires { requires Rule::per_tensor; };

// Clipping divides by norm + this: PyTorch's clip_grad_norm_ 1e-6, unless the rule says otherwise (Apex's LAMB: 0).
template <class Rule>
AMP_HOST_DEVICE constexpr float clip_epsilon() {
  if constexpr (requires { Rule::clip_epsilon; }) return Rule::clip_epsilon;
  else return 1e-6f;
}

// A per-tensor rule's tensors in chunks of at most tensor_chunk elements (Apex's
// multi_tensor_apply chunk): a block of GPU threads per chunk, however large the
// tensor. A chunk knows its tensor's chunks, so each adds the tensor's partial
// sums itself, in one fixed order.
inline constexpr std::size_t tensor_chunk = 65536;
struct TensorChunk {
  std::size_t begin = 0;        // in the role's arena
  std::uint32_t count = 0;      // elements
  std::uint32_t first = 0;      // its tensor's first chunk
  std::uint32_t chunks = 0;     // its tensor's chunks
};

namespace detail {
// The prologue: one function for the host and the device.
template <class Rule>
AMP_HOST_DEVICE inline StepValues prepare_step(const Rule& rule, const OptimizerState& st, const Hyper& hyper,
                                               const GradStats& stats, const float* scale, int found_inf,
                                               float max_norm, float inv_accumulation) {
  StepValues v;
  v.hp = group_values(hyper, st.steps);
  v.skip = found_inf || overflowed(stats) ? 1 : 0;
  const float unscale = (scale ? 1.0f / *scale : 1.0f) * inv_accumulation;
  v.coef = unscale;
  if (max_norm > 0.0f) {
    const float norm = static_cast<float>(sqrt(stats.sumsq)) * unscale;
    if (norm > max_norm) v.coef *= max_norm / (norm + clip_epsilon<Rule>());
  }
  v.t = st.t + 1;
  v.beta1_pow = st.beta1_pow * rule.beta1_or_one();
  v.beta2_pow = st.beta2_pow * rule.beta2_or_one();
  return v;
}

// The prologue as the backends run it (after_prologue): on the host or as a one-thread kernel.
template <class Rule>
struct PrepareStep {
  Rule rule;
  const OptimizerState* state;
  const Hyper* hyper;
  const GradStats* stats;
  const float* scale;
  const int* found_inf;
  float max_norm, inv_accumulation;
  AMP_HOST_DEVICE StepValues operator()() const {
    return prepare_step(rule, *state, *hyper, *stats, scale, found_inf ? *found_inf : 0, max_norm, inv_accumulation);
  }
};

struct AdvanceStateOp {
  OptimizerState* state;
  const StepValues* values;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    ++state->steps;
    if (values->skip) return;
    state->t = values->t;
    state->beta1_pow = values->beta1_pow;
    state->beta2_pow = values->beta2_pow;
  }
};

AMP_HOST_DEVICE inline const StepValues& step_values(const StepValues* p) { return *p; }
AMP_HOST_DEVICE inline const StepValues& step_values(const StepValues& v) { return v; }
// Known on the host to be skipped: then nothing is launched (values in device memory are not known).
inline bool known_skip(const StepValues* /*in device memory*/) { return false; }
inline bool known_skip(const StepValues& v) { return v.skip != 0; }

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
  Values values;

  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const StepValues& v = step_values(values);
    if (v.skip) return;
    const int k = Grouped ? group[i] : 0;
    const float grad = cast<float>(g[i]) * v.coef;
    float x = Master ? master[i] : cast<float>(w[i]);
    x = rule.update(x, grad, Rule::state_buffers > 0 ? s1 + i : nullptr, Rule::state_buffers > 1 ? s2 + i : nullptr,
                    v, v.hp.lr[k], v.hp.wd[k]);
    if constexpr (Master) master[i] = x;
    w[i] = cast<Param>(x);
  }
};

// What both passes of a per-tensor rule read and write.
template <class Param, class Grad, class Rule, class Values>
struct ChunkPass {
  Param* w;
  float* master;  // unused without master weights
  const Grad* g;
  float* s1;
  float* s2;
  const std::uint8_t* group;
  const TensorChunk* chunks;
  float* sums;  // per chunk: sum x^2, sum u^2
  Rule rule;
  Values values;
};

// Per-tensor rules, pass 1 (a row op per chunk): the chunk's sums of x^2 and
// of the rule's direction u^2, the state left as it is (pass 2 recomputes u:
// no buffer of directions, and one read fewer than storing them).
template <class Param, class Grad, class Rule, bool Master, bool Grouped, class Values>
struct ChunkNormsOp {
  ChunkPass<Param, Grad, Rule, Values> a;

  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const StepValues& v = step_values(a.values);
    if (v.skip) return;
    const TensorChunk c = a.chunks[r];
    const float wd = v.hp.wd[Grouped ? a.group[c.begin] : 0];
    const auto x = [&](std::size_t i) { return Master ? a.master[i] : cast<float>(a.w[i]); };
    const float ww = lanes.sum(c.count, [&](std::int64_t j) { return x(c.begin + j) * x(c.begin + j); });
    const float uu = lanes.sum(c.count, [&](std::int64_t j) {
      const std::size_t i = c.begin + static_cast<std::size_t>(j);
      float m = a.s1[i], s = a.s2[i];
      const float u = a.rule.direction(x(i), cast<float>(a.g[i]) * v.coef, &m, &s, v, wd);
      return u * u;
    });
    lanes.each(1, [&](std::int64_t) {
      a.sums[2 * r] = ww;
      a.sums[2 * r + 1] = uu;
    });
  }
};

// Pass 2: the tensor's norms from its chunks' sums, the rule's rate for them,
// and per element the direction again (now writing the state) and the update.
template <class Param, class Grad, class Rule, bool Master, bool Grouped, class Values>
struct ChunkStepOp {
  ChunkPass<Param, Grad, Rule, Values> a;

  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const StepValues& v = step_values(a.values);
    if (v.skip) return;
    const TensorChunk c = a.chunks[r];
    float ww = 0.0f, uu = 0.0f;
    for (std::uint32_t k = c.first; k < c.first + c.chunks; ++k) ww += a.sums[2 * k], uu += a.sums[2 * k + 1];
    const int k = Grouped ? a.group[c.begin] : 0;
    const float rate = a.rule.rate(sqrtf(ww), sqrtf(uu), v.hp.lr[k], v.hp.wd[k]);
    lanes.each(c.count, [&](std::int64_t j) {
      const std::size_t i = c.begin + static_cast<std::size_t>(j);
      const float x = Master ? a.master[i] : cast<float>(a.w[i]);
      const float y = x - rate * a.rule.direction(x, cast<float>(a.g[i]) * v.coef, a.s1 + i, a.s2 + i, v, v.hp.wd[k]);
      if constexpr (Master) a.master[i] = y;
      a.w[i] = cast<Param>(y);
    });
  }
};

}  // namespace detail
}  // namespace amp::optim
