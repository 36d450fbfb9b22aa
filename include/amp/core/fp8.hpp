#pragma once
// FP8 operand types. amp::fp8_e4m3 and amp::fp8_e5m2 are CUDA's own (cuda_fp8.h),
// so buffers pass to cuBLASLt unchanged. They are GEMM operand formats, not
// storage types: a tensor is cast into one with a per-tensor scale right before
// a GEMM (code = encode(x * scale)) and the GEMM multiplies by 1 / scale.
// Encoding rounds to nearest even and saturates to the finite range (E4M3
// +-448, E5M2 +-57344; infinities saturate too), NaN stays NaN (0x7f), as
// CUDA's cvt.rn.satfinite and __nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..) do.
// The host does it with integer arithmetic and selects (a loop over it
// vectorises); the device with the conversion instruction.
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <cuda_fp8.h>

#include "amp/core/numeric.hpp"

namespace amp {

using fp8_e4m3 = __nv_fp8_e4m3;
using fp8_e5m2 = __nv_fp8_e5m2;

template <class F>
inline constexpr bool is_fp8_v = std::is_same_v<F, fp8_e4m3> || std::is_same_v<F, fp8_e5m2>;

// The constants of each format: exponent bias, mantissa bits, the largest
// finite code and value (the code below it is NaN for E4M3, infinity for E5M2).
template <class F>
struct fp8_format;

template <>
struct fp8_format<fp8_e4m3> {
  static constexpr int bias = 7, mantissa = 3;
  static constexpr std::uint32_t max_code = 0x7eu;
  static constexpr float max = 448.0f;
  static constexpr std::string_view name = "e4m3";
  static constexpr __nv_fp8_interpretation_t cuda = __NV_E4M3;
};

template <>
struct fp8_format<fp8_e5m2> {
  static constexpr int bias = 15, mantissa = 2;
  static constexpr std::uint32_t max_code = 0x7bu;
  static constexpr float max = 57344.0f;
  static constexpr std::string_view name = "e5m2";
  static constexpr __nv_fp8_interpretation_t cuda = __NV_E5M2;
};

// Unit roundoff of an FP8 format (half an ulp at 1): the tests' yardstick.
template <class F>
inline constexpr double fp8_unit_roundoff = 1.0 / static_cast<double>(2u << fp8_format<F>::mantissa);

namespace detail {

// float -> FP8 code on the host: round the magnitude to the format's mantissa
// (nearest even), rebias, clamp to the largest finite code; below the smallest
// normal, round |x| / (smallest subnormal) to an integer with the FPU's own
// round-to-even (adding 2^23 leaves the integer in the low bits).
template <class F>
inline std::uint8_t fp8_encode_host(float x) {
  using Fmt = fp8_format<F>;
  constexpr int drop = 23 - Fmt::mantissa;
  constexpr std::uint32_t min_normal = static_cast<std::uint32_t>(127 - Fmt::bias + 1) << 23;
  constexpr float inv_min_subnormal = static_cast<float>(1u << (Fmt::bias - 1 + Fmt::mantissa));
  const std::uint32_t u = float_bits(x), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
  const std::uint32_t rounded = (a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop;
  const std::uint32_t normal = rounded - (static_cast<std::uint32_t>(127 - Fmt::bias) << Fmt::mantissa);
  const std::uint32_t subnormal = float_bits(bits_float(a) * inv_min_subnormal + 8388608.0f) - 0x4b000000u;
  std::uint32_t code = a >= min_normal ? (normal < Fmt::max_code ? normal : Fmt::max_code) : subnormal;
  code = a > 0x7f800000u ? 0x7fu : code | sign;  // NaN: the canonical 0x7f, unsigned
  return static_cast<std::uint8_t>(code);
}

// FP8 code -> float, exact.
template <class F>
AMP_HOST_DEVICE inline float fp8_decode_bits(std::uint32_t code) {
  using Fmt = fp8_format<F>;
  const std::uint32_t sign = (code & 0x80u) << 24, mag = code & 0x7fu;
  const std::uint32_t exp = mag >> Fmt::mantissa, mant = mag & ((1u << Fmt::mantissa) - 1u);
  constexpr float min_subnormal = 1.0f / static_cast<float>(1u << (Fmt::bias - 1 + Fmt::mantissa));
  if (mag > Fmt::max_code) {
    if constexpr (std::is_same_v<F, fp8_e5m2>)
      if (mag == 0x7cu) return bits_float(sign | 0x7f800000u);  // E5M2 infinity
    return bits_float(0x7fffffffu);
  }
  if (exp == 0) return bits_float(sign | float_bits(static_cast<float>(mant) * min_subnormal));
  return bits_float(sign | (exp + 127u - static_cast<std::uint32_t>(Fmt::bias)) << 23 | mant << (23 - Fmt::mantissa));
}

}  // namespace detail

// x as an FP8 code (saturating, nearest even), the same bits on host and device.
template <class F>
AMP_HOST_DEVICE inline F fp8_from_float(float x) {
  static_assert(is_fp8_v<F>, "fp8_from_float: fp8_e4m3 or fp8_e5m2");
  F out;
#if AMP_DEVICE_CODE
  out.__x = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fp8_format<F>::cuda);
#else
  out.__x = detail::fp8_encode_host<F>(x);
#endif
  return out;
}

template <class F>
AMP_HOST_DEVICE inline float fp8_to_float(F x) {
  static_assert(is_fp8_v<F>, "fp8_to_float: fp8_e4m3 or fp8_e5m2");
  return detail::fp8_decode_bits<F>(x.__x);
}

// The scale that maps amax to a format's largest value fp8_max, lowered by
// 2^margin (Transformer Engine's fp8_max / amax / 2^margin). A zero or
// non-finite amax keeps the previous scale; a scale past fp32's range becomes fp32's largest.
AMP_HOST_DEVICE inline float fp8_scale_for(float fp8_max, float amax, float previous, int margin) {
  if (!(amax > 0.0f) || !is_finite(amax)) return previous;
  float s = fp8_max / amax;
  for (int i = 0; i < margin; ++i) s *= 0.5f;  // exact: a power of two
  return is_finite(s) ? s : limits<float>::max();
}

}  // namespace amp
