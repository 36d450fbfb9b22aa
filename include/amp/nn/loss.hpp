#pragma once
// Losses: fp32 math whatever the inputs (the policy's compute_type<loss> may
// round intermediates, as O3 does), a mean over the batch accumulated in fp32,
// and a backward seed that multiplies by the loss scale read from the device.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "amp/nn/output.hpp"
#include "amp/backend/buffer.hpp"

namespace amp::nn {

template <Policy P, Backend B>
class Loss {
 public:
  using T = typename P::activation_type;
  // Writes scale * dL/dpred into grad (the producer's output gradient).
  using SeedFn = void (*)(Context<B>&, const Loss&, const float* scale, Matrix<T> grad);

  Loss(Context<B>& ctx, const Output<P, B>& pred, const void* target, std::int64_t classes, SeedFn seed,
       const char* name)
      : ctx_(&ctx), pred_(pred), target_(target), classes_(classes), seed_(seed), name_(name) {}

  // The loss value (one sync). An invalid target found on the device is reported here.
  float item() const {
    const LossValue v = download_one(*ctx_, static_cast<const LossValue*>(pred_.producer->loss_slot()));
    AMP_REQUIRE(v.bad_row < 0, name_, ": the target of row ", v.bad_row, " is invalid (a class label outside [0, ",
                classes_, ") or a non-finite value)");
    return v.value;
  }
  const LossValue* value_ptr() const { return pred_.producer->loss_slot(); }

  // Seeds the output gradient with the loss scale and back-propagates.
  void backward(const float* scale) {
    AMP_REQUIRE(pred_.producer, name_, ": the prediction has no producer to back-propagate into");
    seed_(*ctx_, *this, scale, pred_.producer->grad_output(pred_.rows()));
    pred_.producer->backward(*ctx_);
  }
  // Unscaled backward (scale 1), for code without a scaler.
  void backward() { backward(pred_.producer->unit_scale()); }

  Context<B>& context() const { return *ctx_; }
  const Output<P, B>& prediction() const { return pred_; }
  template <class Target>
  const Target* target() const { return static_cast<const Target*>(target_); }
  std::int64_t classes() const { return classes_; }

 private:
  Context<B>* ctx_;
  Output<P, B> pred_;
  const void* target_;
  std::int64_t classes_;
  SeedFn seed_;
  const char* name_;
};

namespace detail {
struct CombineLoss {
  AMP_HOST_DEVICE LossValue operator()(const LossValue& a, const LossValue& b) const {
    return {a.value + b.value, a.bad_row > b.bad_row ? a.bad_row : b.bad_row};
  }
};

// ---- mean squared error ------------------------------------------------------
template <class C, class T, class Y>
struct MseValueOp {
  const T* p;
  const Y* y;
  float inv_count;
  std::int64_t cols;
  AMP_HOST_DEVICE LossValue operator()(std::size_t i) const {
    const float t = cast<float>(y[i]);
    const float d = round_to<C>(cast<float>(p[i]) - t);
    const int bad = is_finite(t) ? -1 : static_cast<int>(static_cast<std::int64_t>(i) / cols);
    return {round_to<C>(d * d) * inv_count, bad};
  }
};

template <class C, class T, class Y>
struct MseGradOp {
  const T* p;
  const Y* y;
  T* g;
  const float* scale;
  float inv_count;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float d = round_to<C>(cast<float>(p[i]) - cast<float>(y[i]));
    g[i] = cast<T>(2.0f * d * inv_count * *scale);
  }
};

// ---- softmax cross-entropy (fused log-softmax + NLL), one row per call ----------
template <class C, class T>
struct CrossEntropyValueOp {
  const T* x;
  const std::int32_t* labels;
  std::int64_t classes;
  float inv_rows;
  AMP_HOST_DEVICE LossValue operator()(std::size_t r) const {
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) return {0.0f, static_cast<int>(r)};
    const T* row = x + static_cast<std::int64_t>(r) * classes;
    float m = cast<float>(row[0]);
    for (std::int64_t c = 1; c < classes; ++c) m = fmaxf(m, cast<float>(row[c]));
    float sum = 0.0f;
    for (std::int64_t c = 0; c < classes; ++c) sum += round_to<C>(expf(cast<float>(row[c]) - m));
    const float nll = round_to<C>(m + logf(sum) - cast<float>(row[label]));
    return {nll * inv_rows, -1};
  }
};

template <class C, class T>
struct CrossEntropyGradOp {
  const T* x;
  const std::int32_t* labels;
  T* g;
  std::int64_t classes;
  const float* scale;
  float inv_rows;
  AMP_HOST_DEVICE void operator()(std::size_t r) const {
    const std::int64_t base = static_cast<std::int64_t>(r) * classes;
    const std::int32_t label = labels[r];
    if (label < 0 || label >= classes) {  // never a silent gradient from a bad label: NaN, so the step skips
      for (std::int64_t c = 0; c < classes; ++c) g[base + c] = cast<T>(amp::detail::bits_float(0x7fc00000u));
      return;
    }
    float m = cast<float>(x[base]);
    for (std::int64_t c = 1; c < classes; ++c) m = fmaxf(m, cast<float>(x[base + c]));
    float sum = 0.0f;
    for (std::int64_t c = 0; c < classes; ++c) sum += round_to<C>(expf(cast<float>(x[base + c]) - m));
    const float k = inv_rows * *scale;
    for (std::int64_t c = 0; c < classes; ++c) {
      const float p = round_to<C>(expf(cast<float>(x[base + c]) - m) / sum);
      g[base + c] = cast<T>((p - (c == label ? 1.0f : 0.0f)) * k);
    }
  }
};

// ---- binary cross-entropy on logits --------------------------------------------
// max(x, 0) - x t + log(1 + exp(-|x|)): no overflow for any x.
template <class C, class T, class Y>
struct BceValueOp {
  const T* x;
  const Y* y;
  float inv_count;
  std::int64_t cols;
  AMP_HOST_DEVICE LossValue operator()(std::size_t i) const {
    const float v = cast<float>(x[i]);
    const float t = cast<float>(y[i]);
    const int bad = (t >= 0.0f && t <= 1.0f) ? -1 : static_cast<int>(static_cast<std::int64_t>(i) / cols);
    const float l = (v > 0.0f ? v : 0.0f) - v * t + log1pf(expf(-fabsf(v)));
    return {round_to<C>(l) * inv_count, bad};
  }
};

template <class C, class T, class Y>
struct BceGradOp {
  const T* x;
  const Y* y;
  T* g;
  const float* scale;
  float inv_count;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const float s = round_to<C>(1.0f / (1.0f + expf(-cast<float>(x[i]))));
    g[i] = cast<T>((s - cast<float>(y[i])) * inv_count * *scale);
  }
};

template <Policy P, Backend B>
void check_same_shape(const Output<P, B>& pred, std::int64_t rows, std::int64_t cols, const char* name) {
  AMP_REQUIRE(pred.rows() == rows && pred.cols() == cols, name, ": prediction [", pred.rows(), "x", pred.cols(),
              "] and target [", rows, "x", cols, "] differ in shape");
}
}  // namespace detail

namespace detail {
// A loss that is a mean over elements: Value maps an element to its share of
// the loss, Grad writes scale * dL/dpred; both see (pred, target) only.
template <template <class, class, class> class Value, template <class, class, class> class Grad, Policy P,
          Backend B, Scalar Y>
Loss<P, B> elementwise_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target, const char* name) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::loss>;
  check_same_shape(pred, target.rows, target.cols, name);
  AMP_REQUIRE(target.contiguous(), name, ": the target must be contiguous");
  const auto n = static_cast<std::size_t>(target.size());
  transform_reduce(ctx, n, Value<C, T, Y>{pred.value.data, target.data, 1.0f / static_cast<float>(n), target.cols},
                   CombineLoss{}, LossValue{}, pred.producer->loss_slot());
  auto seed = [](Context<B>& c, const Loss<P, B>& l, const float* scale, Matrix<T> grad) {
    const auto count = static_cast<std::size_t>(grad.size());
    for_each(c, count, Grad<C, T, Y>{l.prediction().value.data, l.template target<Y>(), grad.data, scale,
                                     1.0f / static_cast<float>(count)});
  };
  return Loss<P, B>(ctx, pred, target.data, 0, seed, name);
}
}  // namespace detail

template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target) {
  return detail::elementwise_loss<detail::MseValueOp, detail::MseGradOp>(ctx, pred, target, "mse_loss");
}

template <Policy P, Backend B, Scalar Y>
Loss<P, B> mse_loss(Context<B>& ctx, const Output<P, B>& pred, Matrix<Y> target) {
  return mse_loss(ctx, pred, Matrix<const Y>(target));
}

// Softmax cross-entropy with integer class labels, mean over the batch.
template <Policy P, Backend B>
Loss<P, B> cross_entropy(Context<B>& ctx, const Output<P, B>& pred, Span<const std::int32_t> labels) {
  using T = typename P::activation_type;
  using C = typename P::template compute_type<op::loss>;
  AMP_REQUIRE(static_cast<std::int64_t>(labels.size) == pred.rows(), "cross_entropy: ", labels.size,
              " labels for a prediction of ", pred.rows(), " rows");
  if constexpr (std::is_same_v<B, host>) {  // host memory: say which label is wrong right away
    for (std::size_t r = 0; r < labels.size; ++r)
      AMP_REQUIRE(labels[r] >= 0 && labels[r] < pred.cols(), "cross_entropy: label ", labels[r], " at row ", r,
                  " is outside [0, ", pred.cols(), ")");
  }
  const float inv = 1.0f / static_cast<float>(pred.rows());
  transform_reduce(ctx, labels.size, detail::CrossEntropyValueOp<C, T>{pred.value.data, labels.data, pred.cols(), inv},
                   detail::CombineLoss{}, LossValue{}, pred.producer->loss_slot());
  auto seed = [](Context<B>& c, const Loss<P, B>& l, const float* scale, Matrix<T> grad) {
    for_each(c, static_cast<std::size_t>(grad.rows),
             detail::CrossEntropyGradOp<C, T>{l.prediction().value.data, l.template target<std::int32_t>(), grad.data,
                                              grad.cols, scale, 1.0f / static_cast<float>(grad.rows)});
  };
  return Loss<P, B>(ctx, pred, labels.data, pred.cols(), seed, "cross_entropy");
}

// Binary cross-entropy on logits, targets in [0, 1], mean over all elements.
template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, Matrix<const Y> target) {
  return detail::elementwise_loss<detail::BceValueOp, detail::BceGradOp>(ctx, pred, target, "bce_with_logits");
}

template <Policy P, Backend B, Scalar Y>
Loss<P, B> bce_with_logits(Context<B>& ctx, const Output<P, B>& pred, Matrix<Y> target) {
  return bce_with_logits(ctx, pred, Matrix<const Y>(target));
}

}  // namespace amp::nn
