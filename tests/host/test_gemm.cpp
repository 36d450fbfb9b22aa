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
  // bf16 runs twice: natively (AMX, where this CPU has it) and widened to fp32.
  for (const bool native : {true, false}) {
    CAPTURE(native);
    ctx.set_native_bf16(native);
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
  }
  if (std::is_same_v<In, amp::bfloat16>)
    MESSAGE("native bf16 GEMM (AMX) on this CPU: ", std::string(detail::host_has_amx_bf16() ? "yes" : "no"));
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

  std::vector<float> a(6), b(6), c(4);
  CHECK_THROWS_WITH_AS(gemm(ctx, Matrix<const float>(matrix(a.data(), 2, 3)), transpose::no,
                            Matrix<const float>(matrix(b.data(), 2, 3)), transpose::no, matrix(c.data(), 2, 2)),
                       doctest::Contains("gemm: shapes do not match: A [2x3] * B [2x3] -> C [2x2]"), Error);
  CHECK_NOTHROW(gemm(ctx, Matrix<const float>(matrix(a.data(), 2, 3)), transpose::no,
                     Matrix<const float>(matrix(b.data(), 2, 3)), transpose::yes, matrix(c.data(), 2, 2)));
}
