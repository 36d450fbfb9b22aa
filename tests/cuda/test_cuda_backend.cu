// CUDA twins of the backend tests: the same cases on the GPU, checked against
// the host backend and the FP64 reference (attention: test_cuda_attention.cu).
// Without a GPU each case skips.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "amp/amp.hpp"
#include "support/backend_values.hpp"
#include "support/conv_reference.hpp"
#include "support/gemm_cases.hpp"
#include "support/gpu.cuh"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

namespace {
template <class T>
struct DeviceCopy {
  Buffer<T, amp::cuda> buf;
  DeviceCopy(Context<amp::cuda>& ctx, const std::vector<T>& v) : buf(ctx, v.size(), memory_kind::workspace) {
    upload(ctx, buf.span(), v);
  }
};

struct CastBoth {
  const float* in;
  std::uint16_t* h;
  std::uint16_t* b;
  float* back;
  __host__ __device__ void operator()(std::size_t i) const {
    h[i] = detail::bits(cast<half>(in[i]));
    b[i] = detail::bits(cast<amp::bfloat16>(in[i]));
    back[i] = cast<float>(detail::half_from_bits(static_cast<std::uint16_t>(i & 0xffffu)));
  }
};
}  // namespace

TEST_CASE("cuda: casts give the same bits on device and host") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  auto in = random_values<float>(1 << 16, 3, -70000.0f, 70000.0f);
  for (std::size_t i = 0; i < in.size(); i += 5) in[i] = detail::bits_float((detail::float_bits(in[i]) & ~0x1fffu) | 0x1000u);
  in[1] = std::numeric_limits<float>::infinity();
  in[2] = 0x1p-25f;
  DeviceCopy<float> din(ctx, in);
  Buffer<std::uint16_t, amp::cuda> h(ctx, in.size(), memory_kind::workspace), b(ctx, in.size(), memory_kind::workspace);
  Buffer<float, amp::cuda> back(ctx, in.size(), memory_kind::workspace);
  for_each(ctx, in.size(), CastBoth{din.buf.data(), h.data(), b.data(), back.data()});
  const auto hd = download(ctx, Span<const std::uint16_t>(h.span()));
  const auto bd = download(ctx, Span<const std::uint16_t>(b.span()));
  const auto fd = download(ctx, Span<const float>(back.span()));
  for (std::size_t i = 0; i < in.size(); ++i) {
    REQUIRE(hd[i] == detail::bits(cast<half>(in[i])));
    REQUIRE(bd[i] == detail::bits(cast<amp::bfloat16>(in[i])));
    const float host_back = cast<float>(detail::half_from_bits(static_cast<std::uint16_t>(i & 0xffffu)));
    if (!std::isnan(host_back)) REQUIRE(detail::float_bits(fd[i]) == detail::float_bits(host_back));
  }
}

TEST_CASE_TEMPLATE("cuda: gemm matches the FP64 reference and the host backend", T, GemmFp32, GemmFp16,
                   GemmFp16ToFp32, GemmBf16, GemmBf16ToFp32) {
  AMP_REQUIRE_GPU();
  using In = typename T::input;
  using Out = typename T::output;
  Context<amp::cuda> ctx;
  Context<host> hctx;
  std::uint32_t seed = 100;
  for (const GemmCase& g : gemm_cases) {
    CAPTURE(g.m);
    CAPTURE(g.n);
    CAPTURE(g.k);
    const auto a = random_values<In>(static_cast<std::size_t>(g.m * g.k), seed++);
    const auto b = random_values<In>(static_cast<std::size_t>(g.k * g.n), seed++);
    auto c = random_values<Out>(static_cast<std::size_t>(g.m * g.n), seed++);
    std::vector<double> ref = to_double(c);
    reference_gemm(to_double(a), g.ta, to_double(b), g.tb, ref, g.m, g.n, g.k, g.alpha, g.beta);
    DeviceCopy<In> da(ctx, a), db(ctx, b);
    DeviceCopy<Out> dc(ctx, c);
    const std::int64_t ar = g.ta ? g.k : g.m, ac = g.ta ? g.m : g.k, br = g.tb ? g.n : g.k, bc = g.tb ? g.k : g.n;
    const auto ta = g.ta ? transpose::yes : transpose::no, tb = g.tb ? transpose::yes : transpose::no;
    gemm(ctx, Matrix<const In>{da.buf.data(), ar, ac, ac}, ta, Matrix<const In>{db.buf.data(), br, bc, bc}, tb,
         matrix(dc.buf.data(), g.m, g.n), g.alpha, g.beta);
    const auto got = to_double(download(ctx, Span<const Out>(dc.buf.span())));
    const double scale = g.alpha * static_cast<double>(g.k) + std::abs(g.beta);
    CHECK(worst_error_ratio(got, ref, 0.0, gemm_rtol<Out>(g.k) * scale) <= 1.0);

    gemm(hctx, Matrix<const In>{a.data(), ar, ac, ac}, ta, Matrix<const In>{b.data(), br, bc, bc}, tb,
         matrix(c.data(), g.m, g.n), g.alpha, g.beta);
    CHECK(worst_error_ratio(got, to_double(c), 0.0, 2 * gemm_rtol<Out>(g.k) * scale) <= 1.0);
  }
}

TEST_CASE_TEMPLATE("cuda: the fused GEMM epilogue (bias, relu/gelu, pre-activation, bias gradient) matches the host", T,
                   GemmFp32, GemmFp16, GemmBf16) {
  AMP_REQUIRE_GPU();
  using In = typename T::input;
  Context<amp::cuda> ctx;
  Context<host> hctx;
  constexpr std::int64_t m = 37, n = 24, k = 40;  // n a multiple of 8, as cuBLASLt's aux buffers like
  const auto a = random_values<In>(m * k, 61), b = random_values<In>(n * k, 62), bias = random_values<In>(n, 63);
  DeviceCopy<In> da(ctx, a), db(ctx, b), dbias(ctx, bias);
  for (const activation act : {activation::none, activation::relu, activation::gelu}) {
    CAPTURE(static_cast<int>(act));
    std::vector<In> hc(m * n), hpre(m * n);
    Buffer<In, amp::cuda> dc(ctx, m * n, memory_kind::workspace), dpre(ctx, m * n, memory_kind::workspace);
    GemmEpilogue<In> he{.bias = bias.data(), .act = act}, de{.bias = dbias.buf.data(), .act = act};
    if (act == activation::gelu) he.pre_activation = hpre.data(), de.pre_activation = dpre.data();
    gemm(hctx, Matrix<const In>{a.data(), m, k, k}, transpose::no, Matrix<const In>{b.data(), n, k, k}, transpose::yes,
         matrix(hc.data(), m, n), he);
    gemm(ctx, Matrix<const In>{da.buf.data(), m, k, k}, transpose::no, Matrix<const In>{db.buf.data(), n, k, k},
         transpose::yes, matrix(dc.data(), m, n), de);
    const double tol = 2 * gemm_rtol<In>(k) * k;
    CHECK(worst_error_ratio(to_double(download(ctx, Span<const In>(dc.span()))), to_double(hc), 0.0, tol) <= 1.0);
    if (act == activation::gelu)
      CHECK(worst_error_ratio(to_double(download(ctx, Span<const In>(dpre.span()))), to_double(hpre), 0.0, tol) <= 1.0);
  }
  // The weight-gradient product with the bias gradient (BGRADB), accumulating.
  const auto dy = random_values<In>(m * n, 64);
  DeviceCopy<In> ddy(ctx, dy);
  std::vector<In> hw(n * k, cast<In>(0.25f)), hb(n, cast<In>(0.5f));
  DeviceCopy<In> dw(ctx, hw), dbb(ctx, hb);
  gemm(hctx, Matrix<const In>{dy.data(), m, n, n}, transpose::yes, Matrix<const In>{a.data(), m, k, k}, transpose::no,
       matrix(hw.data(), n, k), GemmEpilogue<In>{.beta = 1.0f, .grad_bias = hb.data()});
  gemm(ctx, Matrix<const In>{ddy.buf.data(), m, n, n}, transpose::yes, Matrix<const In>{da.buf.data(), m, k, k},
       transpose::no, matrix(dw.buf.data(), n, k), GemmEpilogue<In>{.beta = 1.0f, .grad_bias = dbb.buf.data()});
  const double tol = 2 * gemm_rtol<In>(m) * m;
  CHECK(worst_error_ratio(to_double(download(ctx, Span<const In>(dw.buf.span()))), to_double(hw), 0.0, tol) <= 1.0);
  CHECK(worst_error_ratio(to_double(download(ctx, Span<const In>(dbb.buf.span()))), to_double(hb), 0.0, tol) <= 1.0);
}

namespace {
struct Fp8Both {
  const float* in;
  std::uint8_t* e4m3;
  std::uint8_t* e5m2;
  float* back;
  __host__ __device__ void operator()(std::size_t i) const {
    e4m3[i] = fp8_from_float<fp8_e4m3>(in[i]).__x;
    e5m2[i] = fp8_from_float<fp8_e5m2>(in[i]).__x;
    fp8_e4m3 c;
    c.__x = static_cast<std::uint8_t>(i & 0xffu);
    back[i] = fp8_to_float(c);
  }
};
}  // namespace

TEST_CASE("cuda: FP8 encoding (cvt.rn.satfinite) and decoding give the host's bits") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  std::vector<float> in;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x7fffu, 0x8000u, 0x8001u}) in.push_back(detail::bits_float(hi << 16 | lo));
  DeviceCopy<float> din(ctx, in);
  Buffer<std::uint8_t, amp::cuda> a(ctx, in.size(), memory_kind::workspace), b(ctx, in.size(), memory_kind::workspace);
  Buffer<float, amp::cuda> back(ctx, in.size(), memory_kind::workspace);
  for_each(ctx, in.size(), Fp8Both{din.buf.data(), a.data(), b.data(), back.data()});
  const auto ad = download(ctx, Span<const std::uint8_t>(a.span())), bd = download(ctx, Span<const std::uint8_t>(b.span()));
  const auto fd = download(ctx, Span<const float>(back.span()));
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    mismatches += ad[i] != fp8_from_float<fp8_e4m3>(in[i]).__x || bd[i] != fp8_from_float<fp8_e5m2>(in[i]).__x;
    fp8_e4m3 c;
    c.__x = static_cast<std::uint8_t>(i & 0xffu);
    if (!std::isnan(fd[i])) mismatches += detail::float_bits(fd[i]) != detail::float_bits(fp8_to_float(c));
  }
  CHECK(mismatches == 0);
}

TEST_CASE("cuda: the FP8 cast (codes, transpose, amax) and gemm_fp8 on cuBLASLt match the host's emulation") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  // Multiples of 16 (cuBLASLt's FP8 kernels) and not (the decode fallback).
  for (const auto [m, n, k] : {std::array<std::int64_t, 3>{64, 48, 96}, std::array<std::int64_t, 3>{37, 24, 40}}) {
    CAPTURE(m);
    CAPTURE(n);
    CAPTURE(k);
    const auto x = random_values<amp::bfloat16>(m * k, 71, -3.0f, 3.0f), w = random_values<amp::bfloat16>(n * k, 72, -0.2f, 0.2f);
    const auto bias = random_values<amp::bfloat16>(n, 73);
    // Each operand's meta: amax so far, scale, 1/scale.
    std::vector<float> hx{0.0f, 100.0f, 0.01f}, hw{0.0f, 2000.0f, 0.0005f};
    DeviceCopy<float> mx(ctx, hx), mw(ctx, hw);
    DeviceCopy<amp::bfloat16> dx(ctx, x), dw(ctx, w), dbias(ctx, bias);
    std::vector<fp8_e4m3> x8(x.size()), xt(x.size()), w8(w.size());
    Buffer<fp8_e4m3, amp::cuda> dx8(ctx, x.size(), memory_kind::workspace), dxt(ctx, x.size(), memory_kind::workspace),
        dw8(ctx, w.size(), memory_kind::workspace);
    const auto meta = [](float* v) { return nn::Fp8Meta{v, v + 1, v + 2}; };
    nn::fp8_cast<DelayedScaling<>>(hctx, x.data(), m, k, x8.data(), xt.data(), meta(hx.data()), true);
    nn::fp8_cast<DelayedScaling<>>(hctx, w.data(), n, k, w8.data(), static_cast<fp8_e4m3*>(nullptr), meta(hw.data()), true);
    nn::fp8_cast<DelayedScaling<>>(ctx, dx.buf.data(), m, k, dx8.data(), dxt.data(), meta(mx.buf.data()), true);
    nn::fp8_cast<DelayedScaling<>>(ctx, dw.buf.data(), n, k, dw8.data(), static_cast<fp8_e4m3*>(nullptr), meta(mw.buf.data()), true);
    hctx.synchronize();
    const auto codes = [](const std::vector<fp8_e4m3>& v) {
      std::vector<std::uint8_t> c;
      for (const auto& e : v) c.push_back(e.__x);
      return c;
    };
    CHECK(codes(download(ctx, Span<const fp8_e4m3>(dx8.span()))) == codes(x8));
    CHECK(codes(download(ctx, Span<const fp8_e4m3>(dxt.span()))) == codes(xt));
    CHECK(codes(download(ctx, Span<const fp8_e4m3>(dw8.span()))) == codes(w8));
    CHECK(download(ctx, Span<const float>(mx.buf.span()))[0] == hx[0]);  // the amax: a maximum, exact

    std::vector<amp::bfloat16> hc(m * n), hpre(m * n);
    Buffer<amp::bfloat16, amp::cuda> dc(ctx, m * n, memory_kind::workspace), dpre(ctx, m * n, memory_kind::workspace);
    gemm_fp8(hctx, Fp8Matrix<fp8_e4m3>{{x8.data(), m, k, k}, &hx[2]}, Fp8Matrix<fp8_e4m3>{{w8.data(), n, k, k}, &hw[2]},
             matrix(hc.data(), m, n), GemmEpilogue<amp::bfloat16>{.bias = bias.data(), .act = activation::gelu, .pre_activation = hpre.data()});
    gemm_fp8(ctx, Fp8Matrix<fp8_e4m3>{{dx8.data(), m, k, k}, mx.buf.data() + 2},
             Fp8Matrix<fp8_e4m3>{{dw8.data(), n, k, k}, mw.buf.data() + 2}, matrix(dc.data(), m, n),
             GemmEpilogue<amp::bfloat16>{.bias = dbias.buf.data(), .act = activation::gelu, .pre_activation = dpre.data()});
    hctx.synchronize();
    const double tol = 2 * gemm_rtol<amp::bfloat16>(k) * k * 0.6;  // sum |x w| <= k * 3 * 0.2
    CHECK(worst_error_ratio(to_double(download(ctx, Span<const amp::bfloat16>(dc.span()))), to_double(hc), 0.0, tol) <= 1.0);
    CHECK(worst_error_ratio(to_double(download(ctx, Span<const amp::bfloat16>(dpre.span()))), to_double(hpre), 0.0, tol) <= 1.0);
  }
}

namespace {
struct AddIndex {
  int* out;
  __host__ __device__ void operator()(std::size_t i) const { out[i] += static_cast<int>(i % 7) + 1; }
};
}  // namespace

TEST_CASE_TEMPLATE("cuda: cuDNN convolution passes against an FP64 direct convolution", T, float, half, amp::bfloat16) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  std::uint32_t seed = 11;
  for (const ConvGeometry& g : conv_cases())
    for (const bool bias : {true, false}) check_conv_passes<T>(ctx, g, bias, seed += 4);
  const auto& state = ctx.library_state<detail::CudnnConvState>();
  MESSAGE("cuDNN ", state.passes_widened(), " of the planned gradient passes write T and widen (no fp32-output engine)");
  // Planned once: a second round of the same shapes makes no plan and moves no scratch.
  const std::size_t plans = state.size(), moves = ctx.scratch_moves();
  for (const ConvGeometry& g : conv_cases()) check_conv_passes<T>(ctx, g, true, seed += 4);
  CHECK(state.size() == plans);
  CHECK(ctx.scratch_moves() == moves);
}

TEST_CASE("cuda: for_each and transform_reduce match the host twins") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  Buffer<int, amp::cuda> hits(ctx, 1000003, memory_kind::workspace);
  upload(ctx, hits.span(), std::vector<int>(hits.size(), 0));
  for_each(ctx, hits.size(), AddIndex{hits.data()});
  const auto got = download(ctx, Span<const int>(hits.span()));
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<int>(i % 7) + 1);

  for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{1000001}}) {
    auto x = random_values<half>(n, 9, -3.0f, 3.0f);
    if (n > 10) x[n / 3] = cast<half>(std::numeric_limits<float>::quiet_NaN());
    DeviceCopy<half> dx(ctx, x);
    Buffer<GradStats, amp::cuda> out(ctx, 1, memory_kind::workspace);
    transform_reduce(ctx, n, amp::detail::GradStatsOf<half>{dx.buf.data()}, amp::detail::CombineGradStats{}, GradStats{}, out.data());
    const GradStats d = download_one(ctx, static_cast<const GradStats*>(out.data()));
    GradStats h{};
    transform_reduce(hctx, n, amp::detail::GradStatsOf<half>{x.data()}, amp::detail::CombineGradStats{}, GradStats{}, &h);
    CHECK(d.nonfinite == h.nonfinite);
    CHECK(d.maxabs == h.maxabs);
    CHECK(d.sumsq == doctest::Approx(h.sumsq).epsilon(1e-5));
  }
}

TEST_CASE("cuda: context accounts memory and checks the policy against the GPU") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  const auto before = ctx.memory().current(memory_kind::weights);
  {
    Buffer<half, amp::cuda> w(ctx, 1 << 20, memory_kind::weights);
    CHECK(ctx.memory().current(memory_kind::weights) == before + (2u << 20));
  }
  CHECK(ctx.memory().current(memory_kind::weights) == before);
  CHECK(ctx.memory().current(memory_kind::workspace) >= Context<amp::cuda>::cublas_workspace_bytes);
  const auto& cap = ctx.capability();
  MESSAGE("GPU: ", cap.name, " (compute capability ", cap.major, ".", cap.minor, ")");
  if (cap.major >= 8) {
    CHECK_NOTHROW(ctx.require<O2BF16Policy>());
    CHECK_NOTHROW(Context<amp::cuda>(0, O2Policy{}));
  } else if (cap.major < 7) {
    CHECK_THROWS_AS(ctx.require<O2Policy>(), Error);
  }
  CHECK_THROWS_WITH_AS(Context<amp::cuda>{cuda_device_count()}, doctest::Contains("device(s) present"), Error);
}

TEST_CASE("cuda: group_by_key (CUB's radix sort, run-length encoding, scan) matches the host at GPT-2's vocabulary") {
  AMP_REQUIRE_GPU();
  constexpr std::size_t n = 8192;  // a batch of 8 x 1024 tokens
  std::vector<std::int32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = static_cast<std::int32_t>(i % 5 == 0 ? 0 : i % 7 == 0 ? 50256 : (i * 7919) % 50257);
  keys[3] = -1;  // an id outside the table groups like any other
  const auto grouped = [&]<class B>(Context<B>& ctx) {
    Buffer<std::int32_t, B> in(ctx, n, memory_kind::data), rows(ctx, n, memory_kind::workspace),
        uniq(ctx, n, memory_kind::workspace), offsets(ctx, n + 1, memory_kind::workspace),
        count(ctx, 1, memory_kind::workspace);
    Buffer<std::byte, B> temp(ctx, group_by_key_bytes(ctx, n), memory_kind::workspace);
    upload(ctx, in.span(), keys);
    group_by_key(ctx, in.data(), n, KeyGroups{rows.data(), uniq.data(), offsets.data(), count.data()}, temp.data());
    const auto groups = static_cast<std::size_t>(download_one(ctx, count.data()));
    auto u = download(ctx, uniq.span()), o = download(ctx, offsets.span());
    u.resize(groups), o.resize(groups + 1);
    return std::make_tuple(groups, download(ctx, rows.span()), u, o);
  };
  Context<amp::cuda> gpu;
  Context<amp::host> cpu;
  const auto want = grouped(cpu);
  CHECK(std::get<0>(want) > 1000);
  CHECK(grouped(gpu) == want);
}
