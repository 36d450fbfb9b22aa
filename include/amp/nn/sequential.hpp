#pragma once
// A chain of layers composed at compile time, as a Model. Its parameters are
// named as torch.nn.Sequential would name them ("0.weight", "2.bias": a Linear
// with a fused activation counts as two modules), so weights move to and from
// PyTorch unchanged.
#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "amp/model/model.hpp"

namespace amp::nn {

namespace detail {
template <Policy P, Backend B, template <class, class> class... Layers>
class Chain {
 public:
  using T = typename P::activation_type;
  static constexpr std::size_t size = sizeof...(Layers);

  explicit Chain(Builder<P, B> b, const typename Layers<P, B>::Config&... cfgs)
      : layers_(build(b, std::make_index_sequence<size>{}, cfgs...)), first_features_(first_features(cfgs...)) {}

  template <class X>
  Var<T> forward(Graph<P, B>& g, X x) {
    return run<0>(g, x);
  }

  // A first layer that says its input size (a Linear) gives the model's input.
  std::vector<Input> default_inputs() const {
    if (first_features_ > 0) return {Input{Shape{first_features_}}};
    return {};
  }

  template <std::size_t I>
  auto& layer() {
    return std::get<I>(layers_);
  }

 private:
  template <std::size_t... I>
  static std::tuple<Layers<P, B>...> build(Builder<P, B> b, std::index_sequence<I...>,
                                           const typename Layers<P, B>::Config&... cfgs) {
    const std::array<int, size> slots{Layers<P, B>::torch_slots(cfgs)...};
    std::array<int, size> start{};
    for (std::size_t k = 1; k < size; ++k) start[k] = start[k - 1] + slots[k - 1];
    // A braced list constructs (and so declares parameters) left to right.
    return std::tuple<Layers<P, B>...>{Layers<P, B>(b.child(std::to_string(start[I])), cfgs)...};
  }

  template <class First, class... Rest>
  static std::int64_t first_features(const First& first, const Rest&...) {
    if constexpr (requires { first.in_features; }) return first.in_features;
    else return 0;
  }

  template <std::size_t I, class X>
  Var<T> run(Graph<P, B>& g, X x) {
    if constexpr (I + 1 == size) {
      return std::get<I>(layers_)(g, x);
    } else {
      return run<I + 1>(g, std::get<I>(layers_)(g, x));
    }
  }

  std::tuple<Layers<P, B>...> layers_;
  std::int64_t first_features_;
};
}  // namespace detail

template <Policy P, Backend B, template <class, class> class... Layers>
class Sequential : public Model<P, B, detail::Chain<P, B, Layers...>> {
  using Base = Model<P, B, detail::Chain<P, B, Layers...>>;

 public:
  Sequential(Context<B>& ctx, ModelOptions options, const typename Layers<P, B>::Config&... cfgs)
      : Base(ctx, std::move(options), cfgs...) {}

  template <std::size_t I>
  auto& layer() {
    return this->net().template layer<I>();
  }
};

}  // namespace amp::nn
