#pragma once
// Per-step figures kept on the device (loss, loss scale, skipped steps so far),
// written by the step itself into the next slot of a buffer: the slot index is
// a device counter, so a captured step (amp::CapturedStep) records each replay
// in its own slot. They are downloaded once per epoch or interval, and the
// console's progress reads a lagging mirror of the newest: the training loop
// never waits for the device.
#include <cstdio>
#include <optional>

#include <amp/amp.hpp>

#include "common/fp8_summary.hpp"
#include "common/step_figures.hpp"

namespace examples {

struct RecordState {
  long long next;   // the slot the next step writes
  StepFigures last;  // the newest record, what the progress line shows
};

struct RecordStepOp {
  StepFigures* slots;
  long long capacity;
  RecordState* state;
  const amp::nn::LossValue* loss;
  const amp::ScalerState* scaler;
  const std::int32_t* first_nonfinite;  // nullptr: not searched (the numerics report is off)
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    const StepFigures r{loss->value, scaler->scale, scaler->skipped, first_nonfinite ? *first_nonfinite : -1};
    state->last = r;
    if (state->next < capacity) slots[state->next++] = r;
  }
};

template <amp::Backend B>
class StepRecords {
 public:
  StepRecords(amp::Context<B>& ctx, std::size_t capacity)
      : slots_(ctx, capacity, amp::memory_kind::workspace), state_(ctx, 1, amp::memory_kind::workspace), newest_(ctx) {
    restart(ctx);
  }
  // The next step writes slot 0 again.
  void restart(amp::Context<B>& ctx) { amp::upload(ctx, state_.span(), &start_, 1); }
  // The step's record into the next slot (one launch; capturable).
  // first_nonfinite: the model's numerics().first_nonfinite() when the report is on.
  template <class Loss, class Optimizer>
  void record(amp::Context<B>& ctx, const Loss& loss, Optimizer& opt, const std::int32_t* first_nonfinite = nullptr) {
    amp::for_each(ctx, 1, RecordStepOp{slots_.data(), static_cast<long long>(slots_.size()), state_.data(),
                                       loss.value_ptr(), opt.scaler().state_ptr(), first_nonfinite});
  }
  // The first n records (a sync).
  std::vector<StepFigures> download(amp::Context<B>& ctx, std::size_t n) const {
    return amp::download(ctx, amp::Span<const StepFigures>(slots_.data(), n));
  }
  // The newest record whose copy has landed, or nullptr (no sync: it lags a step or two on a GPU).
  const StepFigures* newest(amp::Context<B>& ctx) {
    newest_.refresh(ctx, state_.data());
    const RecordState* s = newest_.latest();
    return s && s->next > 0 ? &s->last : nullptr;
  }

 private:
  static constexpr RecordState start_{0, {0.0f, 0.0f, 0, -1}};
  amp::Buffer<StepFigures, B> slots_;
  amp::Buffer<RecordState, B> state_;
  amp::Mirror<RecordState, B> newest_;
};

// The host work of a training loop after its first step, from amp's counters
// (amp::Counters): syncs, allocations, pageable copies, and the launches of one
// step. Zeros are what lets the step be one CUDA graph; the examples' JSON
// reports them (and common/loop_table.hpp prints them).
class LoopCounters {
 public:
  // Runs one training step (f) and counts it, unless it is the loop's first.
  template <amp::Backend B, class F>
  void step(amp::Context<B>& ctx, F&& f) {
    const amp::Counters before = ctx.counters();
    f();
    const amp::Counters d = ctx.counters() - before;
    if (steps_++ == 0) return;
    syncs_ += d.syncs, allocations_ += d.allocations, pageable_ += d.pageable_copies;
    if (steps_ == 2) launches_ = d.launches;
  }
  long long syncs() const { return static_cast<long long>(syncs_); }
  long long allocations() const { return static_cast<long long>(allocations_); }
  long long pageable_copies() const { return static_cast<long long>(pageable_); }
  // Launches of the second step, as amp counts them (a replayed graph counts none: ask the CapturedStep).
  long long launches() const { return static_cast<long long>(launches_); }

 private:
  std::size_t steps_ = 0, syncs_ = 0, allocations_ = 0, pageable_ = 0, launches_ = 0;
};

// What every example reports of a finished run besides its losses: the
// loop's host work (a captured step's launches and graph nodes when the loop
// replayed one), the peak memory by kind, the FP8 layers. R: its LevelResult.
template <class R, amp::Backend B, class Store>
void report_run(R& r, const LoopCounters& loop, const std::optional<amp::CapturedStep<B>>& graph,
                const amp::Context<B>& ctx, const Store& params) {
  r.host_syncs_in_loop = loop.syncs(), r.allocations_in_loop = loop.allocations();
  r.pageable_copies_in_loop = loop.pageable_copies();
  r.launches_per_step = graph ? static_cast<long long>(graph->launches_per_step()) : loop.launches();
  r.graph_nodes = graph ? static_cast<long long>(graph->graph_nodes()) : 0;
  for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
    r.peak[k] = ctx.memory().peak(static_cast<amp::memory_kind>(k));
  r.peak_total = ctx.memory().peak_total();
  r.fp8 = fp8_summary(params);
}

}  // namespace examples
