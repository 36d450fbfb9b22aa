// CUDA twins of the backend tests: the same cases on the GPU, checked against
// the host backend and the FP64 reference (attention: test_cuda_attention.cu).
// Without a GPU each case skips.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

#include "amp/amp.hpp"
#include "support/backend_values.hpp"
#include "support/conv_reference.hpp"
#include "support/gemm_cases.hpp"
#include "support/gpu.cuh"
#include "support/reference.hpp"
#include "support/runs_op.hpp"

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

// First: the GPU check's summary reads this line (and names an older library as the likely cause of a failure).
TEST_CASE("cuda: the libraries loaded are those the headers expect (same major, said when older)") {
  bool said = false;  // another major is refused by name, with the way out; an older minor is said once
  CHECK_THROWS_WITH_AS(detail::check_library_version("cuDNN", 80900, 91900, said),
                       doctest::Contains("another major version"), Error);
  CHECK_FALSE(said);
  CHECK_NOTHROW(detail::check_library_version("cuDNN", 91000, 91900, said));
  CHECK(said);
  AMP_REQUIRE_GPU();
  const CudaVersions v = CudaVersions::loaded();
  std::cout << v.line() << std::endl;
  CHECK(v.driver >= v.runtime);  // a driver older than the runtime fails every call
  CHECK(v.cudnn / 10000 == v.cudnn_built / 10000);
  CHECK(v.cudnn_cuda / 1000 == CUDART_VERSION / 1000);
  CHECK(v.cublas / 10000 == v.cublas_built / 10000);
  CHECK_NOTHROW(detail::check_cudnn_version());
  CHECK_NOTHROW(detail::check_cublas_version());
}

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

    // An fp32 output with a bias: cuBLASLt's FP8 table has no fp32 bias, so the product is plain and the epilogue fp32.
    std::vector<float> bias32(bias.size()), hc32(m * n);
    for (std::size_t i = 0; i < bias.size(); ++i) bias32[i] = cast<float>(bias[i]);
    DeviceCopy<float> dbias32(ctx, bias32);
    Buffer<float, amp::cuda> dc32(ctx, m * n, memory_kind::workspace);
    gemm_fp8(hctx, Fp8Matrix<fp8_e4m3>{{x8.data(), m, k, k}, &hx[2]}, Fp8Matrix<fp8_e4m3>{{w8.data(), n, k, k}, &hw[2]},
             matrix(hc32.data(), m, n), GemmEpilogue<float>{.bias = bias32.data(), .act = activation::relu});
    gemm_fp8(ctx, Fp8Matrix<fp8_e4m3>{{dx8.data(), m, k, k}, mx.buf.data() + 2},
             Fp8Matrix<fp8_e4m3>{{dw8.data(), n, k, k}, mw.buf.data() + 2}, matrix(dc32.data(), m, n),
             GemmEpilogue<float>{.bias = dbias32.buf.data(), .act = activation::relu});
    hctx.synchronize();
    const double tol32 = 2 * gemm_rtol<float>(k) * k * 0.6;
    CHECK(worst_error_ratio(to_double(download(ctx, Span<const float>(dc32.span()))), to_double(hc32), 0.0, tol32) <= 1.0);
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
  std::size_t taken = 0, refused = 0;
  // A shape cuDNN takes runs all three passes (they were planned together); one it refuses is the layer's im2col's.
  for (const ConvGeometry& g : conv_cases())
    for (const bool bias : {true, false}) {
      if (!conv_available<T>(ctx, g, bias)) {
        ++refused;
        continue;
      }
      check_conv_passes<T>(ctx, g, bias, seed += 4);  // forward, input gradient in T and fp32, filter gradient
      ++taken;
    }
  const auto& state = ctx.library_state<detail::CudnnConvState>();
  CHECK(state.without_engine() == refused);
  CHECK(taken > 0);
  MESSAGE("cuDNN takes ", taken, " of ", taken + refused, " shapes; ", state.passes_widened(),
          " of the planned gradient passes write T and widen (no fp32-output engine)");
  // Planned once: a second round of the same shapes makes no plan and moves no scratch.
  const std::size_t plans = state.size(), moves = ctx.scratch_moves();
  for (const ConvGeometry& g : conv_cases())
    if (conv_available<T>(ctx, g, true)) check_conv_passes<T>(ctx, g, true, seed += 4);
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

// Cells, runs (16-byte loads), column sums, the bias-gradient fallback, the embedding gradient and
// per-tensor statistics: each kernel's GPU mapping against the host's.
namespace {
struct CellHits {
  int* out;
  std::int64_t cols;
  __host__ __device__ void operator()(std::int64_t r, std::int64_t c) const { out[r * cols + c] += static_cast<int>(c % 5) + 1; }
};
}  // namespace

TEST_CASE_TEMPLATE("cuda: for_each_cell, runs and column sums give the host's results (column sums: its bits)", T,
                   float, half, amp::bfloat16) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {37, 1000}, {70000, 3}}) {
    Buffer<int, amp::cuda> hits(ctx, static_cast<std::size_t>(rows * cols), memory_kind::workspace);
    fill(ctx, hits.span(), 0);
    for_each_cell(ctx, rows, cols, CellHits{hits.data(), cols});
    const auto got = download(ctx, Span<const int>(hits.span()));
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == static_cast<int>(i % static_cast<std::size_t>(cols) % 5) + 1);
  }
  // Rows of 768 (aligned: 16-byte loads), 771 (misaligned after the first row) and 4096 (a block per row).
  for (const std::int64_t width : {768, 771, 4096}) {
    CAPTURE(width);
    const std::int64_t rows = 33;
    const auto x = random_values<T>(static_cast<std::size_t>(rows * width), 41);
    DeviceCopy<T> dx(ctx, x);
    Buffer<float, amp::cuda> dsums(ctx, rows, memory_kind::workspace);
    Buffer<T, amp::cuda> dy(ctx, x.size(), memory_kind::workspace);
    std::vector<float> hsums(rows);
    std::vector<T> hy(x.size());
    for_each_row(ctx, rows, width, SumAndDoubleRunsOp<T>{dx.buf.data(), width, width, dsums.data(), dy.data()});
    for_each_row(hctx, rows, width, SumAndDoubleRunsOp<T>{x.data(), width, width, hsums.data(), hy.data()});
    const auto gy = download(ctx, Span<const T>(dy.span()));
    const auto gs = download(ctx, Span<const float>(dsums.span()));
    for (std::size_t i = 0; i < hy.size(); ++i) REQUIRE(cast<float>(gy[i]) == cast<float>(hy[i]));
    for (std::int64_t r = 0; r < rows; ++r) CHECK(gs[r] == doctest::Approx(hsums[r]).epsilon(1e-5));
  }
  // Column sums: direct and stranded trees, on and off the host's 16-column vectors, written and added.
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{100, 17}, {2048, 48}, {2117, 33}, {70000, 16},
                                   {16384, 768}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const auto x = random_values<T>(static_cast<std::size_t>(rows * cols), 43, -2.0f, 2.0f);
    DeviceCopy<T> dx(ctx, x);
    Buffer<float, amp::cuda> dpartial(ctx, column_sum_partials(rows, cols), memory_kind::workspace),
        dout(ctx, static_cast<std::size_t>(cols), memory_kind::workspace);
    std::vector<float> hpartial(column_sum_partials(rows, cols)), hout(static_cast<std::size_t>(cols));
    column_sums(ctx, rows, cols, amp::detail::ValueAt<T>{dx.buf.data(), cols}, dpartial.data(), dout.data());
    column_sums(hctx, rows, cols, amp::detail::ValueAt<T>{x.data(), cols}, hpartial.data(), hout.data());
    CHECK(download(ctx, Span<const float>(dout.span())) == hout);
    std::vector<T> hgrad(static_cast<std::size_t>(cols), cast<T>(0.5f));
    DeviceCopy<T> dgrad(ctx, hgrad);
    add_column_sums(ctx, rows, cols, amp::detail::ValueAt<T>{dx.buf.data(), cols}, dpartial.data(), dgrad.buf.data());
    add_column_sums(hctx, rows, cols, amp::detail::ValueAt<T>{x.data(), cols}, hpartial.data(), hgrad.data());
    const auto g = download(ctx, Span<const T>(dgrad.buf.span()));
    for (std::int64_t c = 0; c < cols; ++c) REQUIRE(cast<float>(g[c]) == cast<float>(hgrad[c]));
  }
}

TEST_CASE_TEMPLATE("cuda: the GEMM's bias-gradient fallback (row sums, column sums) matches the fp64 sums", T, float,
                   half, amp::bfloat16) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  for (const bool transposed : {false, true})
    for (const auto& [m, k] : {std::pair<std::int64_t, std::int64_t>{37, 40}, {768, 16384}, {50, 3001}}) {
      CAPTURE(transposed);
      CAPTURE(m);
      CAPTURE(k);
      // op(A) is [m x k]: A itself, or A = [k x m] transposed (a weight gradient's dY^T).
      const std::int64_t rows = transposed ? k : m, cols = transposed ? m : k;
      const auto a = random_values<T>(static_cast<std::size_t>(rows * cols), 51);
      DeviceCopy<T> da(ctx, a);
      std::vector<float> grad(static_cast<std::size_t>(m), 0.25f);
      DeviceCopy<float> dgrad(ctx, grad);
      detail::add_bias_grad(ctx, Matrix<const T>{da.buf.data(), rows, cols, cols}, transposed ? transpose::yes : transpose::no,
                            dgrad.buf.data());
      const auto got = download(ctx, Span<const float>(dgrad.buf.span()));
      for (std::int64_t i = 0; i < m; ++i) {
        double want = 0.25, size = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double v = cast<float>(transposed ? a[p * m + i] : a[i * k + p]);
          want += v, size += std::abs(v);
        }
        REQUIRE(std::abs(got[i] - want) <= 1e-5 * size + 1e-6);
      }
    }
}

TEST_CASE_TEMPLATE("cuda: the embedding's rows and its gradient (a warp or block per token) give the host's bits", T,
                   half, float) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  constexpr std::int64_t vocab = 1000, batch = 4, time = 512, rows = batch * time;
  std::vector<std::int32_t> ids(rows);
  for (std::int64_t i = 0; i < rows; ++i) ids[i] = static_cast<std::int32_t>(i % 4 == 0 ? 3 : (i * 7919) % vocab);
  ids[1] = -1, ids[2] = vocab;  // outside the table: zero rows, no gradient
  DeviceCopy<std::int32_t> dids(ctx, ids);
  for (const std::int64_t features : {13, 64, 768}) {  // tails, a warp per token, a block per token
    CAPTURE(features);
    const auto table = random_values<T>(static_cast<std::size_t>(vocab * features), 61);
    const auto positions = random_values<T>(static_cast<std::size_t>(time * features), 62);
    DeviceCopy<T> dtable(ctx, table), dpositions(ctx, positions);
    std::vector<half> hy(static_cast<std::size_t>(rows * features));
    Buffer<half, amp::cuda> dy(ctx, hy.size(), memory_kind::workspace);
    for_each_row(hctx, rows, features,
                 nn::detail::EmbedOp<T, half>{ids.data(), table.data(), positions.data(), vocab, features, time, hy.data()});
    for_each_row(ctx, rows, features,
                 nn::detail::EmbedOp<T, half>{dids.buf.data(), dtable.buf.data(), dpositions.buf.data(), vocab, features,
                                              time, dy.data()});
    const auto gy = download(ctx, Span<const half>(dy.span()));
    for (std::size_t i = 0; i < hy.size(); ++i) REQUIRE(detail::bits(gy[i]) == detail::bits(hy[i]));

    const auto grad_of = [&]<class B>(Context<B>& c, const std::int32_t* in, const half* d_y, T* grad) {
      Buffer<std::int32_t, B> g(c, 3 * rows + 2, memory_kind::workspace);
      Buffer<std::byte, B> temp(c, group_by_key_bytes(c, rows), memory_kind::workspace);
      const KeyGroups groups{g.data(), g.data() + rows, g.data() + 2 * rows, g.data() + 3 * rows + 1};
      group_by_key(c, in, rows, groups, temp.data());
      nn::detail::add_embedding_grad(c, groups, d_y, rows, vocab, features, grad);
      c.synchronize();
    };
    auto hgrad = random_values<T>(static_cast<std::size_t>(vocab * features), 63);
    DeviceCopy<T> dgrad(ctx, hgrad);
    grad_of(hctx, ids.data(), hy.data(), hgrad.data());
    grad_of(ctx, dids.buf.data(), dy.data(), dgrad.buf.data());
    const auto gg = download(ctx, Span<const T>(dgrad.buf.span()));
    for (std::size_t i = 0; i < gg.size(); ++i) REQUIRE(cast<float>(gg[i]) == cast<float>(hgrad[i]));
  }
}

TEST_CASE("cuda: per-tensor statistics in one segmented reduction (three launches) match the host") {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  // GPT-2-like tensors: a 38M-element table (many chunks), small biases, an empty one, one with a NaN.
  std::vector<std::size_t> offsets, counts;
  std::size_t at = 0;
  for (const std::size_t n : {std::size_t{50257} * 768, std::size_t{768}, std::size_t{0}, std::size_t{768} * 3072,
                              std::size_t{3072}, std::size_t{100}}) {
    offsets.push_back(at), counts.push_back(n);
    at += (n + 63) / 64 * 64;  // padded, as the arenas are
  }
  auto g = random_values<half>(at, 71, -2.0f, 2.0f);
  g[offsets[3] + 5] = cast<half>(std::numeric_limits<float>::quiet_NaN());
  DeviceCopy<half> dg(ctx, g);
  TensorStats<amp::cuda> dstats(ctx, offsets, counts);
  TensorStats<host> hstats(hctx, offsets, counts);
  Buffer<GradStats, amp::cuda> dper(ctx, offsets.size() + 1, memory_kind::workspace);
  std::vector<GradStats> hper(offsets.size() + 1);
  const auto before = ctx.counters().launches;
  dstats(ctx, Span<const half>(dg.buf.data(), at), dper.data(), dper.data() + offsets.size(), true);
  CHECK(ctx.counters().launches - before == 3);
  hstats(hctx, Span<const half>(g.data(), at), hper.data(), hper.data() + offsets.size(), true);
  const auto dd = download(ctx, Span<const GradStats>(dper.span()));
  for (std::size_t t = 0; t <= offsets.size(); ++t) {
    CAPTURE(t);
    CHECK(dd[t].nonfinite == hper[t].nonfinite);
    CHECK(dd[t].maxabs == hper[t].maxabs);
    CHECK(dd[t].sumsq == doctest::Approx(hper[t].sumsq).epsilon(1e-12));
  }
  CHECK(dd[offsets.size()].nonfinite == 1);
}
