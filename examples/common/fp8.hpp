#pragma once
// The FP8 state of a trained model, for the examples' summaries and JSON:
// which Linear layers ran their GEMMs in FP8 (the policy keeps the first and
// last layers out), the formats and recipe, and each operand's final scale.
#include <cstdio>
#include <string>
#include <vector>

#include <amp/amp.hpp>

#include "common/json.hpp"

namespace examples {

struct Fp8Layer {
  std::string name;
  bool fp8 = false;
  float scale[amp::nn::fp8_operands] = {};  // input, weight, output gradient
};

struct Fp8Summary {
  std::string formats, recipe;  // empty formats: the policy has no FP8
  std::vector<Fp8Layer> layers;
};

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

inline void print_fp8(const std::string& level, const Fp8Summary& s) {
  if (s.formats.empty()) return;
  std::printf("\n%s FP8 GEMMs (%s; %s): layer, final scales of input, weight, output gradient\n", level.c_str(),
              s.formats.c_str(), s.recipe.c_str());
  for (const auto& l : s.layers) {
    if (l.fp8) std::printf("  %-20s fp8   %-11g %-11g %g\n", l.name.c_str(), l.scale[0], l.scale[1], l.scale[2]);
    else std::printf("  %-20s bf16  (a first or last layer: kept out of FP8)\n", l.name.c_str());
  }
}

// "fp8": null, or {formats, recipe, layers: [{name, fp8, scales: {input, weight, grad}}]}.
inline void json_fp8(Json& j, const Fp8Summary& s) {
  j.key("fp8");
  if (s.formats.empty()) {
    j.null();
    return;
  }
  j.object().field("formats", s.formats).field("recipe", s.recipe).key("layers").array();
  for (const auto& l : s.layers) {
    j.object().field("name", l.name).field("fp8", l.fp8).key("scales").object();
    for (int o = 0; o < amp::nn::fp8_operands; ++o)
      j.field(amp::nn::fp8_operand_name(static_cast<amp::nn::fp8_operand>(o)), l.scale[o]);
    j.end().end();
  }
  j.end().end();
}

}  // namespace examples
