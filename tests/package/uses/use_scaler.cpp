#include <amp/backend/host.hpp>
#include <amp/scaling/loss_scaler.hpp>

// The scaler with its own header (and the backend's): a scale that backs off
// on an overflow found by a check of its own caller.
bool use_scaler() {
  amp::Context<amp::host> ctx;
  amp::DynamicLossScaler<amp::host> scaler(ctx, {.init_scale = 8.0f});
  struct Gradients {  // what an optimizer's gradients offer a scaler
    bool unscaled() const { return false; }
    void check(int* found) { *found = 1; }
    void unscale(const float*) {}
  } grads;
  struct Optimizer {
    Gradients* g;
    bool applied = false;
    Gradients& gradients() { return *g; }
    void apply(const float*) { applied = true; }
  } opt{&grads};
  scaler.step(opt);
  scaler.update();
  return opt.applied && scaler.stats().scale == 4.0f && scaler.stats().skipped == 1;
}
