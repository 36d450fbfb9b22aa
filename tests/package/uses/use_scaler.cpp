#include <amp/backend/host.hpp>
#include <amp/scaling/loss_scaler.hpp>

// The scaler with its own header (and the backend's): a scale that backs off
// on an overflow found by a check of its own caller.
bool use_scaler() {
  amp::Context<amp::host> ctx;
  amp::DynamicLossScaler<amp::host> scaler(ctx, {.init_scale = 8.0f});
  struct Gradients {  // what an optimizer's gradients offer a scaler
    bool scaled_check = false;
    bool unscaled() const { return false; }
    void check(int* found_inf, bool scales) {
      *found_inf = 1;
      scaled_check = scales;
    }
    void unscale(const float*) {}
    amp::StepRecord record(const float* scale) { return {.scale = scale}; }
  } grads;
  struct Optimizer {  // and what an optimizer offers it: the update that consumes the record
    Gradients* g;
    bool updated = false;
    Gradients& gradients() { return *g; }
    void update(const amp::StepRecord&) { updated = true; }
  } opt{&grads};
  scaler.step(opt);
  scaler.update();
  return opt.updated && grads.scaled_check && scaler.stats().scale == 4.0f && scaler.stats().skipped == 1;
}
