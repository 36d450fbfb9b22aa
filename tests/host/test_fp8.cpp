// FP8 (core/fp8.hpp, model/fp8_state.hpp, the O2-fp8 policy): every code
// decodes exactly and encoding is CUDA's bit for bit; the delayed-scaling
// state machine against a reference; the cast's amax and transpose; the FP8
// GEMM against FP64 on FP8-rounded operands; a Linear's three GEMMs against a
// quantised FP64 reference; gradients against FP64 finite differences within
// E4M3/E5M2's precision; which layers run in FP8; a huge activation absorbed
// by the scales; exact resume and refused checkpoints; and the GPU check's refusal.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "amp/amp.hpp"
#include "amp/backend/capability.hpp"
#include "amp/io/checkpoint.hpp"
#include "support/model_values.hpp"
#include "support/policies.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
template <class F>
std::uint8_t code(float x) {
  return fp8_from_float<F>(x).__x;
}
template <class F>
F from_code(std::uint32_t c) {
  F f;
  f.__x = static_cast<std::uint8_t>(c);
  return f;
}
template <class F>
std::uint8_t cuda_code(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fp8_format<F>::cuda);
}
template <class F>
double decoded(std::uint8_t c) {
  return fp8_to_float(from_code<F>(c));
}

// The value of FP8 code c from its fields, in FP64.
template <class F>
double value_of(std::uint32_t c) {
  using Fmt = fp8_format<F>;
  const int e = static_cast<int>((c & 0x7fu) >> Fmt::mantissa), m = static_cast<int>(c & ((1u << Fmt::mantissa) - 1u));
  const double frac = static_cast<double>(m) / (1 << Fmt::mantissa);
  const double v = e == 0 ? std::ldexp(frac, 1 - Fmt::bias) : std::ldexp(1 + frac, e - Fmt::bias);
  return c & 0x80u ? -v : v;
}

template <class F>
void check_codes() {
  CAPTURE(fp8_format<F>::name);
  for (std::uint32_t c = 0; c < 256; ++c) {
    CAPTURE(c);
    const float got = fp8_to_float(from_code<F>(c)), cuda = static_cast<float>(from_code<F>(c));
    const std::uint32_t mag = c & 0x7fu;
    if (mag > fp8_format<F>::max_code) {  // NaN, or E5M2's infinities
      if (std::is_same_v<F, fp8_e5m2> && mag == 0x7cu) CHECK(got == (c & 0x80u ? -INFINITY : INFINITY));
      else CHECK(std::isnan(got));
      CHECK(std::isnan(got) == std::isnan(cuda));
      continue;
    }
    CHECK(static_cast<double>(got) == value_of<F>(c));
    CHECK(detail::float_bits(got) == detail::float_bits(cuda));
  }
  CHECK(decoded<F>(static_cast<std::uint8_t>(fp8_format<F>::max_code)) == fp8_format<F>::max);
}

template <class F>
void check_encoding() {
  CAPTURE(fp8_format<F>::name);
  // Every sign, exponent and top-7-mantissa pattern, with low halves that are
  // exact, just above or below a halfway point, and sticky.
  std::size_t checked = 0;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x4000u, 0xc000u}) {
      const float x = detail::bits_float(hi << 16 | lo);
      const int ours = code<F>(x), cuda = cuda_code<F>(x);
      if (ours != cuda) {  // one assertion per mismatch, not 2^19 of them
        CAPTURE(x);
        CHECK(ours == cuda);
      }
      ++checked;
    }
  CHECK(checked == 65536u * 8);
  // Halfway points between neighbouring codes (ties to even), and one fp32 ulp either side.
  for (std::uint32_t c = 0; c < fp8_format<F>::max_code; ++c) {
    const float mid = static_cast<float>((value_of<F>(c) + value_of<F>(c + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), -mid}) {
      CAPTURE(x);
      CHECK(code<F>(x) == cuda_code<F>(x));
    }
    CHECK(code<F>(mid) == ((c & 1u) ? c + 1 : c));
  }
  const std::uint8_t max = static_cast<std::uint8_t>(fp8_format<F>::max_code);
  for (float x : {fp8_format<F>::max * 1.5f, 1e30f, INFINITY, limits<float>::max()}) {
    CHECK(code<F>(x) == max);
    CHECK(code<F>(-x) == (max | 0x80u));
  }
  CHECK(code<F>(NAN) == 0x7f);
  CHECK(code<F>(-0.0f) == 0x80);
  CHECK(code<F>(1e-40f) == 0);  // fp32 subnormal: below every FP8 value
}
}  // namespace

TEST_CASE("fp8: all 256 codes of both formats decode exactly, as CUDA's conversion does") {
  check_codes<fp8_e4m3>();
  check_codes<fp8_e5m2>();
  CHECK(fp8_unit_roundoff<fp8_e4m3> == 1.0 / 16);
  CHECK(fp8_unit_roundoff<fp8_e5m2> == 1.0 / 8);
}

TEST_CASE("fp8: encoding is bit-exact with CUDA's host conversion over every fp32 class") {
  check_encoding<fp8_e4m3>();
  check_encoding<fp8_e5m2>();
}

namespace {
// Delayed scaling's state machine, written out: a ring of History amaxes, a
// non-finite amax recorded as none, the scale from the ring's maximum, kept
// when that is zero.
struct ReferenceDelayed {
  int history, margin;
  float fp8_max;
  std::vector<float> ring = std::vector<float>(static_cast<std::size_t>(history), 0.0f);
  int position = 0;
  float scale = 1.0f;
  void step(float amax) {
    ring[static_cast<std::size_t>(position)] = std::isfinite(amax) ? amax : 0.0f;
    position = (position + 1) % history;
    float m = 0;
    for (float v : ring) m = std::max(m, v);
    if (m > 0) scale = fp8_max / m / static_cast<float>(1 << margin);
  }
};

struct Delayed4 : O2FP8Policy {
  using fp8 = Fp8<DelayedScaling<4, 1>, fp8_e4m3, fp8_e5m2, 0, 0>;
  static constexpr std::string_view name = "delayed 4, margin 1";
};
}  // namespace

TEST_CASE("fp8: delayed scaling's state machine: history roll, max, margin, zero and non-finite amax") {
  Context<host> ctx;
  nn::Fp8State<Delayed4, host> state;
  const int slot = state.declare(0, "layer", 4, 4);
  state.allocate(ctx);
  state.resolve();
  ReferenceDelayed fwd{4, 1, 448.0f}, bwd{4, 1, 57344.0f};
  const float amaxes[] = {2.0f, 0.0f, 8.0f, INFINITY, 1.0f, 0.5f, 0.25f, 0.125f, NAN, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f};
  for (float a : amaxes) {
    CAPTURE(a);
    for (auto o : {nn::fp8_operand::input, nn::fp8_operand::weight, nn::fp8_operand::grad}) upload(ctx, Span<float>(state.meta(slot, o).amax, 1), &a, 1);
    state.step();
    fwd.step(a), bwd.step(a);
    const auto scales = download(ctx, Span<const float>(state.scale_values()));
    CHECK(scales[0] == fwd.scale);
    CHECK(scales[1] == fwd.scale);
    CHECK(scales[2] == bwd.scale);
    CHECK(download_one(ctx, static_cast<const float*>(state.meta(slot, nn::fp8_operand::grad).scale_inv)) == 1.0f / bwd.scale);
    CHECK(download(ctx, Span<const float>(state.amax_values())) == std::vector<float>(3, 0.0f));  // restarted
  }
  // By hand, the first steps: 448 / 2 / 2, then the 2 stays for 3 more steps, the 8 takes over...
  ReferenceDelayed r{4, 1, 448.0f};
  r.step(2.0f);
  CHECK(r.scale == 112.0f);
  r.step(0.0f), r.step(8.0f);
  CHECK(r.scale == 28.0f);
  r.step(INFINITY), r.step(1.0f), r.step(0.5f), r.step(0.25f);  // the 8 leaves the window at the 4th step after it
  CHECK(r.scale == 224.0f);
  r.step(0.0f), r.step(0.0f);  // the infinity (recorded as none), then the 1 leave
  CHECK(r.scale == 448.0f);
  r.step(0.0f);
  CHECK(r.scale == 896.0f);
  r.step(0.0f);  // nothing left in the window: the scale stays
  CHECK(r.scale == 896.0f);
}

TEST_CASE("fp8: a cast writes codes and their transpose and finds the amax in the same pass") {
  Context<host> ctx;
  constexpr std::int64_t rows = 5, cols = 7;
  auto x = random_values<amp::bfloat16>(rows * cols, 21, -3.0f, 3.0f);
  x[9] = cast<amp::bfloat16>(-4.5f);
  x[17] = cast<amp::bfloat16>(INFINITY);  // an overflow upstream: NaN, not the largest code
  float meta_values[3] = {1.0f, 20.0f, 0.05f};  // amax so far, scale, scale_inv
  const nn::Fp8Meta meta{&meta_values[0], &meta_values[1], &meta_values[2]};
  std::vector<fp8_e4m3> codes(rows * cols), codes_t(rows * cols);
  for (bool record : {false, true}) {
    nn::fp8_cast<DelayedScaling<>>(ctx, x.data(), rows, cols, codes.data(), codes_t.data(), meta, record);
    ctx.synchronize();
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const float v = cast<float>(x[r * cols + c]);
        const std::uint8_t want = std::isfinite(v) ? code<fp8_e4m3>(v * 20.0f) : 0x7f;
        REQUIRE(codes[r * cols + c].__x == want);
        REQUIRE(codes_t[c * rows + r].__x == want);
      }
    CHECK(meta_values[0] == (record ? INFINITY : 1.0f));  // recorded: combined by max with what was there
  }
  x[17] = cast<amp::bfloat16>(0.0f);
  meta_values[0] = 0.0f;
  nn::fp8_cast<DelayedScaling<>>(ctx, x.data(), rows, cols, codes.data(), codes_t.data(), meta, true);
  ctx.synchronize();
  CHECK(meta_values[0] == 4.5f);
  // Current scaling: the tensor's own amax sets the scale before the cast.
  nn::fp8_cast<CurrentScaling<1>>(ctx, x.data(), rows, cols, codes.data(), static_cast<fp8_e4m3*>(nullptr), meta, true);
  ctx.synchronize();
  CHECK(meta_values[1] == 448.0f / 4.5f / 2.0f);
  CHECK(meta_values[2] == 1.0f / meta_values[1]);
  CHECK(codes[9].__x == code<fp8_e4m3>(-4.5f * meta_values[1]));
}

// The launches are counted where fp8_cast decides them, so the GPU's tiled
// cast-with-transpose (backend/cuda/cast_transposed.cuh) counts the same: one
// cast, one more to fold the recorded amax; on a shape that no 32 x 32 tile divides.
TEST_CASE("fp8: a cast with its transpose is one launch, two when it records the amax, on a 45 x 70 matrix") {
  Context<host> ctx;
  constexpr std::int64_t rows = 45, cols = 70;
  const auto x = random_values<amp::bfloat16>(rows * cols, 22, -600.0f, 600.0f);
  float meta_values[3] = {0.0f, 0.75f, 1.0f / 0.75f};
  const nn::Fp8Meta meta{&meta_values[0], &meta_values[1], &meta_values[2]};
  std::vector<fp8_e5m2> codes(rows * cols), codes_t(rows * cols);
  float amax = 0.0f;
  for (const auto v : x) amax = std::max(amax, std::abs(cast<float>(v)));
  for (const bool record : {false, true}) {
    const std::size_t before = ctx.counters().launches;
    nn::fp8_cast<DelayedScaling<>>(ctx, x.data(), rows, cols, codes.data(), codes_t.data(), meta, record);
    ctx.synchronize();
    CHECK(ctx.counters().launches - before == (record ? 2u : 1u));
    std::size_t wrong = 0;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::uint8_t want = code<fp8_e5m2>(cast<float>(x[r * cols + c]) * 0.75f);
        wrong += codes[r * cols + c].__x != want || codes_t[c * rows + r].__x != want;
      }
    CHECK(wrong == 0);
    CHECK(meta_values[0] == (record ? amax : 0.0f));
  }
}

namespace {
// C = act(alpha a_inv b_inv A B^T + beta C + bias) in FP64 from the decoded codes.
template <class FA, class FB>
void check_gemm_fp8(std::int64_t m, std::int64_t n, std::int64_t k, bool epilogue) {
  CAPTURE(m);
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(epilogue);
  Context<host> ctx;
  std::vector<FA> a(m * k);
  std::vector<FB> b(n * k);
  const auto ra = random_values<float>(a.size(), 31, -400.0f, 400.0f), rb = random_values<float>(b.size(), 32, -400.0f, 400.0f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = fp8_from_float<FA>(ra[i]);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = fp8_from_float<FB>(rb[i]);
  const float a_inv = 1.0f / 300.0f, b_inv = 1.0f / 96.0f;
  const auto c0 = random_values<amp::bfloat16>(m * n, 33);
  const auto bias = random_values<amp::bfloat16>(n, 34);
  std::vector<amp::bfloat16> c = c0, pre(m * n);
  GemmEpilogue<amp::bfloat16> ep{.alpha = 0.5f};
  if (epilogue) ep.beta = 1.0f, ep.bias = bias.data(), ep.act = activation::gelu, ep.pre_activation = pre.data();
  gemm_fp8(ctx, Fp8Matrix<FA>{{a.data(), m, k, k}, &a_inv}, Fp8Matrix<FB>{{b.data(), n, k, k}, &b_inv},
           Matrix<amp::bfloat16>{c.data(), m, n, n}, ep);
  std::vector<float> c32(m * n);
  gemm_fp8(ctx, Fp8Matrix<FA>{{a.data(), m, k, k}, &a_inv}, Fp8Matrix<FB>{{b.data(), n, k, k}, &b_inv},
           Matrix<float>{c32.data(), m, n, n}, GemmEpilogue<float>{.alpha = 0.5f});
  ctx.synchronize();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double z = 0, mag = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double t = static_cast<double>(fp8_to_float(a[i * k + p])) * fp8_to_float(b[j * k + p]);
        z += t, mag += std::abs(t);
      }
      const double scale = 0.5 * static_cast<double>(a_inv) * b_inv;
      z *= scale, mag *= scale;
      // fp32 sums of k exact products, the scales applied in fp32.
      const double sum_err = (k + 3) * unit_roundoff<float> * mag;
      REQUIRE(std::abs(c32[i * n + j] - z) <= sum_err + 1e-30);
      double want = z;
      if (epilogue) {
        want += cast<float>(c0[i * n + j]) + cast<float>(bias[j]);
        REQUIRE(std::abs(cast<float>(pre[i * n + j]) - want) <= 2 * unit_roundoff<amp::bfloat16> * std::abs(want) + sum_err + 1e-6);
        want = gelu(want);
      }
      REQUIRE(std::abs(cast<float>(c[i * n + j]) - want) <= 2 * unit_roundoff<amp::bfloat16> * std::abs(want) + 2 * sum_err + 1e-6);
    }
}
}  // namespace

TEST_CASE("fp8: gemm_fp8 (host emulation) against FP64 on FP8-rounded operands, with and without the epilogue") {
  check_gemm_fp8<fp8_e4m3, fp8_e4m3>(19, 23, 37, false);
  check_gemm_fp8<fp8_e4m3, fp8_e4m3>(33, 16, 64, true);
  check_gemm_fp8<fp8_e5m2, fp8_e4m3>(16, 48, 200, true);
  check_gemm_fp8<fp8_e4m3, fp8_e5m2>(7, 5, 3, true);
  Context<host> ctx;
  std::vector<fp8_e4m3> a(12), b(12);
  std::vector<float> c(16);
  const float one = 1.0f;
  const auto refused = [&](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused([&] {
          gemm_fp8(ctx, Fp8Matrix<fp8_e4m3>{{a.data(), 4, 3, 3}, &one}, Fp8Matrix<fp8_e4m3>{{b.data(), 3, 4, 4}, &one},
                   Matrix<float>{c.data(), 4, 4, 4});
        }).find("gemm_fp8: shapes do not match: A [4x3] * B^T [4x3] -> C [4x4]") != std::string::npos);
  CHECK(refused([&] {
          gemm_fp8(ctx, Fp8Matrix<fp8_e4m3>{{a.data(), 4, 3, 3}, nullptr}, Fp8Matrix<fp8_e4m3>{{b.data(), 4, 3, 3}, &one},
                   Matrix<float>{c.data(), 4, 4, 4});
        }).find("both operands need their 1/scale") != std::string::npos);
  float db[4] = {};
  CHECK(refused([&] {
          gemm_fp8(ctx, Fp8Matrix<fp8_e4m3>{{a.data(), 4, 3, 3}, &one}, Fp8Matrix<fp8_e4m3>{{b.data(), 4, 3, 3}, &one},
                   Matrix<float>{c.data(), 4, 4, 4}, GemmEpilogue<float>{.grad_bias = db});
        }).find("no bias-gradient epilogue") != std::string::npos);
}

namespace {
constexpr std::int64_t kRows = 12, kIn = 32, kOut = 16;

// One Linear whose input is a differentiable tensor (relu of a positive
// input: the input itself), so dL/dx can be read.
template <class P, class B>
struct Probe {
  using T = typename P::activation_type;
  nn::Linear<P, B> l;
  nn::Var<T> h;
  explicit Probe(nn::Builder<P, B> b) : l(b.child("l"), {.in_features = kIn, .out_features = kOut}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{kIn}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    h = nn::relu(g, x);
    return l(g, h);
  }
};

template <class F>
double q(float x, float scale) {
  return fp8_to_float(fp8_from_float<F>(x * scale));
}
double bf(double x) { return cast<float>(cast<amp::bfloat16>(static_cast<float>(x))); }
std::vector<float> bf16_values(std::size_t n, std::uint32_t seed, float lo, float hi) {
  const auto b = random_values<amp::bfloat16>(n, seed, lo, hi);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = cast<float>(b[i]);
  return out;
}
}  // namespace

TEST_CASE("fp8: a Linear's three GEMMs compute what a quantised FP64 reference computes") {
  using P = AllFp8Policy;
  Context<host> ctx;
  nn::Model<P, host, Probe<P, host>> model(ctx, {.max_batch = kRows, .seed = 3});
  const auto x = bf16_values(kRows * kIn, 41, 0.0f, 2.0f);
  const auto dy = bf16_values(kRows * kOut, 42, -0.01f, 0.01f);
  auto& store = model.parameters();
  const auto run = [&] {
    auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{kRows, kIn}));
    store.zero_grad();
    const auto go = model.graph().grad_out(out.var);
    std::vector<amp::bfloat16> d(dy.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = cast<amp::bfloat16>(dy[i]);
    upload(ctx, Span<amp::bfloat16>(go.data, d.size()), d);
    model.graph().backward();
    return out;
  };
  run();                // records the amaxes (scales still 1)
  store.fp8().step();   // the scales from them, as the optimizer's step does
  store.mark_updated();
  const auto out = run();
  const auto scales = download(ctx, Span<const float>(store.fp8().scale_values()));
  const float sx = scales[0], sw = scales[1], sg = scales[2];
  CHECK(sx == 448.0f / *std::max_element(x.begin(), x.end()));  // the input's amax
  const auto y = download(ctx, Span<const amp::bfloat16>(out.var.data, kRows * kOut));
  const auto dx = download(ctx, Span<const amp::bfloat16>(model.graph().grad(model.net().h), kRows * kIn));
  const auto stored = [&](nn::Param<nn::role::weight> p) {  // what the forward read: bf16, not the fp32 masters
    std::vector<float> v;
    for (const auto& e : download(ctx, Span<const amp::bfloat16>(store.values(p)))) v.push_back(cast<float>(e));
    return v;
  };
  const auto w = stored(model.net().l.weight()), b = stored(model.net().l.bias());
  const auto dw = download(ctx, Span<const amp::bfloat16>(store.grads(model.net().l.weight())));
  const auto db = download(ctx, Span<const amp::bfloat16>(store.grads(model.net().l.bias())));
  const double ix = 1.0f / sx, iw = 1.0f / sw, ig = 1.0f / sg;  // as the GEMMs take them, in fp32
  const auto close = [](double got, double want, double mag, std::int64_t k) {
    return std::abs(got - want) <= 2 * unit_roundoff<amp::bfloat16> * std::abs(want) + (k + 3) * unit_roundoff<float> * mag + 1e-12;
  };
  // The sum of term(i) over i < n, and of |term(i)| (what an fp32 sum's error scales with).
  const auto sum = [](std::int64_t n, auto term) {
    double z = 0, mag = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double t = term(i);
      z += t, mag += std::abs(t);
    }
    return std::pair{z, mag};
  };
  for (std::int64_t r = 0; r < kRows; ++r)
    for (std::int64_t o = 0; o < kOut; ++o) {
      const auto [z, mag] = sum(kIn, [&](std::int64_t k) {
        return q<fp8_e4m3>(x[r * kIn + k], sx) * q<fp8_e4m3>(w[o * kIn + k], sw) * ix * iw;
      });
      REQUIRE(close(cast<float>(y[r * kOut + o]), bf(z + b[o]), mag, kIn));
    }
  for (std::int64_t o = 0; o < kOut; ++o) {
    const double bias_sum = sum(kRows, [&](std::int64_t r) { return static_cast<double>(dy[r * kOut + o]); }).first;
    REQUIRE(close(cast<float>(db[o]), bf(bias_sum), 0, kRows));  // from dy itself, not its E5M2 codes
    for (std::int64_t k = 0; k < kIn; ++k) {
      const auto [z, mag] = sum(kRows, [&](std::int64_t r) {
        return q<fp8_e5m2>(dy[r * kOut + o], sg) * q<fp8_e4m3>(x[r * kIn + k], sx) * ig * ix;
      });
      REQUIRE(close(cast<float>(dw[o * kIn + k]), bf(z), mag, kRows));
    }
  }
  for (std::int64_t r = 0; r < kRows; ++r)
    for (std::int64_t k = 0; k < kIn; ++k) {
      const auto [z, mag] = sum(kOut, [&](std::int64_t o) {
        return q<fp8_e5m2>(dy[r * kOut + o], sg) * q<fp8_e4m3>(w[o * kIn + k], sw) * ig * iw;
      });
      REQUIRE(close(cast<float>(dx[r * kIn + k]), bf(z), mag, kOut));
    }
}

namespace {
template <class P, class B>
struct Mlp3 {
  using T = typename P::activation_type;
  nn::Linear<P, B> l1, l2, l3;
  explicit Mlp3(nn::Builder<P, B> b)
      : l1(b.child("l1"), {.in_features = 6, .out_features = 8, .act = activation::gelu}),
        l2(b.child("l2"), {.in_features = 8, .out_features = 8, .act = activation::relu}),
        l3(b.child("l3"), {.in_features = 8, .out_features = 3}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{6}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return l3(g, l2(g, l1(g, x))); }
};
}  // namespace

TEST_CASE("fp8: gradients against FP64 finite differences within E4M3/E5M2's precision") {
  using P = AllFp8Policy;
  constexpr std::int64_t n = 16;
  Context<host> ctx;
  nn::Model<P, host, Mlp3<P, host>> model(ctx, {.max_batch = n, .seed = 5});
  const auto x = exact_inputs(n * 6, 43);
  std::vector<std::int32_t> labels(n);
  for (std::int64_t r = 0; r < n; ++r) labels[r] = static_cast<std::int32_t>((r * 5 + 1) % 3);
  const Span<const std::int32_t> y{labels.data(), labels.size()};
  const auto pass = [&] {
    auto loss = nn::cross_entropy(ctx, model.forward(ctx, TensorView<const float>(x.data(), Shape{n, 6})), y);
    model.parameters().zero_grad();
    loss.backward();
    return loss.item();
  };
  pass();  // amaxes, then the scales the next pass casts with
  model.parameters().fp8().step();
  model.parameters().mark_updated();
  const float loss = pass();
  const Params p = consumed_values(model.parameters());  // the bf16 weights, not their codes
  const auto f = [&](const Params& v) {
    const Vec h1 = map(linear(to_double(x), 6, v.at("l1.weight"), v.at("l1.bias"), 8), gelu);
    const Vec h2 = map(linear(h1, 8, v.at("l2.weight"), v.at("l2.bias"), 8), relu);
    return cross_entropy(linear(h2, 8, v.at("l3.weight"), v.at("l3.bias"), 3), 3, labels);
  };
  // Each gradient element sums products of an E5M2 and an E4M3 value (relative
  // error up to u5 + u4, u = half an ulp); the gradient reaching layer l was
  // quantised once more by each layer above it (E5M2, times an E4M3 weight),
  // and the forward's E4M3 errors reach the loss: (4 - l + 1) (u4 + u5) for l of 3.
  const double u = fp8_unit_roundoff<fp8_e4m3> + fp8_unit_roundoff<fp8_e5m2>;
  CHECK(loss == doctest::Approx(f(p)).epsilon(3 * fp8_unit_roundoff<fp8_e4m3>));
  std::string measured;
  for (const auto& [name, g] : gradients(model.parameters())) {
    CAPTURE(name);
    const int layer = name[1] - '0';
    double scale = 0, err = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double fd = central_difference(f, p, name, i, 1e-6);
      scale = std::max(scale, std::abs(fd)), err = std::max(err, std::abs(g[i] - fd));
    }
    CHECK(err <= (5 - layer) * u * scale);
    measured += " " + name + " " + std::to_string(err / scale) + " (bound " + std::to_string((5 - layer) * u) + ")";
  }
  MESSAGE("O2-fp8 gradient error relative to each tensor's largest:", measured);
}

namespace {
template <class P, class B>
struct ConvHead {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> conv;
  nn::Flatten<P, B> flat;
  nn::Linear<P, B> fc1, fc2;
  explicit ConvHead(nn::Builder<P, B> b)
      : conv(b.child("conv"), {.in_channels = 1, .out_channels = 2, .kernel = 3, .padding = 1}),
        flat(b.child("flat"), {}),
        fc1(b.child("fc1"), {.in_features = 32, .out_features = 16, .act = activation::relu}),
        fc2(b.child("fc2"), {.in_features = 16, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{4, 4, 1}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) { return fc2(g, fc1(g, flat(g, conv(g, x)))); }
};

// Embedding, a Linear, and the tied head (the embedding's weight again) or a Linear head.
template <bool Tied>
struct LmOf {
  template <class P, class B>
  struct Net {
    using T = typename P::activation_type;
    nn::Embedding<P, B> emb;
    nn::Linear<P, B> mid, head;
    explicit Net(nn::Builder<P, B> b)
        : emb(b.child("emb"), {.vocab = 11, .features = 16}),
          mid(b.child("mid"), {.in_features = 16, .out_features = 16, .act = activation::gelu}),
          head(b.child("head"), {.in_features = 16, .out_features = 11}) {}
    std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{4})}; }
    nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) {
      const auto h = mid(g, emb(g, ids));
      if constexpr (Tied) return emb.logits(g, h);
      else return head(g, h);
    }
  };
};

template <class P, template <class, class> class Net>
std::vector<bool> fp8_enabled() {
  Context<host> ctx;
  nn::Model<P, host, Net<P, host>> model(ctx, {.max_batch = 2, .seed = 1});
  std::vector<bool> on;
  for (const auto& l : model.parameters().fp8().layers()) on.push_back(l.enabled);
  return on;
}
}  // namespace

TEST_CASE("fp8: the first and last layers with weights stay out of FP8, in the order of the forward") {
  CHECK(fp8_enabled<O2FP8Policy, Mlp3>() == std::vector<bool>{false, true, false});
  CHECK(fp8_enabled<AllFp8Policy, Mlp3>() == std::vector<bool>{true, true, true});
  CHECK(fp8_enabled<O2FP8Policy, ConvHead>() == std::vector<bool>{true, false});  // the conv is the first layer
  // A tied head is the embedding's weight again: the last layer; the Linears between run in FP8.
  CHECK(fp8_enabled<O2FP8Policy, LmOf<true>::Net>() == std::vector<bool>{true, true});  // mid, and head (unused)
  CHECK(fp8_enabled<O2FP8Policy, LmOf<false>::Net>() == std::vector<bool>{true, false});
  CHECK(fp8_enabled<O2BF16Policy, Mlp3>().empty());
  Context<host> ctx;
  nn::Model<O2FP8Policy, host, Mlp3<O2FP8Policy, host>> model(ctx, {.max_batch = 2, .seed = 1});
  CHECK(model.parameters().fp8().layers()[1].name == "l2");
}

TEST_CASE("fp8: the weights' FP8 codes are counted as weights, one byte each, twice (the transpose)") {
  Context<host> a, b;
  nn::Model<O2BF16Policy, host, Mlp3<O2BF16Policy, host>> bf16(a, {.max_batch = 4, .seed = 1});
  nn::Model<O2FP8Policy, host, Mlp3<O2FP8Policy, host>> fp8(b, {.max_batch = 4, .seed = 1});
  CHECK(b.memory().peak(memory_kind::weights) - a.memory().peak(memory_kind::weights) == 2 * 8 * 8);
}

namespace {
// One three-line training step of an Mlp3 on x [rows x 6]; the loss.
template <class Model, class Opt>
float train_step(Context<host>& ctx, Model& model, Opt& opt, const std::vector<float>& x,
                 const std::vector<std::int32_t>& labels) {
  const auto rows = static_cast<std::int64_t>(labels.size());
  auto loss = nn::cross_entropy(ctx, model.forward(ctx, TensorView<const float>(x.data(), Shape{rows, 6})),
                                Span<const std::int32_t>{labels.data(), labels.size()});
  opt.zero_grad();
  {
    auto scaled = scale_loss(loss, opt);
    scaled.backward();
  }
  opt.step();
  return loss.item();
}
}  // namespace

TEST_CASE("fp8: a huge activation is absorbed by the scales within the history window, without NaN") {
  using P = Delayed4;
  constexpr std::int64_t n = 16;
  Context<host> ctx;
  nn::Model<P, host, Mlp3<P, host>> model(ctx, {.max_batch = n, .seed = 6});
  optim::Adam<P, host> opt(model.parameters(), {.lr = 1e-3f});
  const auto x = exact_inputs(n * 6, 44);
  std::vector<float> huge(x);
  for (float& v : huge) v *= 1000.0f;
  std::vector<std::int32_t> labels(n);
  for (std::int64_t r = 0; r < n; ++r) labels[r] = static_cast<std::int32_t>(r % 3);
  const auto input_scale = [&] { return download(ctx, Span<const float>(model.parameters().fp8().scale_values()))[0]; };
  std::vector<float> scales, losses;
  for (int step = 0; step < 12; ++step) {
    losses.push_back(train_step(ctx, model, opt, step == 5 ? huge : x, labels));
    scales.push_back(input_scale());
  }
  for (float l : losses) CHECK(std::isfinite(l));
  for (const auto& v : model.parameters().get_values(0)) REQUIRE(std::isfinite(v));
  CHECK(opt.scaler().stats().skipped == 0);
  // Before: 448 / amax / 2 (margin 1); the huge step's amax holds the scale down for 4 updates, then it leaves.
  CHECK(scales[4] == doctest::Approx(scales[3]));
  CHECK(scales[5] == doctest::Approx(scales[4] / 1000).epsilon(0.01));
  for (int s = 6; s <= 8; ++s) CHECK(scales[s] == scales[5]);
  CHECK(scales[9] == doctest::Approx(scales[4]).epsilon(0.01));
}

TEST_CASE("fp8: exact resume across a wrapped history; checkpoints convert to and from O2-bf16") {
  const std::string path = (std::filesystem::temp_directory_path() / ("amp-fp8-" + std::to_string(::getpid()) + ".ckpt")).string();
  constexpr std::int64_t n = 8;
  const auto x = exact_inputs(n * 6, 45);
  std::vector<std::int32_t> labels(n);
  for (std::int64_t r = 0; r < n; ++r) labels[r] = static_cast<std::int32_t>((r * 2) % 3);
  Context<host> ctx;
  const auto train = [&](auto& model, auto& opt, int steps) {
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(train_step(ctx, model, opt, x, labels));
    return losses;
  };
  using P = Delayed4;
  using M = nn::Model<P, host, Mlp3<P, host>>;
  M straight(ctx, {.max_batch = n, .seed = 8}), first(ctx, {.max_batch = n, .seed = 8}), resumed(ctx, {.max_batch = n, .seed = 8});
  optim::AdamW<P, host> o1(straight.parameters(), {.lr = 0.01f}), o2(first.parameters(), {.lr = 0.01f}),
      o3(resumed.parameters(), {.lr = 0.01f});
  const auto all = train(straight, o1, 9);
  train(first, o2, 3);
  io::save(path, first, o2);
  io::load(path, resumed, o3);
  const auto rest = train(resumed, o3, 6);
  CHECK(std::vector<float>(all.begin() + 3, all.end()) == rest);  // bit for bit, past the 4-step window
  CHECK(download(ctx, Span<const float>(resumed.parameters().fp8().scale_values())) ==
        download(ctx, Span<const float>(straight.parameters().fp8().scale_values())));

  // O2-fp8 -> O2-bf16: the FP8 state is left behind; O2-bf16 -> O2-fp8: it starts afresh.
  nn::Model<O2BF16Policy, host, Mlp3<O2BF16Policy, host>> bf16(ctx, {.max_batch = n, .seed = 2});
  optim::AdamW<O2BF16Policy, host> ob(bf16.parameters(), {.lr = 0.01f});
  io::load(path, bf16, ob);
  CHECK(bf16.parameters().get_values(0) == first.parameters().get_values(0));
  io::save(path, bf16, ob);
  io::load(path, resumed, o3);
  CHECK(download(ctx, Span<const float>(resumed.parameters().fp8().scale_values())) == std::vector<float>(9, 1.0f));
  std::remove(path.c_str());
}

namespace {
// Delayed4's name with another history length: its checkpoints look alike but do not fit.
struct Delayed8 : O2FP8Policy {
  using fp8 = Fp8<DelayedScaling<8, 1>, fp8_e4m3, fp8_e5m2, 0, 0>;
  static constexpr std::string_view name = Delayed4::name;
};
}  // namespace

TEST_CASE("fp8: a checkpoint whose FP8 state does not fit is refused by name, and nothing changes") {
  const std::string path = (std::filesystem::temp_directory_path() / ("amp-fp8-bad-" + std::to_string(::getpid()) + ".ckpt")).string();
  constexpr std::int64_t n = 8;
  const auto x = exact_inputs(n * 6, 46);
  std::vector<std::int32_t> labels(n, 1);
  Context<host> ctx;
  nn::Model<Delayed4, host, Mlp3<Delayed4, host>> saved(ctx, {.max_batch = n, .seed = 3});
  optim::AdamW<Delayed4, host> o1(saved.parameters(), {.lr = 0.01f});
  for (int s = 0; s < 2; ++s) train_step(ctx, saved, o1, x, labels);
  io::save(path, saved, o1);
  const auto error = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Another history length under the same policy name: the history's shape names the mismatch.
  nn::Model<Delayed8, host, Mlp3<Delayed8, host>> other(ctx, {.max_batch = n, .seed = 4});
  optim::AdamW<Delayed8, host> o2(other.parameters(), {.lr = 0.01f});
  const auto before = other.parameters().get_values(0);
  CHECK(error([&] { io::load(path, other, o2); }).find("tensor 'fp8.history' is fp32 of 2 dimensions that do not match the model's [9x8]") != std::string::npos);
  CHECK(other.parameters().get_values(0) == before);
  // A ring position outside the history.
  io::Archive a = io::Archive::read(path);
  a.put_int64("fp8.position", {4});
  io::write_file(path, a.serialize());
  nn::Model<Delayed4, host, Mlp3<Delayed4, host>> fresh(ctx, {.max_batch = n, .seed = 5});
  optim::AdamW<Delayed4, host> o3(fresh.parameters(), {.lr = 0.01f});
  const auto weights = fresh.parameters().get_values(0);
  CHECK(error([&] { io::load(path, fresh, o3); }).find("has FP8 scales but no 'fp8.position' record of one value in [0, 4)") != std::string::npos);
  CHECK(fresh.parameters().get_values(0) == weights);
  CHECK(download(ctx, Span<const float>(fresh.parameters().fp8().scale_values())) == std::vector<float>(9, 1.0f));
  std::remove(path.c_str());
}

TEST_CASE("fp8: a GPU without FP8 tensor cores is refused by name, with the level to use instead") {
  const auto a100 = unsupported_reason<O2FP8Policy>({"NVIDIA A100-SXM4-80GB", 8, 0});
  REQUIRE(a100);
  CHECK(a100->find("policy O2-fp8 needs FP8 tensor cores (compute capability 8.9+, Ada or Hopper), but GPU "
                   "'NVIDIA A100-SXM4-80GB' has compute capability 8.0; use amp::O2BF16Policy") != std::string::npos);
  const auto v100 = unsupported_reason<O2FP8Policy>({"Tesla V100", 7, 0});
  REQUIRE(v100);
  CHECK(v100->find("use amp::O0Policy") != std::string::npos);
  CHECK(!unsupported_reason<O2FP8Policy>({"NVIDIA H200", 9, 0}));
  CHECK(!unsupported_reason<O2FP8Policy>({"NVIDIA GeForce RTX 4090", 8, 9}));
}
