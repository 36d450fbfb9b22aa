#pragma once
// The fused classifier loss (llm.c's fused classifier): softmax cross-entropy
// whose forward also writes scale * dL/dlogits over the logits, in the same
// pass over the vocabulary. The logits' memory becomes their gradient, so a
// [rows x classes] buffer is held once, not twice (logits, then their
// gradient), and the softmax is computed once, not again in backward. At
// GPT-2's vocabulary and 8 x 1024 tokens that is 823 MB of fp16 saved.
//
// The forward needs the loss scale that backward will use: the optimizer's (or
// a scaler's) scale, read on the device, so dynamic scaling costs no sync; the
// scale of an iteration only changes at update(), after its backward. With
// ModelOptions::fused_loss the model plans no separate gradient for its
// outputs. The logits must come straight from a Linear without activation or
// Embedding::logits (ops whose backward reads only dL/dlogits); reading them
// after the loss is an error, not gradient values taken for logits.
// Values and gradients equal cross_entropy's bit for bit (a loss weight other
// than 1 rounds the written gradient a second time).
#include <cstdint>
#include <type_traits>

#include "amp/nn/loss.hpp"
#include "amp/model/graph_hooks.hpp"

namespace amp::nn {
namespace detail {

// Row r's share of the mean loss into out[r], and scale * dL/dx over row r of x.
template <bool Scaled, class S, class C, class T>
struct FusedCrossEntropyOp {
  T* x;
  const std::int32_t* labels;
  std::int64_t classes;
  const float* scale;
  float inv_rows;
  LossValue* out;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    T* row = x + static_cast<std::int64_t>(r) * classes;
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) {  // as cross_entropy: the row's index, and a NaN gradient so the step skips
      lanes.each(1, [&](std::int64_t) { out[r] = {0.0f, static_cast<int>(r)}; });
      lanes.each(classes, [&](std::int64_t c) { row[c] = cast<T>(bad_label_grad()); });
      return;
    }
    // Read by every lane through a reduction, so no lane overwrites it before all have it.
    const float at_label = lanes.sum(1, [&](std::int64_t) { return cast<float>(row[label]); });
    float m, sum;
    softmax_denominator<S>(lanes, row, classes, m, sum);
    lanes.each(1, [&](std::int64_t) { out[r] = {cross_entropy_row_loss<C>(m, sum, at_label, inv_rows), -1}; });
    const float k = inv_rows * seed_factor<Scaled>(scale, 1.0f);
    lanes.each(classes, [&](std::int64_t c) {  // each lane writes only what it reads
      row[c] = cast<T>(cross_entropy_grad<S>(cast<float>(row[c]), m, sum, c == label, k));
    });
  }
};

// The scale a scaler applies: an optimizer's scaler, a scaler, or a pointer (nullptr: none).
template <class Source>
const float* scale_of(Source& s) {
  if constexpr (requires { s.scaler().scale_ptr(); }) return s.scaler().scale_ptr();
  else return s.scale_ptr();
}
}  // namespace detail

// scale: the loss scale backward will apply (scaler.scale_ptr(); nullptr: unscaled).
template <Policy P, Backend B>
Loss<P, B> fused_cross_entropy(Context<B>& ctx, const Output<P, B>& logits, Span<const std::int32_t> labels,
                               const float* scale) {
  using T = typename P::activation_type;
  using S = typename P::template compute_type<op::softmax>;
  using C = typename P::template compute_type<op::loss>;
  constexpr const char* name = "fused_cross_entropy";
  detail::check_labels(ctx, logits, labels, name);
  auto& g = *logits.graph;
  detail::GraphHooks::overwrite(g, logits.var, name);
  LossValue* slot = g.loss_slot();
  LossValue* rows = ctx.template scratch<LossValue>(scratch_slot::loss_rows, labels.size);
  const float inv = 1.0f / static_cast<float>(logits.rows());
  if (scale)
    for_each_row(ctx, labels.size, logits.cols(),
                 detail::FusedCrossEntropyOp<true, S, C, T>{logits.var.data, labels.data, logits.cols(), scale, inv, rows});
  else
    for_each_row(ctx, labels.size, logits.cols(),
                 detail::FusedCrossEntropyOp<false, S, C, T>{logits.var.data, labels.data, logits.cols(), scale, inv, rows});
  transform_reduce(ctx, labels.size, detail::RowLossAt{rows}, detail::CombineLoss{}, LossValue{}, slot);
  // The gradient is written: a weight other than 1 rescales it, another loss's gradient takes it as a sum.
  auto seed = [](const Loss<P, B>& l, const float*, float weight, GradOut<T> grad) {
    const auto& v = l.prediction().var;
    if (!grad.accumulate && weight == 1.0f) return;
    for_each(l.graph().context(), v.size(), detail::AddGradOp<T>{v.data, grad.data, grad.accumulate, weight});
  };
  return Loss<P, B>(logits, labels.data, logits.cols(), slot, seed, name, {.on = true, .scale = scale});
}

// The optimizer (its scaler's scale) or a LossScaler that scales this loss's backward.
template <Policy P, Backend B, class ScaleSource>
  requires(!std::is_pointer_v<ScaleSource>)
Loss<P, B> fused_cross_entropy(Context<B>& ctx, const Output<P, B>& logits, Span<const std::int32_t> labels,
                               ScaleSource& by) {
  return fused_cross_entropy(ctx, logits, labels, detail::scale_of(by));
}

}  // namespace amp::nn
