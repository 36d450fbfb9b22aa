#pragma once
// GPU GEMM. A plain product goes to cublasGemmEx; one with an epilogue (bias,
// relu/gelu, the bias gradient) to cuBLASLt, which fuses it into the GEMM's
// pass with one rounding (BIAS, RELU_BIAS, GELU_AUX_BIAS, BGRADB). fp32
// accumulation (CUBLAS_COMPUTE_32F) everywhere, which for fp32 operands means
// strict fp32 with no TF32 (the O0 contract). Where cuBLASLt offers no
// algorithm for a shape, the product goes to fp32 scratch and the same
// epilogue runs as a kernel: still one rounding. cuBLASLt plans are cached per
// case by the context (lt_plans.cuh). FP8 products are cuBLASLt's too, with
// the operands' 1/scale as its A/B scale pointers (read on the device).
#include <type_traits>

#include "amp/backend/column_sums.hpp"
#include "amp/backend/cuda/algorithm.cuh"
#include "amp/backend/cuda/context.cuh"
#include "amp/backend/gemm.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

namespace detail {
template <class T>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, fp8_e4m3>) return CUDA_R_8F_E4M3;
  else if constexpr (std::is_same_v<T, fp8_e5m2>) return CUDA_R_8F_E5M2;
  else {
    static_assert(std::is_same_v<T, bfloat16>, "no cuBLAS type for this element");
    return CUDA_R_16BF;
  }
}

inline cublasOperation_t cublas_op(transpose t) { return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

// The epilogue as a kernel over an fp32 product (the fallback path), one cell
// (row r, column j) a thread: for_each_cell, no index division.
template <class TC>
struct EpilogueOp {
  const float* z;
  TC* c;
  std::int64_t n, ldc;
  GemmEpilogue<TC> ep;
  AMP_HOST_DEVICE void operator()(std::int64_t r, std::int64_t j) const {
    float v = z[r * n + j];
    if (ep.beta != 0.0f) v += ep.beta * cast<float>(c[r * ldc + j]);
    if (ep.bias) v += cast<float>(ep.bias[j]);
    if (ep.pre_activation) ep.pre_activation[r * ldc + j] = cast<TC>(v);
    c[r * ldc + j] = cast<TC>(apply(ep.act, v));
  }
};

template <class T>
struct AddIntoOp {
  T* dst;
  const T* src;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = cast<T>(cast<float>(dst[i]) + cast<float>(src[i])); }
};

// The fallback's bias gradient, grad_bias[i] += sum_k op(A)[i][k], added in
// fp32 and rounded once. op(A) = A: a row op per row of A (a warp or block,
// read in runs: 16-byte loads where aligned). op(A) = A^T (the weight
// gradient's dY^T): A's column sums, neighbouring threads on neighbouring columns.
template <class T, class Out>
struct RowSumOp {
  Matrix<const T> a;
  Out* out;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t i) const {
    const T* row = a.data + static_cast<std::int64_t>(i) * a.ld;
    const float acc = sum_runs(lanes, a.cols, [&](std::int64_t c, std::int64_t len) {
      float v[run_length];
      load_run(row + c, len, v);
      float s = 0.0f;
      for (const float x : v) s += x;
      return s;
    });
    lanes.each(1, [&](std::int64_t) { out[i] = cast<Out>(cast<float>(out[i]) + acc); });
  }
};
template <class T>
struct MatrixAt {
  Matrix<const T> a;
  AMP_HOST_DEVICE float operator()(std::int64_t r, std::int64_t c) const { return cast<float>(a(r, c)); }
};
template <class T, class Out>
void add_bias_grad(Context<cuda>& ctx, Matrix<const T> a, transpose ta, Out* grad_bias) {
  if (ta == transpose::yes) {
    float* partial = ctx.scratch<float>(scratch_slot::bias_grad, column_sum_partials(a.rows, a.cols));
    add_column_sums(ctx, a.rows, a.cols, MatrixAt<T>{a}, partial, grad_bias);
  } else {
    for_each_row(ctx, static_cast<std::size_t>(a.rows), a.cols, RowSumOp<T, Out>{a, grad_bias});
  }
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  AMP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof value));
}

inline cublasLtEpilogue_t lt_epilogue(bool bias, activation act, bool aux, bool grad_bias) {
  if (grad_bias) return CUBLASLT_EPILOGUE_BGRADB;
  if (act == activation::relu) return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (act == activation::gelu) {
    if (aux) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// cuBLAS takes int sizes; a larger one is an error, never a silent wrap.
inline int cublas_int(std::int64_t v, const char* what) {
  AMP_REQUIRE(v >= 0 && v <= 2147483647, "gemm: ", what, " = ", v, " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

// cuBLASLt with a fused epilogue, from the context's cached plan for this
// case; false when it has no algorithm for it. Row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T: operands swap, so C's columns (our bias)
// are D's rows, and our A's k-sums are BGRADB's. FP8 operands come with their
// 1/scale (a_scale, b_scale), which cuBLASLt multiplies into the product.
template <class TA, class TB, class TC>
bool gemm_lt(Context<cuda>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
             const GemmDims& d, const GemmEpilogue<TC>& ep, TC* grad_bias_out, const float* a_scale = nullptr,
             const float* b_scale = nullptr) {
  const cublasLtEpilogue_t epilogue = lt_epilogue(ep.bias, ep.act, ep.pre_activation, grad_bias_out);
  const void* bias = grad_bias_out ? static_cast<const void*>(grad_bias_out) : ep.bias;
  const LtPlanKey key{d.m, d.n, d.k, a.ld, b.ld, c.ld, ep.pre_activation ? c.ld : 0,
                      static_cast<int>(ta), static_cast<int>(tb), static_cast<int>(cuda_data_type<TA>()),
                      static_cast<int>(cuda_data_type<TB>()), static_cast<int>(cuda_data_type<TC>()),
                      static_cast<int>(epilogue), pointer_alignment(a.data), pointer_alignment(b.data),
                      pointer_alignment(c.data), bias ? pointer_alignment(bias) : 16u};
  const std::uint64_t workspace = Context<cuda>::cublas_workspace_bytes;
  LtPlan& plan = ctx.lt_plans().get(key, [&](LtPlan& p) {
    AMP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, cublas_op(tb));
    set_attribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublas_op(ta));
    set_attribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
    if (bias) set_attribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(cuda_data_type<TC>()));
    if (ep.pre_activation) set_attribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.ld);
    // Layouts of the column-major views: cuBLAS's A is our B, its B our A.
    AMP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.la, cuda_data_type<TB>(), static_cast<std::uint64_t>(b.cols),
                                                static_cast<std::uint64_t>(b.rows), b.ld));
    AMP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lb, cuda_data_type<TA>(), static_cast<std::uint64_t>(a.cols),
                                                static_cast<std::uint64_t>(a.rows), a.ld));
    AMP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.lc, cuda_data_type<TC>(), static_cast<std::uint64_t>(d.n),
                                                static_cast<std::uint64_t>(d.m), c.ld));
    cublasLtMatmulPreference_t pref = nullptr;
    AMP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
      AMP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
    // cuBLAS's A is our B (see above); what the chosen kernel may assume of each pointer.
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    p.status =
        cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &heuristic, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.found = p.status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.found) p.algo = heuristic.algo;
  });
  if (!plan.found) return false;
  // The pointers are this call's (the descriptor is shared by every call of the case).
  if (bias) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (a_scale) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale);  // cuBLAS's B is our A
  if (b_scale) set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale);
  if (ep.pre_activation)
    set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(ep.pre_activation));
  AMP_CUBLAS_CHECK(cublasLtMatmul(ctx.cublaslt(), plan.desc, &ep.alpha, b.data, plan.la, a.data, plan.lb, &ep.beta,
                                  c.data, plan.lc, c.data, plan.lc, &plan.algo, ctx.cublas_workspace(), workspace,
                                  ctx.stream()));
  return true;
}
}  // namespace detail

template <class TA, class TB, class TC>
void gemm(Context<cuda>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          const GemmEpilogue<TC>& ep = {}) {
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0) return;
  check_epilogue(ep);
  using detail::cublas_int;
  const int m = cublas_int(d.m, "m"), n = cublas_int(d.n, "n"), k = cublas_int(d.k, "k");
  const int lda = cublas_int(a.ld, "lda"), ldb = cublas_int(b.ld, "ldb"), ldc = cublas_int(c.ld, "ldc");
  ctx.activate();
  ctx.count_launch();
  if (ep.plain()) {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap operands.
    AMP_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta), n, m, k, &ep.alpha,
                                  b.data, detail::cuda_data_type<TB>(), ldb, a.data, detail::cuda_data_type<TA>(), lda,
                                  &ep.beta, c.data, detail::cuda_data_type<TC>(), ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    return;
  }
  // BGRADB writes (does not add) the bias gradient: into scratch, then added.
  TC* grad_bias = ep.grad_bias ? ctx.scratch<TC>(scratch_slot::bias_grad, static_cast<std::size_t>(d.m)) : nullptr;
  if (detail::gemm_lt(ctx, a, ta, b, tb, c, d, ep, grad_bias)) {
    if (grad_bias) for_each(ctx, static_cast<std::size_t>(d.m), detail::AddIntoOp<TC>{ep.grad_bias, grad_bias});
    return;
  }
  // No fused algorithm: fp32 product in scratch, then the epilogue kernel.
  if (ep.grad_bias) detail::add_bias_grad(ctx, a, ta, ep.grad_bias);
  float* z = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(d.m * d.n));
  const float zero = 0.0f;
  AMP_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta), n, m, k, &ep.alpha, b.data,
                                detail::cuda_data_type<TB>(), ldb, a.data, detail::cuda_data_type<TA>(), lda, &zero, z,
                                CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  GemmEpilogue<TC> rest = ep;
  rest.grad_bias = nullptr;
  for_each_cell(ctx, d.m, d.n, detail::EpilogueOp<TC>{z, c.data, d.n, c.ld, rest});
}

namespace detail {
// An FP8 code decoded and multiplied by its operand's 1/scale, in fp32.
template <class F>
struct Fp8DecodeOp {
  Matrix<const F> codes;
  const float* scale_inv;
  float* out;
  AMP_HOST_DEVICE void operator()(std::int64_t r, std::int64_t c) const {
    out[r * codes.cols + c] = fp8_to_float(codes(r, c)) * *scale_inv;
  }
};
}  // namespace detail

// The FP8 GEMM (backend/gemm.hpp's contract) on cuBLASLt: both operands K-major
// (cuBLASLt's "TN"), fp32 accumulation, the epilogue fused. Needs compute
// capability 8.9+ (the policy check names the GPU otherwise). cuBLASLt's FP8
// table pairs an fp32 output with a bf16 bias only, which would round amp's
// fp32 bias: there the product is written plain in fp32 and the epilogue
// kernel finishes it in fp32. Where cuBLASLt has no FP8 algorithm for a case
// (dimensions not multiples of 16, say), the operands are decoded and
// descaled into fp32 scratch and take the fp32 path: the same values up to
// the rounding of each descaled operand.
template <class FA, class FB, class TC>
void gemm_fp8(Context<cuda>& ctx, const Fp8Matrix<FA>& a, const Fp8Matrix<FB>& b, Matrix<TC> c,
              const GemmEpilogue<TC>& ep = {}) {
  const GemmDims d = gemm_fp8_dims(a, b, c, ep);
  if (d.m == 0 || d.n == 0) return;
  ctx.activate();
  const int major = ctx.capability().major, minor = ctx.capability().minor;
  AMP_REQUIRE(major * 10 + minor >= 89, "gemm_fp8: GPU '", ctx.capability().name, "' has compute capability ", major,
              ".", minor, "; FP8 tensor cores need 8.9+ (Ada or Hopper)");
  ctx.count_launch();
  if (!std::is_same_v<TC, float> || ep.plain()) {
    if (detail::gemm_lt(ctx, a.codes, transpose::no, b.codes, transpose::yes, c, d, ep, static_cast<TC*>(nullptr),
                        a.scale_inv, b.scale_inv))
      return;
  } else {  // an fp32 output with a bias or an activation: the plain product, then the epilogue in fp32
    float* z = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(d.m * d.n));
    if (detail::gemm_lt(ctx, a.codes, transpose::no, b.codes, transpose::yes, Matrix<float>(z, d.m, d.n, d.n), d,
                        GemmEpilogue<float>{.alpha = ep.alpha}, static_cast<float*>(nullptr), a.scale_inv,
                        b.scale_inv)) {
      for_each_cell(ctx, d.m, d.n, detail::EpilogueOp<TC>{z, c.data, d.n, c.ld, ep});
      return;
    }
  }
  float* fa = ctx.scratch<float>(scratch_slot::gemm_a, static_cast<std::size_t>(d.m * d.k));
  float* fb = ctx.scratch<float>(scratch_slot::gemm_b, static_cast<std::size_t>(d.n * d.k));
  float* z = ctx.scratch<float>(scratch_slot::gemm_c, static_cast<std::size_t>(d.m * d.n));
  for_each_cell(ctx, d.m, d.k, detail::Fp8DecodeOp<FA>{a.codes, a.scale_inv, fa});
  for_each_cell(ctx, d.n, d.k, detail::Fp8DecodeOp<FB>{b.codes, b.scale_inv, fb});
  gemm(ctx, Matrix<const float>(fa, d.m, d.k, d.k), transpose::no, Matrix<const float>(fb, d.n, d.k, d.k),
       transpose::yes, Matrix<float>(z, d.m, d.n, d.n), GemmEpilogue<float>{.alpha = ep.alpha});
  for_each_cell(ctx, d.m, d.n, detail::EpilogueOp<TC>{z, c.data, d.n, c.ld, ep});
}

// C_i = alpha op(A_i) op(B_i) + beta C_i: one strided-batched cuBLAS call, fp32 accumulation.
template <class T, class TC>
void gemm_batched(Context<cuda>& ctx, Matrix<const T> a, transpose ta, Matrix<const T> b, transpose tb, Matrix<TC> c,
                  const GemmBatch& batch, float alpha = 1.0f, float beta = 0.0f) {
  const GemmDims d = gemm_dims(a, ta, b, tb, c);
  if (d.m == 0 || d.n == 0 || batch.count == 0) return;
  using detail::cublas_int;
  ctx.activate();
  ctx.count_launch();
  AMP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      ctx.cublas(), detail::cublas_op(tb), detail::cublas_op(ta), cublas_int(d.n, "n"), cublas_int(d.m, "m"),
      cublas_int(d.k, "k"), &alpha, b.data, detail::cuda_data_type<T>(), cublas_int(b.ld, "ldb"), batch.stride_b,
      a.data, detail::cuda_data_type<T>(), cublas_int(a.ld, "lda"), batch.stride_a, &beta, c.data,
      detail::cuda_data_type<TC>(), cublas_int(c.ld, "ldc"), batch.stride_c, cublas_int(batch.count, "batch count"),
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <class TA, class TB, class TC>
void gemm(Context<cuda>& ctx, Matrix<const TA> a, transpose ta, Matrix<const TB> b, transpose tb, Matrix<TC> c,
          float alpha, float beta = 0.0f) {
  gemm(ctx, a, ta, b, tb, c, GemmEpilogue<TC>{.alpha = alpha, .beta = beta});
}

}  // namespace amp
