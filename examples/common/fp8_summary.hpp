#pragma once
// A trained model's FP8 state as common/fp8.hpp's summary.
#include <string>

#include <amp/amp.hpp>

#include "common/fp8.hpp"

namespace examples {

static_assert(amp::nn::fp8_operands == 3 && int(amp::nn::fp8_operand::input) == 0 &&
              int(amp::nn::fp8_operand::weight) == 1 && int(amp::nn::fp8_operand::grad) == 2,
              "Fp8Layer::scale and json_fp8 follow amp::nn::fp8_operand's order");

// The store's FP8 layers and scales (one download: call it after training).
template <amp::Policy P, amp::Backend B>
Fp8Summary fp8_summary(const amp::nn::ParameterStore<P, B>& store) {
  Fp8Summary s;
  if constexpr (amp::uses_fp8_v<P>) {
    using F = typename P::fp8;
    using R = typename F::recipe;
    s.formats = std::string(amp::fp8_format<typename F::forward_type>::name) + " forward, " +
                std::string(amp::fp8_format<typename F::backward_type>::name) + " gradients";
    s.recipe = R::delayed ? "delayed scaling, amax history " + std::to_string(R::history) + ", margin " +
                                std::to_string(R::margin)
                          : "current scaling, margin " + std::to_string(R::margin);
    const auto& fp8 = store.fp8();
    const auto scales = amp::download(store.context(), amp::Span<const float>(fp8.scale_values()));
    for (std::size_t l = 0; l < fp8.layers().size(); ++l) {
      Fp8Layer row{fp8.layers()[l].name, fp8.layers()[l].enabled, {}};
      for (int o = 0; o < amp::nn::fp8_operands; ++o) row.scale[o] = scales[l * amp::nn::fp8_operands + o];
      s.layers.push_back(row);
    }
  }
  return s;
}

}  // namespace examples
