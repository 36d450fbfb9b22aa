#pragma once
// A loss on the tape (what the loss functions of nn/loss.hpp return): its
// value in its own slot of the graph, its seed of the prediction's gradient
// (scale * dL/dpred, added to what other losses seeded), one backward; and
// weighted sums of losses back-propagated together.
#include <cstdint>
#include <utility>
#include <vector>

#include "amp/model/output.hpp"

namespace amp::nn {

template <Policy P, Backend B>
class Loss {
 public:
  using T = typename P::activation_type;
  // Adds weight * scale * dL/dpred into grad (scale: a backend pointer, or nullptr for 1).
  using SeedFn = void (*)(const Loss&, const float* scale, float weight, GradOut<T> grad);
  // A fused loss (fused_cross_entropy): its forward already wrote scale * dL/dpred over pred.
  struct InPlace {
    bool on = false;
    const float* scale = nullptr;
  };

  Loss(const Output<P, B>& pred, const void* target, std::int64_t classes, LossValue* slot, SeedFn seed,
       const char* name, InPlace in_place = {})
      : pred_(pred), target_(target), classes_(classes), slot_(slot), seed_(seed), name_(name), in_place_(in_place) {}

  // The loss value (one sync), while its iteration lasts. An invalid target
  // found on the device is reported here.
  float item() const {
    graph().require_iteration(pred_.var, name_, ".item() (a Loss)");  // reads its slot only
    const LossValue v = download_one(graph().context(), static_cast<const LossValue*>(slot_));
    AMP_REQUIRE(v.bad_row < 0, name_, ": the target of row ", v.bad_row, " is invalid (a class label outside [0, ",
                classes_, ") or a value that is not finite or out of range)");
    return v.value;
  }
  const LossValue* value_ptr() const { return slot_; }

  // Throws unless seed(scale) may run: nothing is written before every check passed.
  void check_seed(const float* scale) const {
    require_current("backward()");
    AMP_REQUIRE(!graph().backward_done(), name_, " (a loss of iteration ", pred_.var.iteration,
                "): backward() already ran on that iteration; each iteration is back-propagated once (to "
                "back-propagate several losses, sum them: (a + b).backward())");
    AMP_REQUIRE(pred_.var.id >= 0, name_, ": the prediction takes no gradient (it is an input of the model, not an output)");
    if (!in_place_.on) return;
    AMP_REQUIRE(scale == in_place_.scale, name_, ": back-propagated with ", scale ? "a scale" : "no scale",
                " other than the one its forward applied (", in_place_.scale ? "a scaler's" : "none",
                "): give it the optimizer or scaler that scales its backward");
    AMP_REQUIRE(!graph().grad(pred_.var), name_, ": seeded already (a second seed would weight the gradient "
                "written over the logits again; in a sum, weights of one loss add: 0.5f * l + 0.5f * l)");
  }
  // Seeds dL/dpred (times weight and the scale) without running backward.
  void seed(const float* scale, float weight = 1.0f) const {
    check_seed(scale);
    seed_(*this, scale, weight, in_place_.on ? graph().grad_in_place(pred_.var) : graph().grad_out(pred_.var));
  }
  // Seeds with scale (a backend pointer; nullptr: unscaled) and back-propagates.
  void backward(const float* scale = nullptr) const {
    seed(scale);
    graph().backward(scale != nullptr);
  }

  Graph<P, B>& graph() const { return *pred_.graph; }
  const Output<P, B>& prediction() const { return pred_; }
  // Throws unless the loss belongs to its graph's iteration in progress.
  void require_current(const char* call) const {
    if (in_place_.on) pred_.graph->require_iteration(pred_.var, name_, ".", call, " (a Loss)");  // pred holds its gradient
    else pred_.require_current(name_, ".", call, " (a Loss)");
  }
  template <class Target>
  const Target* target() const {
    return static_cast<const Target*>(target_);
  }
  std::int64_t classes() const { return classes_; }

 private:
  Output<P, B> pred_;
  const void* target_;
  std::int64_t classes_;
  LossValue* slot_;
  SeedFn seed_;
  const char* name_;
  InPlace in_place_;
};

// Several losses back-propagated together (an auxiliary head, a regulariser):
// sum = a + 0.3f * b; each seeds its share, then one backward.
template <Policy P, Backend B>
class LossSum {
 public:
  LossSum() = default;
  LossSum(const Loss<P, B>& l, float weight = 1.0f) : terms_{{l, weight}} {}

  LossSum& operator+=(const LossSum& o) {
    for (const auto& t : o.terms_) {
      AMP_REQUIRE(terms_.empty() || &t.first.graph() == &terms_.front().first.graph(),
                  "losses of different models are back-propagated separately, not summed");
      terms_.push_back(t);
    }
    return *this;
  }
  float item() const {
    float total = 0.0f;
    for (const auto& [loss, weight] : terms_) total += weight * loss.item();
    return total;
  }
  void backward(const float* scale = nullptr) const {
    AMP_REQUIRE(!terms_.empty(), "LossSum::backward: no losses");
    for (const auto& [loss, weight] : terms_) loss.check_seed(scale);  // all of them before any seeds
    // A loss in the sum twice seeds once, with its weights added (a fused loss can seed only once).
    for (std::size_t i = 0; i < terms_.size(); ++i) {
      const auto same = [&](std::size_t j) { return terms_[j].first.value_ptr() == terms_[i].first.value_ptr(); };
      bool first = true;
      for (std::size_t j = 0; j < i; ++j) first = first && !same(j);
      if (!first) continue;
      float weight = 0.0f;
      for (std::size_t j = i; j < terms_.size(); ++j)
        if (same(j)) weight += terms_[j].second;
      terms_[i].first.seed(scale, weight);
    }
    terms_.front().first.graph().backward(scale != nullptr);
  }
  Graph<P, B>& graph() const { return terms_.front().first.graph(); }

 private:
  std::vector<std::pair<Loss<P, B>, float>> terms_;
};

template <Policy P, Backend B>
LossSum<P, B> operator*(float w, const Loss<P, B>& l) {
  return LossSum<P, B>(l, w);
}
template <Policy P, Backend B>
LossSum<P, B> operator+(LossSum<P, B> a, const LossSum<P, B>& b) {
  return a += b;
}
template <Policy P, Backend B>
LossSum<P, B> operator+(const Loss<P, B>& a, const Loss<P, B>& b) {
  return LossSum<P, B>(a) + LossSum<P, B>(b);
}
template <Policy P, Backend B>
LossSum<P, B> operator+(LossSum<P, B> a, const Loss<P, B>& b) {
  return a += LossSum<P, B>(b);
}
template <Policy P, Backend B>
LossSum<P, B> operator+(const Loss<P, B>& a, const LossSum<P, B>& b) {
  return LossSum<P, B>(a) + b;
}

}  // namespace amp::nn
