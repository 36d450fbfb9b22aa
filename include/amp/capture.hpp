#pragma once
// A training step captured once and replayed per batch: on the GPU one CUDA
// graph launch per step, with no host work between the launch and the next
// batch but the scaler's look at its lagging mirror.
//
//   amp::CapturedStep step(ctx, [&] {
//     auto loss = amp::nn::cross_entropy(ctx, model.forward(ctx, x), labels);  // x, labels: fixed buffers
//     opt.zero_grad();
//     { auto scaled = amp::scale_loss(loss, opt); scaled.backward(); }
//     opt.step();                                   // skipped on the device on overflow
//   });
//   for (...) { stage the batch into x, labels; step.replay(); }
//
// The constructor runs the body `warmup` times as ordinary steps (they size
// every buffer and make every GEMM plan), then records one more run of it,
// which executes nothing; each replay() runs the recorded step. So warmup + n
// replays are warmup + n training steps, equal bit for bit to as many eager
// ones: every value that changes per step (scale, step counts, the schedule,
// dropout's counter) is read and advanced in backend memory.
//
// On the CPU the recording keeps each launch with its arguments and a replay
// runs exactly those (backend/host/graph.hpp), as a CUDA graph does: a value
// frozen at the capture is frozen here too, so the host tests prove replays.
//
// What the body may not do, on any backend: wait for the stream (item(),
// stats(), downloads), allocate, copy from pageable host memory. Each is an
// amp::Error naming it, raised where it happens. The body must issue the same
// work every time: what it reads must sit in the same buffers (copy each batch
// into them before replay()), and host-side choices (accumulation windows,
// set_config, the shapes) are fixed at the capture. Objects the body uses must
// outlive the CapturedStep.
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "amp/backend/backend.hpp"
#include "amp/backend/host/graph.hpp"

namespace amp {

struct CaptureOptions {
  int warmup = 1;  // eager runs of the body before the capture (at least one)
};

template <Backend B>
class CapturedStep {
 public:
  template <class Body>
  CapturedStep(Context<B>& ctx, Body&& body, CaptureOptions options = {})
      : ctx_(&ctx), body_(std::forward<Body>(body)) {
    AMP_REQUIRE(options.warmup >= 1, "CapturedStep: warmup must be >= 1 (an eager step sizes every buffer before "
                                     "a capture), got ", options.warmup);
    AMP_REQUIRE(!ctx.capturing(), "CapturedStep: the context is already capturing a step");
    for (int i = 0; i < options.warmup; ++i) {
      const Counters before = ctx.counters();
      body_();
      launches_ = (ctx.counters() - before).launches;
    }
    record();
  }
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  // One more training step: the recorded work, then the host's after-replay checks.
  void replay() {
    AMP_REQUIRE(ctx_->scratch_moves() == scratch_moves_,
                "CapturedStep::replay: the context's scratch memory moved after the capture (eager work larger than "
                "the captured step's grew it), so the recorded step would read freed memory; capture it again");
    ctx_->set_mode(step_mode::replaying);
    try {
      graph_.launch(*ctx_);
    } catch (...) {
      ctx_->set_mode(step_mode::eager);
      throw;
    }
    ctx_->set_mode(step_mode::eager);
    for (auto& f : after_replay_) f();
    ++replays_;
  }

  std::size_t replays() const { return replays_; }
  // What one step issues as amp counts launches (kernels, reductions, GEMMs;
  // measured on the last eager run), and what the graph holds: CUDA graph
  // nodes on the GPU, recorded launches on the CPU.
  std::size_t launches_per_step() const { return launches_; }
  std::size_t graph_nodes() const { return graph_.nodes(); }

 private:
  // Records one run of the body; frees are checked after it, as a destructor
  // cannot throw where it frees.
  void record() {
    const Counters before = ctx_->counters();
    (void)ctx_->take_after_replay();
    graph_.begin(*ctx_);
    ctx_->set_mode(step_mode::capturing);
    try {
      body_();
    } catch (...) {
      ctx_->set_mode(step_mode::eager);
      graph_.abort(*ctx_);
      ctx_->release_held_frees();
      throw;
    }
    ctx_->set_mode(step_mode::eager);
    after_replay_ = ctx_->take_after_replay();
    if (const std::size_t frees = (ctx_->counters() - before).frees; frees != 0) {
      graph_.abort(*ctx_);
      ctx_->release_held_frees();
      fail("amp: a captured step freed ", frees, " buffers; a CUDA graph cannot hold that. Keep the body's buffers "
           "alive outside it");
    }
    graph_.end(*ctx_);
    scratch_moves_ = ctx_->scratch_moves();
  }

  Context<B>* ctx_;
  std::function<void()> body_;
  StreamGraph<B> graph_;
  std::vector<std::function<void()>> after_replay_;
  std::size_t launches_ = 0, replays_ = 0, scratch_moves_ = 0;
};

template <Backend B, class Body>
CapturedStep(Context<B>&, Body&&, CaptureOptions = {}) -> CapturedStep<B>;

}  // namespace amp
