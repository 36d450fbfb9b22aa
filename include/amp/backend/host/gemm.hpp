#pragma once
// Host GEMM on oneDNN: fp32 through dnnl_sgemm, bf16 through its bf16 GEMM with
// fp32 accumulation (AVX512-BF16 / AMX kernels where the CPU has them), fp16
// widened to fp32 by the conversion instructions and multiplied by sgemm
// (oneDNN 2.x has no fp16 GEMM for CPUs without AVX512-FP16). On a CPU without
// AVX-512 (an AMD EPYC before Zen 4) oneDNN 2.x has no bf16 GEMM either: bf16
// is widened as fp16 is, with the same result up to the order of the fp32 sums
// (the widening is exact and the sums are fp32 either way). The epilogue adds
// the bias and applies the activation in fp32, then rounds into C once. FP8
// operands are decoded to bf16 and take the bf16 GEMM: an exact emulation.
// Scratch is taken when a GEMM is issued and the work runs as one launch
// (Context<host>::issue), so a recorded step keeps its pointers as a CUDA graph does.
#include <algorithm>
#include <array>
#include <type_traits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "amp/backend/gemm.hpp"
#include "amp/backend/host/algorithm.hpp"
#include "amp/backend/host/onednn.hpp"
#include "amp/core/fp8.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
// Where the fp32 work of one GEMM goes (nullptr: not needed).
struct GemmScratch {
  float* a = nullptr;  // 16-bit A widened
  float* b = nullptr;  // 16-bit B widened
  float* z = nullptr;  // the fp32 product, when C is not fp32
  float* bias = nullptr;  // column sums for a transposed A's bias gradient
};

// Whether oneDNN multiplies bf16 matrices on this CPU (2.x needs AVX-512): asked once.
inline bool onednn_bf16_gemm() {
  static const bool runs = [] {
    const std::uint16_t one = 0x3f80;  // 1.0 in bf16
    float c = 0.0f;
    return onednn::gemm_bf16bf16f32('N', 'N', 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1) == 0 && c == 1.0f;
  }();
  return runs;
}
// 16-bit operands of type T that gemm widens to fp32 before multiplying.
template <class T>
bool widened() {
  if constexpr (std::is_same_v<T, half>) return true;
  else if constexpr (std::is_same_v<T, bfloat16>) return !onednn_bf16_gemm();
  else return false;
}

// n 16-bit values to fp32 in parallel chunks.
template <class T>
void widen_n(int threads, const T* in, float* out, std::size_t n) {
  constexpr std::size_t chunk = 1 << 14;
  const auto chunks = static_cast<std::int64_t>((n + chunk - 1) / chunk);
#pragma omp parallel for num_threads(threads) schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * chunk;
    convert_n(in + begin, out + begin, std::min(chunk, n - begin));
  }
}

// A contiguous fp32 copy of a (possibly strided) 16-bit matrix.
template <class T>
Matrix<const float> widen(int threads, Matrix<const T> x, float* out) {
  if (x.contiguous()) widen_n(threads, x.data, out, static_cast<std::size_t>(x.size()));
  else
    for (std::int64_t r = 0; r < x.rows; ++r) convert_n(x.data + r * x.ld, out + r * x.cols, static_cast<std::size_t>(x.cols));
  return {out, x.rows, x.cols, x.cols};
}

inline void check_onednn(onednn::status status, const char* what, const GemmDims& d) {
  AMP_REQUIRE(status == 0, "oneDNN ", what, " failed (status ", status, ") on a ", d.m, "x", d.n, "x", d.k,
              " product");
}

// c = alpha op(A) op(B) + beta c in fp32, on oneDNN.
template <class T>
void multiply_fp32(int threads, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, float* c,
                   std::int64_t ldc, const GemmDims& d, float alpha, float beta, const GemmScratch& s) {
  use_threads(threads);
  const char opa = ta == transpose::yes ? 'T' : 'N', opb = tb == transpose::yes ? 'T' : 'N';
  if constexpr (std::is_same_v<T, float>) {
    check_onednn(onednn::sgemm(opa, opb, d.m, d.n, d.k, alpha, a.data, a.ld, b.data, b.ld, beta, c, ldc), "sgemm", d);
  } else {
    static_assert(std::is_same_v<T, bfloat16>, "host gemm: fp32 or bf16 products (fp16 is widened first)");
    (void)s;
    check_onednn(onednn::gemm_bf16bf16f32(opa, opb, d.m, d.n, d.k, alpha, reinterpret_cast<const std::uint16_t*>(a.data),
                                          a.ld, reinterpret_cast<const std::uint16_t*>(b.data), b.ld, beta, c, ldc),
                 "bf16 gemm", d);
  }
}

// Z += beta C + bias; pre = Z (if asked); C = act(Z), rounded once, a row at a time.
template <class TC>
AMP_HOST_CLONES void gemm_epilogue(int threads, float* z, std::int64_t ldz, Matrix<TC> c, float beta,
                                   const GemmEpilogue<TC>& ep) {
  const std::int64_t rows = c.rows, n = c.cols;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * n >= host_parallel_threshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* zr = z + r * ldz;
    TC* cr = c.data + r * c.ld;
    if (beta != 0.0f)
      for (std::int64_t j = 0; j < n; ++j) zr[j] += beta * cast<float>(cr[j]);
    if (ep.bias)
      for (std::int64_t j = 0; j < n; ++j) zr[j] += cast<float>(ep.bias[j]);
    if (ep.pre_activation) convert_n(zr, ep.pre_activation + r * c.ld, static_cast<std::size_t>(n));
    if (ep.act == activation::relu)
      for (std::int64_t j = 0; j < n; ++j) zr[j] = ReluFn::forward(zr[j]);
    else if (ep.act == activation::gelu)
      for (std::int64_t j = 0; j < n; ++j) zr[j] = GeluFn::forward(zr[j]);
    if constexpr (!std::is_same_v<TC, float>) convert_n(zr, cr, static_cast<std::size_t>(n));
  }
}

// grad_bias[i] += sum_k op(A)[i][k], summed in fp32 and rounded once.
template <class T, class Out>
AMP_HOST_CLONES void add_row_sums(Matrix<const T> a, transpose ta, const GemmDims& d, Out* grad_bias, float* sums) {
  if (ta == transpose::no) {  // rows of A
    for (std::int64_t i = 0; i < d.m; ++i) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < d.k; ++k) acc += cast<float>(a(i, k));
      grad_bias[i] = cast<Out>(cast<float>(grad_bias[i]) + acc);
    }
    return;
  }
  // columns of A (A is K x M): walk its rows in order, one fp32 sum per column.
  std::fill(sums, sums + d.m, 0.0f);
  for (std::int64_t k = 0; k < d.k; ++k)
    for (std::int64_t i = 0; i < d.m; ++i) sums[i] += cast<float>(a(k, i));
  for (std::int64_t i = 0; i < d.m; ++i) grad_bias[i] = cast<Out>(cast<float>(grad_bias[i]) + sums[i]);
}
// The batched products with fp32 or bf16 operands: into C when C is fp32,
// else into fp32 scratch and then rounded into C (adding beta C) once.
template <class T, class TC>
void gemm_batched_fp32(int threads, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, Matrix<TC> c,
                       const GemmDims& d, const GemmBatch& batch, float alpha, float beta, float* z) {
  constexpr bool direct = std::is_same_v<TC, float>;
  const char opa = ta == transpose::yes ? 'T' : 'N', opb = tb == transpose::yes ? 'T' : 'N';
  int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : failed)
  for (std::int64_t i = 0; i < batch.count; ++i) {
    const T* ai = a.data + i * batch.stride_a;
    const T* bi = b.data + i * batch.stride_b;
    float* zi = z + i * d.m * d.n;
    std::int64_t ldz = d.n;
    float beta_z = 0.0f;
    if constexpr (direct) zi = c.data + i * batch.stride_c, ldz = c.ld, beta_z = beta;
    onednn::status status;
    if constexpr (std::is_same_v<T, float>) {
      status = onednn::sgemm(opa, opb, d.m, d.n, d.k, alpha, ai, a.ld, bi, b.ld, beta_z, zi, ldz);
    } else {
      static_assert(std::is_same_v<T, bfloat16>, "host gemm_batched: fp32, fp16 or bf16 inputs");
      status = onednn::gemm_bf16bf16f32(opa, opb, d.m, d.n, d.k, alpha, reinterpret_cast<const std::uint16_t*>(ai), a.ld,
                                        reinterpret_cast<const std::uint16_t*>(bi), b.ld, beta_z, zi, ldz);
    }
    failed |= status != 0;
  }
  AMP_REQUIRE(!failed, "oneDNN batched gemm failed on ", batch.count, " products of ", d.m, "x", d.n, "x", d.k);
  if constexpr (!direct) {
    const std::int64_t rows = batch.count * d.m;
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * d.n >= host_parallel_threshold)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r / d.m, row = r % d.m;
      float* zr = z + r * d.n;
      TC* cr = c.data + i * batch.stride_c + row * c.ld;
      if (beta != 0.0f)
        for (std::int64_t j = 0; j < d.n; ++j) zr[j] += beta * cast<float>(cr[j]);
      convert_n(zr, cr, static_cast<std::size_t>(d.n));
    }
  }
}
}  // namespace detail

namespace detail {
// A 16-bit C's fp32 product goes through scratch in blocks of rows of at most
// this many values (16 MiB), not m x n: a [tokens x 50257] logits GEMM would
// otherwise hold a second, fp32 copy of its logits. Smaller products are one block.
inline constexpr std::int64_t gemm_z_block = std::int64_t{1} << 22;

// Rows [r0, r0 + rows) of op(A).
template <class T>
Matrix<const T> op_rows(Matrix<const T> a, transpose ta, std::int64_t r0, std::int64_t rows) {
  if (ta == transpose::no) return {a.data + r0 * a.ld, rows, a.cols, a.ld};
  return {a.data + r0, a.rows, rows, a.ld};
}

// Every FP8 code as bf16: exactly, as FP8 has at most 3 mantissa bits and
// bf16 fp32's exponent range.
template <class F>
const bfloat16* fp8_bf16_table() {
  static const std::array<bfloat16, 256> table = [] {
    std::array<bfloat16, 256> t{};
    for (std::uint32_t c = 0; c < 256; ++c) t[c] = cast<bfloat16>(fp8_decode_bits<F>(c));
    return t;
  }();
  return table.data();
}

// FP8 codes as a contiguous bf16 matrix, exactly.
template <class F>
AMP_HOST_CLONES Matrix<const bfloat16> decode(int threads, Matrix<const F> x, bfloat16* out) {
  const bfloat16* table = fp8_bf16_table<F>();
#pragma omp parallel for num_threads(threads) schedule(static) if (x.size() >= host_parallel_threshold)
  for (std::int64_t r = 0; r < x.rows; ++r)
    for (std::int64_t c = 0; c < x.cols; ++c) out[r * x.cols + c] = table[x.data[r * x.ld + c].__x];
  return {out, x.rows, x.cols, x.cols};
}

// op(A) op(B) through Z block by block, each block's epilogue rounding into C once.
template <class T, class TC>
void gemm_through_z(int threads, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, Matrix<TC> c,
                    const GemmDims& d, std::int64_t block, GemmEpilogue<TC> ep, const GemmScratch& s) {
  for (std::int64_t r0 = 0; r0 < d.m; r0 += block) {
    const std::int64_t rows = std::min(block, d.m - r0);
    multiply_fp32(threads, op_rows(a, ta, r0, rows), ta, b, tb, s.z, d.n, GemmDims{rows, d.n, d.k}, ep.alpha, 0.0f, s);
    GemmEpilogue<TC> at = ep;
    if (ep.pre_activation) at.pre_activation = ep.pre_activation + r0 * c.ld;
    // Z += beta C + bias; keep Z if asked; C = act(Z), rounded once.
    gemm_epilogue(threads, s.z, d.n, Matrix<TC>{c.data + r0 * c.ld, rows, c.cols, c.ld}, ep.beta, at);
  }
}

// The product and its epilogue: straight into C when C is fp32, else through Z.
template <class T, class TC>
void gemm_now(int threads, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, Matrix<TC> c,
              const GemmDims& d, std::int64_t block, const GemmEpilogue<TC>& ep, const GemmScratch& s) {
  if constexpr (std::is_same_v<TC, float>) {
    multiply_fp32(threads, a, ta, b, tb, c.data, c.ld, d, ep.alpha, ep.beta, s);
    if (ep.bias || ep.act != activation::none || ep.pre_activation) gemm_epilogue(threads, c.data, c.ld, c, 0.0f, ep);
  } else {
    gemm_through_z(threads, a, ta, b, tb, c, d, block, ep, s);
  }
}
}  // namespace detail

template <class TA, class TB, class TC>
void gemm(Context<host>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          const GemmEpilogue<TC>& ep = {}) {
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  check_epilogue(ep);
  ctx.count_launch();
  detail::GemmScratch s;
  const bool widen = detail::widened<TA>();
  if (widen) {
    s.a = ctx.scratch<float>(scratch_slot::gemm_a, static_cast<std::size_t>(a.size()));
    s.b = ctx.scratch<float>(scratch_slot::gemm_b, static_cast<std::size_t>(b.size()));
  }
  const std::int64_t block = std::clamp<std::int64_t>(detail::gemm_z_block / d.n, 1, d.m);
  if constexpr (!std::is_same_v<TC, float>) s.z = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(block * d.n));
  if (ep.grad_bias && ta == transpose::yes) s.bias = ctx.scratch<float>(scratch_slot::bias_grad, static_cast<std::size_t>(d.m));
  ctx.issue([threads = ctx.threads(), a, ta, b, tb, c, d, ep, s, block, widen] {
    if (ep.grad_bias) detail::add_row_sums(a, ta, d, ep.grad_bias, s.bias);
    if constexpr (std::is_same_v<TA, float>) {
      detail::gemm_now(threads, a, ta, b, tb, c, d, block, ep, s);
    } else {
      if (widen)  // once, not once per block
        detail::gemm_now(threads, detail::widen(threads, a, s.a), ta, detail::widen(threads, b, s.b), tb, c, d, block, ep, s);
      else if constexpr (std::is_same_v<TA, bfloat16>)
        detail::gemm_now(threads, a, ta, b, tb, c, d, block, ep, s);
    }
  });
}

// The FP8 GEMM (backend/gemm.hpp's contract), emulated exactly: the codes
// decoded to bf16 (every FP8 value is a bf16 value), multiplied by oneDNN's
// bf16 GEMM (each product exact in fp32, summed in fp32), times alpha * a_inv
// * b_inv, the epilogue as above. What a GPU computes, up to the order of the sums.
template <class FA, class FB, class TC>
void gemm_fp8(Context<host>& ctx, const Fp8Matrix<FA>& a, const Fp8Matrix<FB>& b, Matrix<TC> c,
              const GemmEpilogue<TC>& ep = {}) {
  const GemmDims d = gemm_fp8_dims(a, b, c, ep);
  if (d.m == 0 || d.n == 0) return;
  ctx.count_launch();
  bfloat16* wa = ctx.scratch<bfloat16>(scratch_slot::gemm_a, static_cast<std::size_t>(d.m * d.k));
  bfloat16* wb = ctx.scratch<bfloat16>(scratch_slot::gemm_b, static_cast<std::size_t>(d.n * d.k));
  detail::GemmScratch s;
  const std::int64_t block = std::clamp<std::int64_t>(detail::gemm_z_block / d.n, 1, d.m);
  if constexpr (!std::is_same_v<TC, float>) s.z = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(block * d.n));
  const bool widen = detail::widened<bfloat16>();
  if (widen) {
    s.a = ctx.scratch<float>(scratch_slot::gemm_a_wide, static_cast<std::size_t>(d.m * d.k));
    s.b = ctx.scratch<float>(scratch_slot::gemm_b_wide, static_cast<std::size_t>(d.n * d.k));
  }
  ctx.issue([threads = ctx.threads(), a, b, c, d, ep, s, block, wa, wb, widen] {
    GemmEpilogue<TC> e = ep;
    e.alpha = ep.alpha * *a.scale_inv * *b.scale_inv;  // the scales as they are when the GEMM runs
    const Matrix<const bfloat16> da = detail::decode(threads, a.codes, wa), db = detail::decode(threads, b.codes, wb);
    if (widen)
      detail::gemm_now(threads, detail::widen(threads, da, s.a), transpose::no, detail::widen(threads, db, s.b),
                       transpose::yes, c, d, block, e, s);
    else
      detail::gemm_now(threads, da, transpose::no, db, transpose::yes, c, d, block, e, s);
  });
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for each product of the batch, the
// products spread over the threads (each one single-threaded inside oneDNN);
// 16-bit operands oneDNN cannot multiply widened once for the whole batch, one rounding into C.
template <class T, class TC>
void gemm_batched(Context<host>& ctx, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, Matrix<TC> c,
                  const GemmBatch& batch, float alpha = 1.0f, float beta = 0.0f) {
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0 || batch.count == 0) return;
  ctx.count_launch();
  const auto extent = [&](const auto& x, std::int64_t stride) {  // elements the batch spans
    return static_cast<std::size_t>((batch.count - 1) * stride + (x.rows - 1) * x.ld + x.cols);
  };
  float* z = std::is_same_v<TC, float> ? nullptr
                                       : ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(batch.count * d.m * d.n));
  if constexpr (!std::is_same_v<T, float>) {
    if (detail::widened<T>()) {
      const std::size_t na = extent(a, batch.stride_a), nb = extent(b, batch.stride_b);
      float* wa = ctx.scratch<float>(scratch_slot::gemm_a, na);
      float* wb = ctx.scratch<float>(scratch_slot::gemm_b, nb);
      ctx.issue([threads = ctx.threads(), a, ta, b, tb, c, d, batch, alpha, beta, z, wa, wb, na, nb] {
        detail::widen_n(threads, a.data, wa, na);
        detail::widen_n(threads, b.data, wb, nb);
        detail::gemm_batched_fp32(threads, Matrix<const float>(wa, a.rows, a.cols, a.ld), ta,
                                  Matrix<const float>(wb, b.rows, b.cols, b.ld), tb, c, d, batch, alpha, beta, z);
      });
      return;
    }
  }
  if constexpr (!std::is_same_v<T, half>)
    ctx.issue([threads = ctx.threads(), a, ta, b, tb, c, d, batch, alpha, beta, z] {
      detail::gemm_batched_fp32(threads, a, ta, b, tb, c, d, batch, alpha, beta, z);
    });
}

// The older call form: C = alpha op(A) op(B) + beta C.
template <class TA, class TB, class TC>
void gemm(Context<host>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          float alpha, float beta = 0.0f) {
  gemm(ctx, a, ta, b, tb, c, GemmEpilogue<TC>{.alpha = alpha, .beta = beta});
}

}  // namespace amp
