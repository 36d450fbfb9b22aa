#pragma once
// What a model's forward returns: its output and the way back. There is no tape;
// a loss seeds the producer's output gradient and asks it to run backward.
#include <cstdint>

#include "amp/backend/backend.hpp"
#include "amp/core/span.hpp"
#include "amp/policy.hpp"

namespace amp::nn {

// A loss value as it is reduced: the mean, and a row whose target was invalid (-1: none).
struct LossValue {
  float value = 0.0f;
  int bad_row = -1;
};

template <Policy P, Backend B>
class Backprop {
 public:
  using value_type = typename P::activation_type;
  // Where dL/d(output) goes for the last forward's `rows` rows.
  virtual Matrix<value_type> grad_output(std::int64_t rows) = 0;
  // Back-propagates grad_output into the parameter gradients (accumulating).
  virtual void backward(Context<B>& ctx) = 0;
  // Persistent storage for the loss value, so that a loss allocates nothing.
  virtual LossValue* loss_slot() = 0;
  // A backend 1.0f: the scale of an unscaled backward.
  virtual const float* unit_scale() = 0;

 protected:
  ~Backprop() = default;
};

template <Policy P, Backend B>
struct Output {
  using value_type = typename P::activation_type;
  Matrix<const value_type> value;
  Backprop<P, B>* producer = nullptr;

  std::int64_t rows() const { return value.rows; }
  std::int64_t cols() const { return value.cols; }
  operator Matrix<const value_type>() const { return value; }
};

}  // namespace amp::nn
