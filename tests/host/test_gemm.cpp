#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "amp/amp.hpp"
#include "support/gemm_cases.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

TEST_CASE_TEMPLATE("host gemm against an FP64 reference", T, GemmFp32, GemmFp16, GemmFp16ToFp32, GemmBf16,
                   GemmBf16ToFp32) {
  using In = typename T::input;
  using Out = typename T::output;
  Context<host> ctx;
  std::uint32_t seed = 1;
  for (const GemmCase& g : gemm_cases) {
    CAPTURE(g.m);
    CAPTURE(g.n);
    CAPTURE(g.k);
    CAPTURE(g.ta);
    CAPTURE(g.tb);
    const auto a = random_values<In>(static_cast<std::size_t>(g.m * g.k), seed++);
    const auto b = random_values<In>(static_cast<std::size_t>(g.k * g.n), seed++);
    auto c = random_values<Out>(static_cast<std::size_t>(g.m * g.n), seed++);
    std::vector<double> ref = to_double(c);
    reference_gemm(to_double(a), g.ta, to_double(b), g.tb, ref, g.m, g.n, g.k, g.alpha, g.beta);
    // Tolerance scale: alpha * sum |a||b| + |beta c|, bounded by alpha*k + |beta| for |x| <= 1.
    const double scale = g.alpha * static_cast<double>(g.k) + std::abs(g.beta);

    const Matrix<const In> ma{a.data(), g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.ta ? g.m : g.k};
    const Matrix<const In> mb{b.data(), g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.tb ? g.k : g.n};
    gemm(ctx, ma, g.ta ? transpose::yes : transpose::no, mb, g.tb ? transpose::yes : transpose::no,
         matrix(c.data(), g.m, g.n), g.alpha, g.beta);
    const double ratio = worst_error_ratio(to_double(c), ref, 0.0, gemm_rtol<Out>(g.k) * scale);
    CHECK(ratio <= 1.0);
  }
  MESSAGE("oneDNN ", detail::onednn::version_string(), " runs ", detail::onednn::isa_name(), " kernels on '",
          detail::host_cpu().name, "'");
}

TEST_CASE_TEMPLATE("host gemm epilogue: bias, relu/gelu, pre-activation and the bias gradient, rounded once", T,
                   GemmFp32, GemmFp16, GemmBf16) {
  using In = typename T::input;
  Context<host> ctx;
  constexpr std::int64_t m = 9, n = 13, k = 40;
  const auto a = random_values<In>(m * k, 31);
  const auto b = random_values<In>(n * k, 32);  // used transposed, as a Linear's weight
  const auto bias = random_values<In>(n, 33);
  const Matrix<const In> ma{a.data(), m, k, k}, mb{b.data(), n, k, k};
  std::vector<double> z(m * n, 0.0);
  reference_gemm(to_double(a), false, to_double(b), true, z, m, n, k, 1.0, 0.0);
  for (std::int64_t i = 0; i < m * n; ++i) z[i] += cast<float>(bias[i % n]);
  const double tol = gemm_rtol<In>(k) * k;  // |a|, |b| <= 1

  for (const activation act : {activation::none, activation::relu, activation::gelu}) {
    CAPTURE(static_cast<int>(act));
    std::vector<In> c(m * n), pre(m * n);
    GemmEpilogue<In> ep{.bias = bias.data(), .act = act};
    if (act == activation::gelu) ep.pre_activation = pre.data();
    gemm(ctx, ma, transpose::no, mb, transpose::yes, matrix(c.data(), m, n), ep);
    std::vector<double> want(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) want[i] = act == activation::relu ? std::max(z[i], 0.0)
                                                         : act == activation::gelu ? GeluFn::forward(static_cast<float>(z[i]))
                                                                                   : z[i];
    CHECK(worst_error_ratio(to_double(c), want, 0.0, tol) <= 1.0);
    if (act == activation::gelu) CHECK(worst_error_ratio(to_double(pre), z, 0.0, tol) <= 1.0);
  }

  // The weight-gradient product: dW += dY^T X with db += column sums of dY.
  const auto dy = random_values<In>(m * n, 34);
  std::vector<In> dw(n * k, cast<In>(0.25f)), db(n, cast<In>(0.5f));
  gemm(ctx, Matrix<const In>{dy.data(), m, n, n}, transpose::yes, ma, transpose::no, matrix(dw.data(), n, k),
       GemmEpilogue<In>{.beta = 1.0f, .grad_bias = db.data()});
  std::vector<double> dw_ref(n * k, 0.25), db_ref(n, 0.5);
  reference_gemm(to_double(dy), true, to_double(a), false, dw_ref, n, k, m, 1.0, 1.0);
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < n; ++j) db_ref[j] += cast<float>(dy[r * n + j]);
  CHECK(worst_error_ratio(to_double(dw), dw_ref, 0.0, gemm_rtol<In>(m) * m) <= 1.0);
  CHECK(worst_error_ratio(to_double(db), db_ref, 0.0, gemm_rtol<In>(m) * m) <= 1.0);

  std::vector<In> c(m * n);
  CHECK_THROWS_WITH_AS(gemm(ctx, ma, transpose::no, mb, transpose::yes, matrix(c.data(), m, n),
                            GemmEpilogue<In>{.act = activation::relu, .pre_activation = c.data()}),
                       doctest::Contains("pre_activation is kept for gelu only"), Error);
}

// A 16-bit C as wide as GPT-2's vocabulary: the fp32 product goes through
// scratch in blocks of rows (detail::gemm_z_block values), with op(A)'s rows
// taken from a transposed A too, and every block's epilogue at its own rows.
TEST_CASE_TEMPLATE("host gemm into a 16-bit C over 50257 columns: fp32 scratch in row blocks, every row right", T,
                   GemmFp16, GemmBf16) {
  using In = typename T::input;
  constexpr std::int64_t m = 200, n = 50257, k = 8;
  static_assert(m * n > 2 * detail::gemm_z_block, "three blocks at least");
  for (const bool ta : {false, true}) {
    CAPTURE(ta);
    Context<host> ctx;
    const auto a = random_values<In>(m * k, 41);  // [m x k], or [k x m] read transposed
    const auto b = random_values<In>(n * k, 42);  // used transposed, as a tied embedding
    const auto bias = random_values<In>(n, 43);
    auto c = random_values<In>(m * n, 44);
    std::vector<In> pre(m * n);
    const auto c0 = to_double(c);
    gemm(ctx, Matrix<const In>{a.data(), ta ? k : m, ta ? m : k, ta ? m : k}, ta ? transpose::yes : transpose::no,
         Matrix<const In>{b.data(), n, k, k}, transpose::yes, matrix(c.data(), m, n),
         GemmEpilogue<In>{.alpha = 0.5f, .beta = 0.25f, .bias = bias.data(), .act = activation::gelu,
                          .pre_activation = pre.data()});
    CHECK(ctx.memory().peak(memory_kind::workspace) <= static_cast<std::size_t>(detail::gemm_z_block * 4 + (1 << 22)));
    std::vector<double> z(c0.size()), want(c0.size());
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (std::int64_t q = 0; q < k; ++q)
          dot += cast<float>(a[ta ? q * m + i : i * k + q]) * static_cast<double>(cast<float>(b[j * k + q]));
        z[i * n + j] = 0.5 * dot + 0.25 * c0[i * n + j] + cast<float>(bias[j]);
        want[i * n + j] = GeluFn::forward(static_cast<float>(z[i * n + j]));
      }
    const double tol = gemm_rtol<In>(k) * (k + 2);
    CHECK(worst_error_ratio(to_double(c), want, 0.0, tol) <= 1.0);
    CHECK(worst_error_ratio(to_double(pre), z, 0.0, tol) <= 1.0);
  }
}

TEST_CASE("host gemm: strided views and shape errors") {
  Context<host> ctx;
  // A 2x2 window of a 3x4 matrix (ld 4) times identity.
  std::vector<float> big{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<float> eye{1, 0, 0, 1};
  std::vector<float> out(4, -1.0f);
  const Matrix<const float> window{big.data() + 5, 2, 2, 4};
  gemm(ctx, window, transpose::no, Matrix<const float>(matrix(eye.data(), 2, 2)), transpose::no,
       matrix(out.data(), 2, 2));
  CHECK(out == std::vector<float>{6, 7, 10, 11});
  // The same window in fp16 goes through the widening path.
  std::vector<half> bigh(big.size()), eyeh(eye.size()), outh(4);
  for (std::size_t i = 0; i < big.size(); ++i) bigh[i] = cast<half>(big[i]);
  for (std::size_t i = 0; i < eye.size(); ++i) eyeh[i] = cast<half>(eye[i]);
  gemm(ctx, Matrix<const half>{bigh.data() + 5, 2, 2, 4}, transpose::no, Matrix<const half>(matrix(eyeh.data(), 2, 2)),
       transpose::no, matrix(outh.data(), 2, 2));
  CHECK(cast<float>(outh[3]) == 11.0f);

  std::vector<float> a(6), b(6), c(4);
  CHECK_THROWS_WITH_AS(gemm(ctx, Matrix<const float>(matrix(a.data(), 2, 3)), transpose::no,
                            Matrix<const float>(matrix(b.data(), 2, 3)), transpose::no, matrix(c.data(), 2, 2)),
                       doctest::Contains("gemm: shapes do not match: A [2x3] * B [2x3] -> C [2x2]"), Error);
  CHECK_NOTHROW(gemm(ctx, Matrix<const float>(matrix(a.data(), 2, 3)), transpose::no,
                     Matrix<const float>(matrix(b.data(), 2, 3)), transpose::yes, matrix(c.data(), 2, 2)));
}

TEST_CASE("host bulk conversions give the bits of the per-element cast") {
  // Every half pattern widens exactly; floats around the half range (ties included) narrow to amp::cast's bits.
  std::vector<half> all(1 << 16);
  for (std::uint32_t x = 0; x < all.size(); ++x) all[x] = detail::half_from_bits(static_cast<std::uint16_t>(x));
  std::vector<float> wide(all.size());
  Context<host> ctx;
  convert(ctx, Span<const half>(all.data(), all.size()), Span<float>(wide.data(), wide.size()));
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (std::isnan(wide[i])) continue;  // NaN stays NaN; payloads are not part of the contract
    REQUIRE(detail::float_bits(wide[i]) == detail::float_bits(cast<float>(all[i])));
  }
  auto f = random_values<float>(100003, 8, -70000.0f, 70000.0f);
  for (std::size_t i = 0; i < f.size(); i += 3) f[i] = detail::bits_float((detail::float_bits(f[i]) & ~0x1fffu) | 0x1000u);
  f[1] = 0x1p-25f, f[2] = 0x1.8p-24f, f[4] = 65520.0f, f[5] = -1e-30f;
  std::vector<half> narrow(f.size());
  convert(ctx, Span<const float>(f.data(), f.size()), Span<half>(narrow.data(), narrow.size()));
  for (std::size_t i = 0; i < f.size(); ++i) REQUIRE(detail::bits(narrow[i]) == detail::bits(cast<half>(f[i])));
  MESSAGE("fp16 conversions on this CPU: ", detail::host_cpu().avx512f ? "AVX-512" : detail::host_cpu().f16c ? "F16C" : "software");
}
