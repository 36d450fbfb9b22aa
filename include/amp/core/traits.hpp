#pragma once
// Names and sizes of amp scalars, for tables, errors and memory reports.
#include <string_view>
#include <type_traits>

#include "amp/core/numeric.hpp"

namespace amp {

template <class T>
constexpr std::string_view type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, half>) return "fp16";
  else if constexpr (std::is_same_v<T, bfloat16>) return "bf16";
  else if constexpr (std::is_same_v<T, double>) return "fp64";
  else return "?";
}

}  // namespace amp
