// CUDA twins of the attention backend: cuDNN's fused attention against the
// host's fused kernel, forward, backward and dropout. Without a GPU (or
// without cuDNN's frontend) each case skips.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "amp/transformer.hpp"
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
