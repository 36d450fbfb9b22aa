#pragma once
// GEMM test cases shared by the host test and its CUDA twin.
#include <cstdint>

#include "amp/core/numeric.hpp"

namespace amp::test {

template <class In, class Out>
struct GemmTypes {
  using input = In;
  using output = Out;
};

using GemmFp32 = GemmTypes<float, float>;
using GemmFp16 = GemmTypes<half, half>;
using GemmFp16ToFp32 = GemmTypes<half, float>;
using GemmBf16 = GemmTypes<bfloat16, bfloat16>;
using GemmBf16ToFp32 = GemmTypes<bfloat16, float>;

// Tolerance relative to sum |a||b|: fp32 accumulation over k terms, plus one
// rounding of the output into its type.
template <class Out>
double gemm_rtol(std::int64_t k) {
  return 4.0 * static_cast<double>(k) * unit_roundoff<float> + 2.0 * unit_roundoff<Out>;
}

struct GemmCase {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
};

inline constexpr GemmCase gemm_cases[] = {
    {7, 5, 3, false, false, 1.0f, 0.0f},   {33, 17, 65, false, true, 1.0f, 0.0f},
    {33, 17, 65, true, false, 0.5f, 1.0f}, {16, 64, 128, true, true, 1.0f, 0.25f},
    {1, 128, 300, false, false, 2.0f, 0.0f}, {128, 1, 300, false, true, 1.0f, 1.0f},
};

}  // namespace amp::test
