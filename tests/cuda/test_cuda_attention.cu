// CUDA twins of the attention backend: cuDNN's fused attention against the
// host's fused kernel, forward, backward and dropout, contiguous and on the
// layer's strided views; the layer's launches on the GPU; and (its only CUDA
// twin file at hand) FP8's tiled cast-with-transpose against the host's row
// loop, bit for bit. Without a GPU (or without cuDNN's frontend) each case skips.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "amp/transformer.hpp"
#include "support/attention_launches.hpp"
#include "support/backend_values.hpp"
#include "support/gpu.cuh"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

namespace {
// Attention dropout for the backend twins: none, or p with a fixed key (read on the device).
struct TestDropout {
  float p = 0.0f, keep_scale = 1.0f;
  std::uint64_t k = 0;
  std::int64_t time = 1;
  __host__ __device__ std::uint64_t key() const { return k; }
  __host__ __device__ bool keep(std::uint64_t key, std::int64_t row, std::int64_t j) const {
    return nn::detail::attention_keep(key, row, time, j, p);
  }
};
}  // namespace

// Built without cuDNN's frontend, the GPU has no fused attention (the layer takes the materialised path).
#define AMP_REQUIRE_CUDNN_FRONTEND()                                                                     \
  do {                                                                                                   \
    if (!amp::fused_attention<amp::cuda>::value) {                                                       \
      std::cout << "[amp-skip] built without cuDNN's frontend (cudnn_frontend.h): no fused attention"  \
                << std::endl;                                                                            \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)

TEST_CASE_TEMPLATE("cuda: cuDNN's fused attention matches the host's fused kernel, forward and backward", G, half,
                   amp::bfloat16) {
  AMP_REQUIRE_GPU();
  AMP_REQUIRE_CUDNN_FRONTEND();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  std::uint32_t seed = 40;
  for (const AttentionShape s : {AttentionShape{6, 64, 64, 0.125f}, AttentionShape{4, 200, 128, 0.0883883f},
                                 AttentionShape{3, 33, 32, 0.1767767f}, AttentionShape{2, 17, 16, 0.25f}}) {
    CAPTURE(s.heads);
    CAPTURE(s.time);
    CAPTURE(s.dim);
    REQUIRE(attention_available<G, G>(ctx, s, 0.0f));
    const auto n = static_cast<std::size_t>(s.heads * s.time * s.dim), rows = static_cast<std::size_t>(s.heads * s.time);
    const auto q = random_values<G>(n, seed++), k = random_values<G>(n, seed++), v = random_values<G>(n, seed++),
               dout = random_values<G>(n, seed++);
    const TestDropout none{};
    std::vector<G> out(n), dq(n), dk(n), dv(n);
    std::vector<float> lse(rows);
    attention_forward(hctx, s, q.data(), k.data(), v.data(), out.data(), lse.data(), none);
    attention_backward(hctx, s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                       dv.data(), none);

    const auto dev_q = on_backend(ctx, q), dev_k = on_backend(ctx, k), dev_v = on_backend(ctx, v),
               dev_dout = on_backend(ctx, dout);
    Buffer<G, amp::cuda> o(ctx, n, memory_kind::workspace), gq(ctx, n, memory_kind::workspace),
        gk(ctx, n, memory_kind::workspace), gv(ctx, n, memory_kind::workspace);
    Buffer<float, amp::cuda> l(ctx, rows, memory_kind::workspace);
    attention_forward(ctx, s, dev_q.data(), dev_k.data(), dev_v.data(), o.data(), l.data(), none);
    attention_backward(ctx, s, dev_q.data(), dev_k.data(), dev_v.data(), o.data(), l.data(), dev_dout.data(), gq.data(),
                       gk.data(), gv.data(), none);
    // cuDNN rounds P and dS to G before its GEMMs (flash attention does), the host keeps them in fp32:
    // normwise, a few units of G's rounding; a wrong scale, mask or layout is off by O(1).
    const auto normwise = [](const std::vector<double>& got, const std::vector<double>& ref) {
      double err = 0, norm = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) err += (got[i] - ref[i]) * (got[i] - ref[i]), norm += ref[i] * ref[i];
      return std::sqrt(err / norm);
    };
    const double tol = 8 * unit_roundoff<G>;
    CHECK(normwise(values_of(ctx, o), to_double(out)) <= tol);
    CHECK(worst_error_ratio(values_of(ctx, l), to_double(lse), 1e-4, 1e-4) <= 1.0);
    CHECK(normwise(values_of(ctx, gq), to_double(dq)) <= tol);
    CHECK(normwise(values_of(ctx, gk), to_double(dk)) <= tol);
    CHECK(normwise(values_of(ctx, gv), to_double(dv)) <= tol);
  }
}

// With V = I the forward's output is dropout(P) itself, and with dO = I the
// backward's dV is its transpose: both passes must drop the same entries, at rate p.
TEST_CASE("cuda: cuDNN attention dropout: forward and backward drop the same entries, at rate p, per key") {
  AMP_REQUIRE_GPU();
  AMP_REQUIRE_CUDNN_FRONTEND();
  using G = amp::bfloat16;
  Context<amp::cuda> ctx;
  const AttentionShape s{4, 64, 64, 0.125f};
  const float p = 0.2f;
  REQUIRE(attention_available<G, G>(ctx, s, p));
  const auto n = static_cast<std::size_t>(s.heads * s.time * s.dim);
  std::vector<G> eye(n);
  for (std::size_t i = 0; i < n; ++i) eye[i] = cast<G>(i / s.dim % s.time == i % s.dim ? 1.0f : 0.0f);
  const auto dev_q = on_backend(ctx, random_values<G>(n, 7)), dev_k = on_backend(ctx, random_values<G>(n, 8)),
             dev_eye = on_backend(ctx, eye);
  Buffer<G, amp::cuda> o(ctx, n, memory_kind::workspace), gq(ctx, n, memory_kind::workspace),
      gk(ctx, n, memory_kind::workspace), gv(ctx, n, memory_kind::workspace);
  Buffer<float, amp::cuda> l(ctx, static_cast<std::size_t>(s.heads * s.time), memory_kind::workspace);
  std::vector<std::vector<double>> masks;
  for (const std::uint64_t key : {11ull, 11ull, 12ull}) {
    const TestDropout drop{p, 1.0f / (1.0f - p), key, s.time};
    attention_forward(ctx, s, dev_q.data(), dev_k.data(), dev_eye.data(), o.data(), l.data(), drop);
    attention_backward(ctx, s, dev_q.data(), dev_k.data(), dev_eye.data(), o.data(), l.data(), dev_eye.data(), gq.data(),
                       gk.data(), gv.data(), drop);
    const auto pd = values_of(ctx, o), pd_t = values_of(ctx, gv);
    std::size_t causal = 0, dropped = 0, disagree = 0;
    double worst = 0;
    std::vector<double> mask;
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t t = 0; t < s.time; ++t)
        for (std::int64_t j = 0; j <= t; ++j) {
          const double fwd = pd[static_cast<std::size_t>((h * s.time + t) * s.dim + j)];
          const double bwd = pd_t[static_cast<std::size_t>((h * s.time + j) * s.dim + t)];
          ++causal;
          dropped += fwd == 0.0;
          disagree += (fwd == 0.0) != (bwd == 0.0);
          if (fwd != 0.0) worst = std::max(worst, std::abs(fwd - bwd) / std::abs(fwd));
          mask.push_back(fwd == 0.0);
        }
    CHECK(disagree == 0);
    CHECK(worst <= 4 * unit_roundoff<G>);
    CHECK(std::abs(static_cast<double>(dropped) / static_cast<double>(causal) - p) <= 0.03);
    masks.push_back(mask);
  }
  CHECK(masks[0] == masks[1]);  // the same key: the same entries
  CHECK(masks[0] != masks[2]);  // another key: others
}

// The layer's views: Q, K, V read in place from a packed [batch, time, 3, heads,
// dim] buffer, O and dO in the merged rows, dQ, dK, dV written into the packed
// gradient. cuDNN on those strides against the host's kernel on contiguous heads.
TEST_CASE_TEMPLATE("cuda: cuDNN's fused attention on strided views into packed qkv matches the host's", G, half,
                   amp::bfloat16) {
  AMP_REQUIRE_GPU();
  AMP_REQUIRE_CUDNN_FRONTEND();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  constexpr std::int64_t batch = 2, heads = 3, time = 70, dim = 64, features = heads * dim;
  const float alpha = 0.125f;
  const AttentionShape flat{batch * heads, time, dim, alpha};
  const AttentionShape packed{batch * heads, time, dim, alpha, heads, 3 * features, features};
  REQUIRE(attention_available<G, G>(ctx, packed, 0.0f));
  const auto n = static_cast<std::size_t>(batch * heads * time * dim);
  std::vector<std::vector<G>> parts;  // q, k, v, dO per head
  for (std::uint32_t i = 0; i < 4; ++i) parts.push_back(random_values<G>(n, 60 + i));
  const auto at = [&](std::size_t i, std::int64_t stride) {
    const auto j = static_cast<std::int64_t>(i);
    return static_cast<std::size_t>(packed.head_start(j / (time * dim), stride) + j / dim % time * stride + j % dim);
  };
  std::vector<G> qkv(3 * n), dout(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t part = 0; part < 3; ++part) qkv[at(i, 3 * features) + part * features] = parts[part][i];
    dout[at(i, features)] = parts[3][i];
  }
  const TestDropout none{};
  std::vector<G> out(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(n / dim);
  attention_forward(hctx, flat, parts[0].data(), parts[1].data(), parts[2].data(), out.data(), lse.data(), none);
  attention_backward(hctx, flat, parts[0].data(), parts[1].data(), parts[2].data(), out.data(), lse.data(),
                     parts[3].data(), dq.data(), dk.data(), dv.data(), none);

  const auto dev_qkv = on_backend(ctx, qkv), dev_dout = on_backend(ctx, dout);
  Buffer<G, amp::cuda> o(ctx, n, memory_kind::workspace), dqkv(ctx, 3 * n, memory_kind::workspace);
  Buffer<float, amp::cuda> l(ctx, n / dim, memory_kind::workspace);
  const G* base = dev_qkv.data();
  attention_forward(ctx, packed, base, base + features, base + 2 * features, o.data(), l.data(), none);
  attention_backward(ctx, packed, base, base + features, base + 2 * features, o.data(), l.data(), dev_dout.data(),
                     dqkv.data(), dqkv.data() + features, dqkv.data() + 2 * features, none);
  const auto got_o = values_of(ctx, o), got_d = values_of(ctx, dqkv);
  std::vector<double> o_heads(n), d_heads[3] = {std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    o_heads[i] = got_o[at(i, features)];
    for (std::size_t part = 0; part < 3; ++part) d_heads[part][i] = got_d[at(i, 3 * features) + part * features];
  }
  const auto normwise = [](const std::vector<double>& got, const std::vector<double>& ref) {
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) err += (got[i] - ref[i]) * (got[i] - ref[i]), norm += ref[i] * ref[i];
    return std::sqrt(err / norm);
  };
  const double tol = 8 * unit_roundoff<G>;
  CHECK(normwise(o_heads, to_double(out)) <= tol);
  CHECK(worst_error_ratio(values_of(ctx, l), to_double(lse), 1e-4, 1e-4) <= 1.0);
  CHECK(normwise(d_heads[0], to_double(dq)) <= tol);
  CHECK(normwise(d_heads[1], to_double(dk)) <= tol);
  CHECK(normwise(d_heads[2], to_double(dv)) <= tol);
}

// On the GPU the fused layer is cuDNN's kernel alone each pass (was 5 and 5:
// three head splits and a merge forward, a split and three merges backward),
// plus one launch for Philox's seed where dropout is on.
TEST_CASE("cuda: the fused attention layer launches cuDNN's kernel alone, one a pass (and dropout's seed)") {
  AMP_REQUIRE_GPU();
  AMP_REQUIRE_CUDNN_FRONTEND();
  using P = O2BF16Policy;
  Context<amp::cuda> ctx;
  for (const float dropout : {0.0f, 0.1f}) {
    CAPTURE(dropout);
    const AttentionConfig cfg{.features = 128, .heads = 2, .dropout = dropout};
    const Launches linears = launches_per_step<P, ItsLinears<P, amp::cuda>>(ctx, cfg, 64);
    const Launches fused = launches_per_step<P, AttentionAlone<P, amp::cuda>>(ctx, cfg, 64);
    const std::size_t seed = dropout > 0.0f ? 1 : 0;
    CHECK(fused.forward - linears.forward == 1 + seed);
    CHECK(fused.backward - linears.backward == 1 + seed);
  }
}

// FP8's cast with a transpose: the GPU's 32 x 32 tiles (backend/cuda/cast_transposed.cuh)
// against the host's row loop, codes, transposed codes and the recorded amax bit for
// bit, on shapes that are no multiple of a tile, and one past a block's column chunk.
TEST_CASE_TEMPLATE("cuda: the FP8 cast's tiled transpose writes the host's codes bit for bit", F, amp::fp8_e4m3,
                   amp::fp8_e5m2) {
  AMP_REQUIRE_GPU();
  Context<amp::cuda> ctx;
  Context<host> hctx;
  const struct {
    std::int64_t rows, cols;
  } shapes[] = {{45, 70}, {70, 45}, {33, 1100}, {1, 1}};
  for (const auto& sh : shapes) {
    CAPTURE(sh.rows);
    CAPTURE(sh.cols);
    const auto count = static_cast<std::size_t>(sh.rows * sh.cols);
    auto x = random_values<amp::bfloat16>(count, static_cast<std::uint32_t>(sh.rows + sh.cols), -300.0f, 300.0f);
    if (count > 20) x[7] = cast<amp::bfloat16>(INFINITY), x[19] = cast<amp::bfloat16>(-1e30f);  // NaN code; saturated
    const std::vector<float> meta_start = {2.0f, 1.5f, 1.0f / 1.5f};  // amax so far, scale, scale_inv
    std::vector<float> meta_host = meta_start;
    std::vector<F> codes(count), codes_t(count);
    const std::size_t host_before = hctx.counters().launches;
    nn::fp8_cast<DelayedScaling<>>(hctx, x.data(), sh.rows, sh.cols, codes.data(), codes_t.data(),
                                   nn::Fp8Meta{&meta_host[0], &meta_host[1], &meta_host[2]}, true);
    hctx.synchronize();
    const std::size_t host_launches = hctx.counters().launches - host_before;

    const auto dev_x = on_backend(ctx, x);
    auto meta = on_backend(ctx, meta_start);
    Buffer<F, amp::cuda> dev_codes(ctx, count, memory_kind::workspace), dev_codes_t(ctx, count, memory_kind::workspace);
    const std::size_t before = ctx.counters().launches;
    nn::fp8_cast<DelayedScaling<>>(ctx, dev_x.data(), sh.rows, sh.cols, dev_codes.data(), dev_codes_t.data(),
                                   nn::Fp8Meta{meta.data(), meta.data() + 1, meta.data() + 2}, true);
    CHECK(ctx.counters().launches - before == host_launches);  // the same decisions, the same count
    const auto got = download(ctx, Span<const F>(dev_codes.data(), count)),
               got_t = download(ctx, Span<const F>(dev_codes_t.data(), count));
    std::size_t wrong = 0, wrong_t = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += got[i].__x != codes[i].__x, wrong_t += got_t[i].__x != codes_t[i].__x;
    CHECK(wrong == 0);
    CHECK(wrong_t == 0);
    CHECK(download(ctx, Span<const float>(meta.data(), 1))[0] == meta_host[0]);
  }
}
