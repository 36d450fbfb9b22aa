#pragma once
// Bulk conversions on the host. fp16 <-> fp32 use the CPU's conversion
// instructions (AVX-512 or F16C, chosen at run time), which round to nearest
// even exactly as amp::cast does; bf16 needs only integer arithmetic, which
// the compiler vectorises. Per-element casts inside fused functors keep the
// software twin of amp/core/numeric.hpp.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "amp/backend/host/cpu.hpp"
#include "amp/core/numeric.hpp"

namespace amp::detail {

#if defined(__x86_64__)
// The masked (maskz) forms: GCC 12's unmasked intrinsics trip -Wmaybe-uninitialized.
__attribute__((target("avx512f,f16c"))) inline void half_to_float_avx512(const std::uint16_t* in, float* out,
                                                                         std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx,f16c"))) inline void half_to_float_f16c(const std::uint16_t* in, float* out,
                                                                   std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}

__attribute__((target("avx512f,f16c"))) inline void float_to_half_avx512(const float* in, std::uint16_t* out,
                                                                         std::size_t n) {
  constexpr int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(in + i), rne));
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], rne);
}

__attribute__((target("avx,f16c"))) inline void float_to_half_f16c(const float* in, std::uint16_t* out,
                                                                   std::size_t n) {
  constexpr int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), rne));
  for (; i < n; ++i) out[i] = _cvtss_sh(in[i], rne);
}
#endif

// out[i] = cast<To>(in[i]) for i < n, on the calling thread.
template <class From, class To>
void convert_n(const From* in, To* out, std::size_t n) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<From, half> && std::is_same_v<To, float>) {
    const auto* raw = reinterpret_cast<const std::uint16_t*>(in);
    if (host_cpu().avx512f) return half_to_float_avx512(raw, out, n);
    if (host_cpu().f16c) return half_to_float_f16c(raw, out, n);
  } else if constexpr (std::is_same_v<From, float> && std::is_same_v<To, half>) {
    auto* raw = reinterpret_cast<std::uint16_t*>(out);
    if (host_cpu().avx512f) return float_to_half_avx512(in, raw, n);
    if (host_cpu().f16c) return float_to_half_f16c(in, raw, n);
  }
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = cast<To>(in[i]);
}

}  // namespace amp::detail
