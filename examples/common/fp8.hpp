#pragma once
// The FP8 state of a trained model, for the examples' summaries and JSON:
// which Linear layers ran their GEMMs in FP8 (the policy keeps the first and
// last layers out), the formats and recipe, and each operand's final scale.
// No amp model headers: a program's main prints it (common/fp8_summary.hpp
// reads it from a model).
#include <cstdio>
#include <string>
#include <vector>

#include "common/json.hpp"

namespace examples {

struct Fp8Layer {
  std::string name;
  bool fp8 = false;
  float scale[3] = {};  // input, weight, output gradient (amp::nn::fp8_operand's order)
};

struct Fp8Summary {
  std::string formats, recipe;  // empty formats: the policy has no FP8
  std::vector<Fp8Layer> layers;
};

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
    j.field("input", l.scale[0]).field("weight", l.scale[1]).field("grad", l.scale[2]).end().end();
  }
  j.end().end();
}

}  // namespace examples
