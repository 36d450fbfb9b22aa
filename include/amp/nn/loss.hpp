#pragma once
// Losses: fp32 math whatever the inputs (the policy's compute_type<loss> may
// round intermediates, as O3 does), a mean over the batch accumulated in fp32,
// the value in its own slot of the graph (two losses never share one), and a
// backward that seeds the prediction's gradient with scale * dL/dpred (adding
// to what other losses seeded) and runs the graph's backward once.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/nn/ops.hpp"
#include "amp/model/output.hpp"
#include "amp/nn/loss_sum.hpp"

namespace amp::nn {

namespace detail {
struct CombineLoss {
  AMP_HOST_DEVICE LossValue operator()(const LossValue& a, const LossValue& b) const {
    return {a.value + b.value, a.bad_row > b.bad_row ? a.bad_row : b.bad_row};
  }
};

// The scale a seed multiplies by: read from the device, or 1 with no work at all.
template <bool Scaled>
AMP_HOST_DEVICE inline float seed_factor(const float* scale, float weight) {
  if constexpr (Scaled) return weight * *scale;
  else return weight;
}

// ---- element-wise losses: a rule per loss, one pair of functors for all ------------
// A rule gives an element's share of the loss and its derivative in the
// prediction p for the target t (C rounds, compute_type<loss>), and says which
// targets are valid.
struct MseRule {
  template <class C>
  AMP_HOST_DEVICE static float value(float p, float t) {
    const float d = round_to<C>(p - t);
    return round_to<C>(d * d);
  }
  template <class C>
  AMP_HOST_DEVICE static float grad(float p, float t) { return 2.0f * round_to<C>(p - t); }
  AMP_HOST_DEVICE static bool valid(float t) { return is_finite(t); }
};

// Binary cross-entropy on logits: max(x, 0) - x t + log(1 + exp(-|x|)), no overflow for any x.
struct BceRule {
  template <class C>
  AMP_HOST_DEVICE static float value(float x, float t) {
    return round_to<C>((x > 0.0f ? x : 0.0f) - x * t + log1pf(expf(-fabsf(x))));
  }
  template <class C>
  AMP_HOST_DEVICE static float grad(float x, float t) { return round_to<C>(1.0f / (1.0f + expf(-x))) - t; }
  AMP_HOST_DEVICE static bool valid(float t) { return t >= 0.0f && t <= 1.0f; }
};

template <class Rule, class C, class T, class Y>
struct ElementwiseValueOp {
  const T* p;
  const Y* y;
  float inv_count;
  std::int64_t cols;
  AMP_HOST_DEVICE LossValue operator()(std::size_t i) const {
    const float t = cast<float>(y[i]);
    const int bad = Rule::valid(t) ? -1 : static_cast<int>(static_cast<std::int64_t>(i) / cols);
    return {Rule::template value<C>(cast<float>(p[i]), t) * inv_count, bad};
  }
};

template <bool Scaled, class Rule, class C, class T, class Y>
struct ElementwiseGradOp {
  const T* p;
  const Y* y;
  T* g;
  const float* scale;
  float weight, inv_count;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float d = Rule::template grad<C>(cast<float>(p[i]), cast<float>(y[i]));
    store_grad(g, i, d * inv_count * seed_factor<Scaled>(scale, weight), accumulate);
  }
};

// ---- softmax cross-entropy (fused log-softmax + NLL), row ops (backend/rows.hpp) ----
// S rounds the softmax's terms (compute_type<softmax>), C the loss (compute_type<loss>).
// A row's max and its softmax denominator, sum exp(x - max), over the lanes.
template <class S, class T, class Lanes>
AMP_HOST_DEVICE inline void softmax_denominator(const Lanes& lanes, const T* row, std::int64_t n, float& max,
                                                float& sum) {
  max = lanes.max(n, [&](std::int64_t c) { return cast<float>(row[c]); });
  const float m = max;
  sum = lanes.sum(n, [&](std::int64_t c) { return round_to<S>(expf(cast<float>(row[c]) - m)); });
}

// The math both cross-entropy paths share (fused_cross_entropy's equals this one bit for bit):
// a row's share of the mean loss, log-sum-exp minus the label's logit, rounded in C;
template <class C>
AMP_HOST_DEVICE inline float cross_entropy_row_loss(float max, float sum, float at_label, float inv_rows) {
  return round_to<C>(max + logf(sum) - at_label) * inv_rows;
}
// one element of k (softmax - onehot), the softmax rounded in S;
template <class S>
AMP_HOST_DEVICE inline float cross_entropy_grad(float x, float max, float sum, bool is_label, float k) {
  return (round_to<S>(expf(x - max) / sum) - (is_label ? 1.0f : 0.0f)) * k;
}
// and a bad label's gradient: never a silent one, NaN, so the step skips.
AMP_HOST_DEVICE inline float bad_label_grad() { return amp::detail::bits_float(0x7fc00000u); }

// Row r's share of the mean loss into out[r], or the row's index where its label is invalid.
template <class S, class C, class T>
struct CrossEntropyRowOp {
  const T* x;
  const std::int32_t* labels;
  std::int64_t classes;
  float inv_rows;
  LossValue* out;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) {
      lanes.each(1, [&](std::int64_t) { out[r] = {0.0f, static_cast<int>(r)}; });
      return;
    }
    const T* row = x + static_cast<std::int64_t>(r) * classes;
    float m, sum;
    softmax_denominator<S>(lanes, row, classes, m, sum);
    lanes.each(1, [&](std::int64_t) { out[r] = {cross_entropy_row_loss<C>(m, sum, cast<float>(row[label]), inv_rows), -1}; });
  }
};
struct RowLossAt {
  const LossValue* rows;
  AMP_HOST_DEVICE LossValue operator()(std::size_t r) const { return rows[r]; }
};

template <bool Scaled, class S, class C, class T>
struct CrossEntropyGradOp {
  const T* x;
  const std::int32_t* labels;
  T* g;
  std::int64_t classes;
  const float* scale;
  float weight, inv_rows;
  bool accumulate;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const std::int64_t base = static_cast<std::int64_t>(r) * classes;
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) {
      lanes.each(classes, [&](std::int64_t c) { g[base + c] = cast<T>(bad_label_grad()); });
      return;
    }
    float m, sum;
    softmax_denominator<S>(lanes, x + base, classes, m, sum);
    const float k = inv_rows * seed_factor<Scaled>(scale, weight);
    lanes.each(classes, [&](std::int64_t c) {
      store_grad(g, static_cast<std::size_t>(base + c), cross_entropy_grad<S>(cast<float>(x[base + c]), m, sum, c == label, k),
                 accumulate);
    });
  }
};

template <Policy P, Backend B>
void check_same_shape(const Output<P, B>& pred, std::int64_t rows, std::int64_t cols, const char* name) {
  AMP_REQUIRE(pred.rows() == rows && pred.cols() == cols, name, ": prediction [", pred.rows(), "x", pred.cols(),
              "] and target [", rows, "x", cols, "] differ in shape");
}

// Class labels for the prediction's rows; on the host a wrong one is named right away.
template <Policy P, Backend B>
void check_labels(Context<B>& ctx, const Output<P, B>& pred, Span<const std::int32_t> labels, const char* name) {
  pred.require_current(name);
  AMP_REQUIRE(&ctx == &pred.graph->context(), name, ": the prediction lives on another context");
  AMP_REQUIRE(static_cast<std::int64_t>(labels.size) == pred.rows(), name, ": ", labels.size,
              " labels for a prediction of ", pred.rows(), " rows");
  if constexpr (std::is_same_v<B, host>) {
    for (std::size_t r = 0; r < labels.size; ++r)
      AMP_REQUIRE(labels[r] >= 0 && labels[r] < pred.cols(), name, ": label ", labels[r], " at row ", r,
                  " is outside [0, ", pred.cols(), ")");
  }
}

// A loss that is a mean over elements, by its Rule.
template <class Rule, Policy P, Backend B, Scalar Y>
Loss<P, B> elementwise_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target, const char* name) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::loss>;
  pred.require_current(name);
  AMP_REQUIRE(&ctx == &pred.graph->context(), name, ": the prediction lives on another context");
  check_same_shape(pred, target.rows, target.cols, name);
  AMP_REQUIRE(target.contiguous(), name, ": the target must be contiguous");
  const auto n = static_cast<std::size_t>(target.size());
  LossValue* slot = pred.graph->loss_slot();
  transform_reduce(ctx, n, ElementwiseValueOp<Rule, C, T, Y>{pred.var.data, target.data, 1.0f / static_cast<float>(n), target.cols},
                   CombineLoss{}, LossValue{}, slot);
  auto seed = [](const Loss<P, B>& l, const float* scale, float weight, GradOut<T> g) {
    const auto count = l.prediction().var.size();
    const float inv = 1.0f / static_cast<float>(count);
    const T* p = l.prediction().var.data;
    auto& c = l.graph().context();
    const Y* y = l.template target<Y>();
    if (scale) for_each(c, count, ElementwiseGradOp<true, Rule, C, T, Y>{p, y, g.data, scale, weight, inv, g.accumulate});
    else for_each(c, count, ElementwiseGradOp<false, Rule, C, T, Y>{p, y, g.data, scale, weight, inv, g.accumulate});
  };
  return Loss<P, B>(pred, target.data, 0, slot, seed, name);
}

// A tensor target (what amp::data's loader gives) as a matrix, once its shape is the prediction's.
template <Policy P, Backend B, Scalar Y>
Matrix<const Y> target_matrix(const Output<P, B>& pred, TensorView<const Y> target, const char* name) {
  AMP_REQUIRE(pred.shape() == target.shape, name, ": prediction ", pred.shape().str(), " and target ",
              target.shape.str(), " differ in shape");
  return target.matrix();
}
}  // namespace detail

// Mean squared error over all elements; the target is a matrix, or a tensor
// of the prediction's shape (a loader's batch).
template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target) {
  return detail::elementwise_loss<detail::MseRule>(ctx, pred, target, "mse_loss");
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<Y> target) {
  return mse_loss(ctx, pred, Matrix<const Y>(target));
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, TensorView<const Y> target) {
  return mse_loss(ctx, pred, detail::target_matrix(pred, target, "mse_loss"));
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, TensorView<Y> target) {
  return mse_loss(ctx, pred, TensorView<const Y>(target));
}

// Softmax cross-entropy with integer class labels, mean over the batch.
template <Policy P, Backend B>
Loss<P, B> cross_entropy(Context<B>& ctx, const Output<P, B>& pred, Span<const std::int32_t> labels) {
  using T = typename P::activation_type;
  using S = typename P::template compute_type<op::softmax>;
  using C = typename P::template compute_type<op::loss>;
  detail::check_labels(ctx, pred, labels, "cross_entropy");
  LossValue* slot = pred.graph->loss_slot();
  const float inv = 1.0f / static_cast<float>(pred.rows());
  // Each row's loss by its lanes, then their sum: no row's softmax is ever one thread's work on a GPU.
  LossValue* rows = ctx.template scratch<LossValue>(scratch_slot::loss_rows, labels.size);
  for_each_row(ctx, labels.size, pred.cols(),
               detail::CrossEntropyRowOp<S, C, T>{pred.var.data, labels.data, pred.cols(), inv, rows});
  transform_reduce(ctx, labels.size, detail::RowLossAt{rows}, detail::CombineLoss{}, LossValue{}, slot);
  auto seed = [](const Loss<P, B>& l, const float* scale, float weight, GradOut<T> g) {
    const auto& p = l.prediction();
    const auto rows = static_cast<std::size_t>(p.rows());
    const float k = 1.0f / static_cast<float>(rows);
    const auto* y = l.template target<std::int32_t>();
    auto& c = l.graph().context();
    if (scale)
      for_each_row(c, rows, p.cols(),
                   detail::CrossEntropyGradOp<true, S, C, T>{p.var.data, y, g.data, p.cols(), scale, weight, k, g.accumulate});
    else
      for_each_row(c, rows, p.cols(),
                   detail::CrossEntropyGradOp<false, S, C, T>{p.var.data, y, g.data, p.cols(), scale, weight, k, g.accumulate});
  };
  return Loss<P, B>(pred, labels.data, pred.cols(), slot, seed, "cross_entropy");
}

// Binary cross-entropy on logits, targets in [0, 1], mean over all elements.
template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target) {
  return detail::elementwise_loss<detail::BceRule>(ctx, pred, target, "bce_with_logits");
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, Matrix<Y> target) {
  return bce_with_logits(ctx, pred, Matrix<const Y>(target));
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, TensorView<const Y> target) {
  return bce_with_logits(ctx, pred, detail::target_matrix(pred, target, "bce_with_logits"));
}
template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, TensorView<Y> target) {
  return bce_with_logits(ctx, pred, TensorView<const Y>(target));
}

}  // namespace amp::nn
