#pragma once
// A model of one layer, run forward on ones and backward from a gradient of
// ones on the host: what each use_*.cpp does with its header alone (this
// support header includes only the model core, which every layer includes).
#include <amp/model/model.hpp>

#include <cmath>

namespace amp::test {

template <template <class, class> class Layer, class P, class B>
struct OneLayer {
  using T = typename P::activation_type;
  Layer<P, B> layer;
  Shape sample;
  OneLayer(nn::Builder<P, B> b, const typename Layer<P, B>::Config& cfg, Shape s) : layer(b.child("layer"), cfg), sample(s) {}
  std::vector<nn::Input> default_inputs() const { return {{sample}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return layer(g, x); }
};

// True when forward and backward ran and every gradient they wrote is finite,
// with at least one non-zero where the layer has parameters.
template <template <class, class> class Layer, class P = O2Policy>
bool run_one_layer(const typename Layer<P, host>::Config& cfg, Shape sample) {
  using T = typename P::activation_type;
  Context<host> ctx;
  nn::Model<P, host, OneLayer<Layer, P, host>> model(ctx, {.max_batch = 2, .seed = 1}, cfg, sample);
  std::vector<float> x(static_cast<std::size_t>(2 * sample.numel()), 0.5f);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
  auto out = model.forward(ctx, TensorView<const float>(x.data(), sample.batched(2)));
  const auto g = model.graph().grad_out(out.var);
  fill(ctx, Span<T>(g.data, out.var.size()), cast<T>(1.0f));
  model.parameters().zero_grad();
  model.graph().backward();
  bool nonzero = model.parameters().count() == 0, finite = true;
  const auto grads = download(ctx, Span<const typename P::grad_type>(model.parameters().template arena<nn::role::weight>().grads()));
  for (const auto v : grads) nonzero = nonzero || cast<float>(v) != 0.0f, finite = finite && std::isfinite(cast<float>(v));
  const auto norms = download(ctx, Span<const float>(model.parameters().template arena<nn::role::norm>().grads()));
  for (const float v : norms) nonzero = nonzero || v != 0.0f, finite = finite && std::isfinite(v);
  return nonzero && finite;
}

}  // namespace amp::test
