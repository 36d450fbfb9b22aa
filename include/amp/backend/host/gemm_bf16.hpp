#pragma once
// A native bf16 GEMM on Intel AMX (Sapphire Rapids and later; chosen at run
// time). Debian's OpenBLAS has no bf16 GEMM, and widening to fp32 for sgemm
// makes bf16 slower than fp32. TDPBF16PS multiplies bf16 pairs and accumulates
// in fp32: the numerical contract of cuBLAS's bf16 GEMM with CUBLAS_COMPUTE_32F.
//
// Layout: op(A) is packed row-major (M padded to 32, K to 32); op(B) into
// panels of 16 columns whose 64-byte rows hold (k, k+1) pairs (the VNNI form
// the B tile wants). One step of the kernel: a 32 x 32 block of C in four tiles.
#include <cstdint>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMP_HOST_AMX 1
#else
#define AMP_HOST_AMX 0
#endif

#include "amp/backend/gemm.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/core/numeric.hpp"

namespace amp::detail {

// AMX-BF16 present and the kernel lets this process use the tile registers.
inline bool host_has_amx_bf16() {
#if AMP_HOST_AMX
  static const bool ready = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx = (edx >> 22 & 1u) && (edx >> 24 & 1u);  // AMX-BF16, AMX-TILE
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return amx && syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return ready;
#else
  return false;
#endif
}

#if AMP_HOST_AMX
// The 64-byte LDTILECFG operand: palette 1; tiles 0-3 hold C (16 x 16 fp32),
// 4-5 A (16 x 32 bf16), 6-7 B (16 pairs x 16 columns); every tile 16 rows of 64 bytes.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette, start_row, reserved[14];
  std::uint16_t colsb[16];
  std::uint8_t rows[16];
};
inline constexpr AmxTileConfig amx_config = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile,amx-bf16"))) inline void amx_configure() { _tile_loadconfig(&amx_config); }

__attribute__((target("amx-tile,amx-bf16"))) inline void amx_release() { _tile_release(); }

// C[row0 .. +32, col0 .. +32] = packed A rows x packed B panels, over kp.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_block(const std::uint16_t* a, const std::uint16_t* b,
                                                                   float* c, std::int64_t kp, std::int64_t np,
                                                                   std::int64_t row0, std::int64_t col0) {
  const std::uint16_t* a0 = a + row0 * kp;
  const std::uint16_t* a1 = a0 + 16 * kp;
  const std::uint16_t* b0 = b + (col0 / 16) * kp * 16;
  const std::uint16_t* b1 = b0 + kp * 16;
  const auto a_stride = static_cast<long>(kp * 2), c_stride = static_cast<long>(np * 4);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t k = 0; k < kp; k += 32) {
    _tile_loadd(4, a0 + k, a_stride);
    _tile_loadd(5, a1 + k, a_stride);
    _tile_loadd(6, b0 + k * 16, 64);
    _tile_loadd(7, b1 + k * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float* c0 = c + row0 * np + col0;
  _tile_stored(0, c0, c_stride);
  _tile_stored(1, c0 + 16, c_stride);
  _tile_stored(2, c0 + 16 * np, c_stride);
  _tile_stored(3, c0 + 16 * np + 16, c_stride);
}
#endif

// C = alpha op(A) op(B) + beta C with bf16 A, B; false where AMX is unavailable.
template <class TC>
bool gemm_bf16_native(Context<host>& ctx, Matrix<const bfloat16> a, transpose ta, Matrix<const bfloat16> b,
                      transpose tb, Matrix<TC> c, const GemmDims& d, float alpha, float beta) {
#if AMP_HOST_AMX
  if (!ctx.native_bf16() || !host_has_amx_bf16()) return false;
  const std::int64_t mp = (d.m + 31) / 32 * 32, kp = (d.k + 31) / 32 * 32, np = (d.n + 31) / 32 * 32;
  auto* pa = ctx.scratch<std::uint16_t>(scratch_slot::gemm_a, static_cast<std::size_t>(mp * kp));
  auto* pb = ctx.scratch<std::uint16_t>(scratch_slot::gemm_b, static_cast<std::size_t>(np * kp));
  float* pc = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(mp * np));
  const auto* ra = reinterpret_cast<const std::uint16_t*>(a.data);
  const auto* rb = reinterpret_cast<const std::uint16_t*>(b.data);
  const int threads = d.m * d.n * d.k >= (1 << 18) ? ctx.threads() : 1;

#pragma omp parallel num_threads(threads)
  {
    // op(A), row-major with zero padding; each loop reads its source in order.
#pragma omp for schedule(static)
    for (std::int64_t m = 0; m < mp; ++m) {
      std::uint16_t* dst = pa + m * kp;
      std::int64_t k = 0;
      if (m < d.m && ta == transpose::no)
        for (const std::uint16_t* src = ra + m * a.ld; k < d.k; ++k) dst[k] = src[k];
      else if (m < d.m)
        for (; k < d.k; ++k) dst[k] = ra[k * a.ld + m];
      for (; k < kp; ++k) dst[k] = 0;
    }
    // op(B) element (k, n) goes to panel n/16, pair k/2, column n%16, slot k%2.
    auto b_slot = [=](std::int64_t k, std::int64_t n) { return pb + (n / 16) * kp * 16 + (k / 2) * 32 + (n % 16) * 2 + k % 2; };
    if (tb == transpose::yes) {  // B is N x K: walk each row of B along k
#pragma omp for schedule(static)
      for (std::int64_t n = 0; n < np; ++n)
        for (std::int64_t k = 0; k < kp; ++k) *b_slot(k, n) = n < d.n && k < d.k ? rb[n * b.ld + k] : 0;
    } else {  // B is K x N: walk each row of B along n
#pragma omp for schedule(static)
      for (std::int64_t k = 0; k < kp; ++k) {
        std::int64_t n = 0;
        if (k < d.k)
          for (const std::uint16_t* src = rb + k * b.ld; n < d.n; ++n) *b_slot(k, n) = src[n];
        for (; n < np; ++n) *b_slot(k, n) = 0;
      }
    }
    amx_configure();  // tile state is per thread
    const std::int64_t row_blocks = mp / 32, col_blocks = np / 32;
#pragma omp for schedule(static)
    for (std::int64_t blk = 0; blk < row_blocks * col_blocks; ++blk)
      amx_block(pa, pb, pc, kp, np, (blk / col_blocks) * 32, (blk % col_blocks) * 32);
    amx_release();
    // C = alpha * acc + beta * C, one rounding into C's type.
#pragma omp for schedule(static)
    for (std::int64_t m = 0; m < d.m; ++m) {
      TC* out = c.data + m * c.ld;
      const float* in = pc + m * np;
      for (std::int64_t n = 0; n < d.n; ++n)
        out[n] = cast<TC>(beta == 0.0f ? alpha * in[n] : alpha * in[n] + beta * cast<float>(out[n]));
    }
  }
  return true;
#else
  (void)ctx, (void)a, (void)ta, (void)b, (void)tb, (void)c, (void)d, (void)alpha, (void)beta;
  return false;
#endif
}

}  // namespace amp::detail
