#pragma once
// Numeric types and casts. amp::half and amp::bfloat16 are CUDA's own types, so
// buffers pass to cuBLAS unchanged. Casts round to nearest even and give the same
// bits on host and device: the device uses the intrinsics; the host converts
// fp16 through the compiler's _Float16 (GCC 12+, Clang), which inside amp's
// host loops (AMP_HOST_CLONES) is one F16C instruction and elsewhere a call
// into the compiler's runtime, and bf16 with integer arithmetic. A bit-exact
// software twin covers compilers without _Float16.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "amp/core/macros.hpp"

namespace amp {

using half = __half;
using bfloat16 = __nv_bfloat16;

template <class T>
inline constexpr bool is_reduced_precision_v =
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
inline constexpr bool is_scalar_v = std::is_same_v<T, float> || is_reduced_precision_v<T>;

template <class T>
concept Scalar = is_scalar_v<T>;

namespace detail {

AMP_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if AMP_DEVICE_CODE
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

AMP_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if AMP_DEVICE_CODE
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The 16 bits read as an integer through a reference: a copy of CUDA's class
// types is an aggregate load, which GCC does not vectorise.
template <class T>
  requires(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
AMP_HOST_DEVICE inline std::uint16_t bits(const T& x) {
  static_assert(sizeof(T) == sizeof(std::uint16_t) && std::is_standard_layout_v<T>);
  return *reinterpret_cast<const std::uint16_t*>(&x);  // the first (only) member
}

AMP_HOST_DEVICE inline half half_from_bits(std::uint16_t x) {
  __half_raw raw;
  raw.x = x;
  return half(raw);
}

AMP_HOST_DEVICE inline bfloat16 bfloat16_from_bits(std::uint16_t x) {
  __nv_bfloat16_raw raw;
  raw.x = x;
  return bfloat16(raw);
}

#if defined(__FLT16_MANT_DIG__) && !defined(AMP_NO_FLOAT16)
#define AMP_HOST_FLOAT16 1
#else
#define AMP_HOST_FLOAT16 0
#endif

// float -> binary16 in software: round to nearest even, overflow to inf, NaN stays NaN.
inline std::uint16_t float_to_half_bits_soft(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t out;
  if (a >= 0x47800000u) {                  // |f| >= 65536, inf or NaN
    out = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (a < 0x38800000u) {            // below the smallest normal half
    // Adding 0.5 aligns the mantissa so that the FPU's own round-to-even
    // produces the subnormal half in the low bits.
    const float aligned = bits_float(a) + 0.5f;
    out = float_bits(aligned) - 0x3f000000u;
  } else {
    const std::uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd;                // rebias exponent (-112 << 23), round
    out = a >> 13;
  }
  return static_cast<std::uint16_t>(out | sign);
}

inline float half_bits_to_float_soft(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = h & 0x7c00u;
  const std::uint32_t mant = h & 0x03ffu;
  std::uint32_t out;
  if (exp == 0x7c00u) {
    out = 0x7f800000u | (mant << 13);      // inf / NaN
  } else if (exp == 0) {
    // subnormal: mant * 2^-24, exact in float
    return bits_float(sign) + (sign ? -1.0f : 1.0f) * static_cast<float>(mant) * 5.9604644775390625e-8f;
  } else {
    out = ((exp >> 10) + 112u) << 23 | (mant << 13);
  }
  return bits_float(out | sign);
}

inline std::uint16_t float_to_half_bits(float f) {
#if AMP_HOST_FLOAT16
  const _Float16 h = static_cast<_Float16>(f);
  std::uint16_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
#else
  return float_to_half_bits_soft(f);
#endif
}

inline float half_bits_to_float(std::uint16_t bits) {
#if AMP_HOST_FLOAT16
  _Float16 h;
  std::memcpy(&h, &bits, sizeof h);
  return static_cast<float>(h);
#else
  return half_bits_to_float_soft(bits);
#endif
}

// Round to nearest even; NaN stays a quiet NaN. A select, not a branch, so loops over it vectorise.
inline std::uint16_t float_to_bfloat16_bits(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

template <class T>
AMP_HOST_DEVICE inline float to_float(const T& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, half>) {
#if AMP_DEVICE_CODE
    return __half2float(x);
#else
    return half_bits_to_float(bits(x));
#endif
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bits_float(static_cast<std::uint32_t>(bits(x)) << 16);
  } else {
    return static_cast<float>(x);
  }
}

template <class T>
AMP_HOST_DEVICE inline T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, half>) {
#if AMP_DEVICE_CODE
    return __float2half_rn(x);
#else
    return half_from_bits(float_to_half_bits(x));
#endif
  } else if constexpr (std::is_same_v<T, bfloat16>) {
#if AMP_DEVICE_CODE
    return __float2bfloat16_rn(x);
#else
    return bfloat16_from_bits(float_to_bfloat16_bits(x));
#endif
  } else {
    return static_cast<T>(x);
  }
}

}  // namespace detail

// cast<To>(x): every conversion between amp scalars goes through float, which
// holds half and bfloat16 exactly, so there is a single rounding step.
template <class To, class From>
AMP_HOST_DEVICE inline To cast(const From& x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else {
    return detail::from_float<To>(detail::to_float(x));
  }
}

// round_to<T>(x): x as it would be after storing it as T, back in float.
template <class T>
AMP_HOST_DEVICE inline float round_to(float x) {
  return cast<float>(cast<T>(x));
}

// Limits usable in host and device code alike.
template <class T>
struct limits;

template <>
struct limits<float> {
  AMP_HOST_DEVICE static float max() { return 3.40282347e+38f; }
  AMP_HOST_DEVICE static float epsilon() { return 1.19209290e-07f; }
  AMP_HOST_DEVICE static float min_normal() { return 1.17549435e-38f; }
  static constexpr int digits = 24;
};

template <>
struct limits<half> {
  AMP_HOST_DEVICE static half max() { return detail::half_from_bits(0x7bffu); }         // 65504
  AMP_HOST_DEVICE static half epsilon() { return detail::half_from_bits(0x1400u); }     // 2^-10
  AMP_HOST_DEVICE static half min_normal() { return detail::half_from_bits(0x0400u); }  // 2^-14
  static constexpr int digits = 11;
};

template <>
struct limits<bfloat16> {
  AMP_HOST_DEVICE static bfloat16 max() { return detail::bfloat16_from_bits(0x7f7fu); }
  AMP_HOST_DEVICE static bfloat16 epsilon() { return detail::bfloat16_from_bits(0x3c00u); }  // 2^-7
  AMP_HOST_DEVICE static bfloat16 min_normal() { return detail::bfloat16_from_bits(0x0080u); }
  static constexpr int digits = 8;
};

// Unit roundoff of T (half an ulp at 1): the yardstick tests use for tolerances.
template <class T>
inline constexpr double unit_roundoff = 1.0 / static_cast<double>(1ull << limits<T>::digits);

AMP_HOST_DEVICE inline bool is_finite(float x) {
  return (detail::float_bits(x) & 0x7f800000u) != 0x7f800000u;
}

}  // namespace amp
