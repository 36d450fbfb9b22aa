#pragma once
// Causal multi-head self-attention over [batch, time, features]:
//   qkv = x W_qkv^T + b;  per head: S = Q K^T / sqrt(d);  P = softmax(S, causal);
//   Y = dropout(P) V;  y = merge(Y) W_proj^T + b.
// Two kernels compute the heads. Fused (the default where the backend has it,
// backend/attention.hpp): flash attention's online fp32 softmax, O(T) kept
// per head, P recomputed in backward (cuDNN's deterministic backward still
// takes a T x T workspace per head on Hopper); it reads Q, K, V in place from the packed
// qkv [batch, time, 3, heads, dim], writes the heads' outputs merged into y
// [batch, time, heads, dim] and dQ, dK, dV into dqkv (strided views, no
// copies: one launch a pass, two when dqkv already holds a gradient to add
// to). Materialised (the reference, and the GPU's path where cuDNN has no
// engine or fp32 runs): Q K^T and P V are strided-batched
// GEMMs over (batch x heads) in the GEMM type with fp32 accumulation; the
// 1/sqrt(d) scale is the GEMM's alpha, the scores come out in
// compute_type<op::softmax> (fp32 under O1/O2), the softmax applies the causal
// mask and the dropout in one pass in that type and rounds P once into the
// GEMM type; P (and dropout(P)) are T x T per head, kept for backward.
// Both draw the same dropout bits. Generation (nn/generate.hpp) continues
// sequences from a key/value cache: the materialised path over the cached
// keys, n x (start + n) scores per head, no backward.
#include <cmath>
#include <string>
#include <type_traits>

#include "amp/backend/attention.hpp"
#include "amp/model/init.hpp"
#include "amp/nn/linear.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/ops.hpp"
#if defined(__CUDACC__)
#include "amp/backend/cuda/attention.cuh"  // cuDNN's SDPA; its frontend is heavy: only attention's users parse it
#endif

namespace amp::nn {

namespace detail {
// Where [batch, time, heads x dim] (a column block of a wider row) meets
// [batch, heads, time, dim] (contiguous per head, what the batched GEMMs take),
// for the materialised and cached paths. The per-head side may hold several
// such blocks one after another (qkv's Q, K, V: parts of heads x dim columns
// each), element by element: neighbouring items touch neighbouring values on
// both sides, so a GPU's loads and stores coalesce.
struct HeadLayout {
  std::int64_t batch, time, heads, dim;
  std::int64_t row_stride, column;  // of the [batch, time, ...] side: its row length, the first block's first column

  // Where element i of the per-head layout ([part, batch, heads, time, dim]) sits in the [batch, time, ...] layout.
  AMP_HOST_DEVICE std::int64_t rows_offset(std::int64_t i) const {
    const std::int64_t e = i % dim, q = i / dim;
    const std::int64_t t = q % time, h = q / time % heads, bp = q / (time * heads);
    return (bp % batch * time + t) * row_stride + column + (bp / batch * heads + h) * dim + e;
  }
};

// Per-head element i = its value in the rows layout. With to_time > 0 the
// per-head side holds to_time rows per head and row t goes to row to_start + t
// of its head (a key/value cache).
template <class From, class To>
struct ToHeadsOp {
  const From* from;
  To* to;
  HeadLayout l;
  std::int64_t to_time = 0, to_start = 0;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    const auto j = static_cast<std::int64_t>(i);
    const std::int64_t q = j / l.dim;
    const std::int64_t at = to_time > 0 ? ((q / l.time) * to_time + to_start + q % l.time) * l.dim + j % l.dim : j;
    to[at] = cast<To>(cast<float>(from[l.rows_offset(j)]));
  }
};

// Its value in the rows layout (+)= per-head element i: a merge forward, or a split's gradient.
template <class From, class To>
struct FromHeadsOp {
  const From* from;
  To* to;
  HeadLayout l;
  bool accumulate;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    store_grad(to, static_cast<std::size_t>(l.rows_offset(static_cast<std::int64_t>(i))), cast<float>(from[i]),
               accumulate);
  }
};

// The keep decision of attention dropout for entry j of row r (the same bits on
// every backend); key is the op's RandomStream key, read once per row.
AMP_HOST_DEVICE inline bool attention_keep(std::uint64_t key, std::int64_t row, std::int64_t time, std::int64_t j,
                                           float p) {
  return p == 0.0f || unit_uniform(key, static_cast<std::uint64_t>(row * time + j)) >= p;
}

// The fused kernels' Dropout (backend/attention.hpp): attention_keep's bits.
struct AttentionDropout {
  RandomStream stream;  // unread without dropout
  float p, keep_scale;
  std::int64_t time;
  AMP_HOST_DEVICE std::uint64_t key() const { return stream.key(); }
  AMP_HOST_DEVICE bool keep(std::uint64_t key, std::int64_t row, std::int64_t j) const {
    return attention_keep(key, row, time, j, p);
  }
};

// One row of scores (query t of one head): the causal softmax in C, rounded
// once into P; Pd = dropout(P). Entries after t are 0. A row op (backend/rows.hpp).
// Rows hold `keys` scores; query i of `time` sits at position offset + i (a
// key/value cache's queries follow the cached positions; training: keys = time, offset 0).
template <class C, class S, class G>
struct CausalSoftmaxOp {
  const S* scores;
  G* probs;
  G* dropped;  // == probs without dropout
  std::int64_t time;
  RandomStream stream;  // unread without dropout
  float p, keep_scale;
  std::int64_t keys = time, offset = 0;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const auto row = static_cast<std::int64_t>(r);
    const std::int64_t t = offset + row % time;
    const std::uint64_t key = p > 0.0f ? stream.key() : 0;
    const S* s = scores + row * keys;
    const float max = lanes.max(t + 1, [&](std::int64_t j) { return cast<float>(s[j]); });
    const float sum =
        lanes.sum(t + 1, [&](std::int64_t j) { return round_to<C>(amp::detail::exp_poly(cast<float>(s[j]) - max)); });
    const float inv = 1.0f / sum;
    G* out = probs + row * keys;
    G* out_dropped = dropped + row * keys;
    lanes.each(keys, [&](std::int64_t j) {
      const float v = j <= t ? round_to<C>(round_to<C>(amp::detail::exp_poly(cast<float>(s[j]) - max)) * inv) : 0.0f;
      out[j] = cast<G>(v);
      if (dropped != probs)
        out_dropped[j] = cast<G>(attention_keep(key, row, time, j, p) ? round_to<C>(v * keep_scale) : 0.0f);
    });
  }
};

// dS = P * (dP - sum_j dP_j P_j) for one row, dP through the dropout first (a row op).
template <class C, class G>
struct CausalSoftmaxGradOp {
  const float* d_dropped;  // dL/dPd
  const G* probs;
  G* d_scores;
  std::int64_t time;
  RandomStream stream;  // unread without dropout
  float p, keep_scale;
  AMP_HOST_DEVICE float d_prob(std::uint64_t key, std::int64_t row, std::int64_t j) const {
    const float g = d_dropped[row * time + j];
    return attention_keep(key, row, time, j, p) ? g * (p == 0.0f ? 1.0f : keep_scale) : 0.0f;
  }
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t r) const {
    const auto row = static_cast<std::int64_t>(r);
    const std::int64_t t = row % time;
    const std::uint64_t key = p > 0.0f ? stream.key() : 0;
    const G* pr = probs + row * time;
    const float dot = lanes.sum(t + 1, [&](std::int64_t j) { return d_prob(key, row, j) * cast<float>(pr[j]); });
    G* ds = d_scores + row * time;
    lanes.each(time, [&](std::int64_t j) {
      ds[j] = cast<G>(j <= t ? round_to<C>(cast<float>(pr[j]) * (d_prob(key, row, j) - dot)) : 0.0f);
    });
  }
};
}  // namespace detail

// One layer's key/value cache: keys and values [batch, heads, capacity, dim].
template <class G>
struct KVCacheView {
  G* keys = nullptr;
  G* values = nullptr;
  std::int64_t capacity = 0;
};

// Which kernel computes the heads: fused where the backend has one (else materialised), or materialised.
enum class attention_kernel { fused, materialized };

template <class P, class B>
class CausalSelfAttention {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::gemm>;
  using C = typename P::template compute_type<op::softmax>;
  // The scores leave the GEMM in the softmax's type where the GEMM can write it (fp32 or G).
  using S = std::conditional_t<std::is_same_v<C, float>, float, G>;

  struct Config {
    std::int64_t features = 0;  // heads x head dimension
    std::int64_t heads = 1;
    float dropout = 0.0f;       // on the attention probabilities, in training
    bool bias = true;
    initializer init = initializer::gpt2;  // normal(0, 0.02), zero biases: trains faster here than torch's
    attention_kernel kernel = attention_kernel::fused;
  };

  CausalSelfAttention(Builder<P, B> b, const Config& cfg)
      : name_(b.prefix()),
        qkv_(b.child("c_attn"), {.in_features = cfg.features, .out_features = 3 * cfg.features, .bias = cfg.bias,
                              .init = cfg.init}),
        proj_(b.child("c_proj"), {.in_features = cfg.features, .out_features = cfg.features, .bias = cfg.bias,
                                .init = cfg.init}) {
    AMP_REQUIRE(cfg.heads > 0 && cfg.features > 0 && cfg.features % cfg.heads == 0, "CausalSelfAttention '", name_,
                "': features (", cfg.features, ") must be a positive multiple of heads (", cfg.heads, ")");
    AMP_REQUIRE(cfg.dropout >= 0.0f && cfg.dropout < 1.0f, "CausalSelfAttention '", name_, "': dropout must be in [0, 1)");
    s_.features = cfg.features, s_.heads = cfg.heads, s_.dim = cfg.features / cfg.heads, s_.dropout = cfg.dropout;
    if constexpr (fused_attention<B>::value)
      s_.fused = cfg.kernel == attention_kernel::fused && s_.dim <= fused_attention<B>::max_dim &&
                 fused_attention<B>::template runs<G, T>;
  }

  // x: [batch, time, features] -> the same shape.
  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    g.require_current(x, "CausalSelfAttention '", name_, "'");
    AMP_REQUIRE(x.shape.rank() == 3 && x.shape[2] == s_.features, "CausalSelfAttention '", name_, "' (", s_.features,
                " features): input ", x.shape.str(), " is not [batch x time x ", s_.features, "]");
    return proj_(g, attend(g, s_, qkv_(g, x)));
  }

  // Inference with a key/value cache: x [batch, n, features] holds positions
  // start .. start + n - 1 of sequences whose earlier keys and values are in
  // `cache`; this call's are written there too. Evaluation mode (no backward).
  Var<T> operator()(Graph<P, B>& g, Var<T> x, const KVCacheView<G>& cache, std::int64_t start) const {
    g.require_current(x, "CausalSelfAttention '", name_, "'");
    AMP_REQUIRE(!g.training(), "CausalSelfAttention '", name_, "': a key/value cache is for evaluation mode");
    AMP_REQUIRE(x.shape.rank() == 3 && x.shape[2] == s_.features && start >= 0 && start + x.shape[1] <= cache.capacity,
                "CausalSelfAttention '", name_, "': input ", x.shape.str(), " at position ", start,
                " does not fit a cache of ", cache.capacity, " positions x ", s_.features, " features");
    return proj_(g, attend_cached(g, s_, qkv_(g, x), cache, start));
  }

 private:
  struct Spec {
    std::int64_t features = 0, heads = 1, dim = 1;
    float dropout = 0.0f;
    bool fused = false;
  };

  // The sizes of one call; n = batch x heads.
  struct Dims {
    std::int64_t batch, time, n;
    std::size_t per_head, scores, head_rows;
    Dims(const Spec& s, const Shape& qkv)
        : batch(qkv[0]), time(qkv[1]), n(batch * s.heads), per_head(static_cast<std::size_t>(n * time * s.dim)),
          scores(static_cast<std::size_t>(n * time * time)), head_rows(static_cast<std::size_t>(n * time)) {}
    // qkv's Q, K and V (parts 0, 1, 2), or all three one after another from `part`.
    detail::HeadLayout qkv_part(const Spec& s, int part) const {
      return {batch, time, s.heads, s.dim, 3 * s.features, part * s.features};
    }
    detail::HeadLayout merged(const Spec& s) const { return {batch, time, s.heads, s.dim, s.features, 0}; }
    // The fused kernels' view: Q, K, V in place in qkv, O and dO in the merged layout.
    AttentionShape packed(const Spec& s, float alpha) const {
      return {n, time, s.dim, alpha, s.heads, 3 * s.features, s.features};
    }
  };

  // What backward needs. Fused: the packed qkv in the GEMM type (the input
  // itself where activations are in it), the output y and the rows'
  // log-sum-exps, O(T). Materialised: Q, K, V per head, P and dropout(P), T x T.
  struct Saved {
    const G* qkv = nullptr;
    float* lse = nullptr;
    G *q = nullptr, *k = nullptr, *v = nullptr;
    G *probs = nullptr, *dropped = nullptr;
    detail::AttentionDropout drop{};
    float alpha = 1.0f;
  };

  // x in the GEMM type: x itself (every built-in policy), else a cast into graph scratch.
  static const G* in_gemm_type(Graph<P, B>& g, const T* x, std::size_t count) {
    if constexpr (std::is_same_v<T, G>) {
      return x;
    } else {
      G* c = g.template scratch<G>(count);
      convert(g.context(), Span<const T>(x, count), Span<G>(c, count));
      return c;
    }
  }

  // qkv [batch, time, 3 x features] -> the heads' outputs merged, [batch, time, features].
  static Var<T> attend(Graph<P, B>& g, const Spec& s, Var<T> qkv) {
    auto& ctx = g.context();
    const Dims d(s, qkv.shape);
    const float p = g.training() ? s.dropout : 0.0f;
    Saved sv;
    sv.drop = {p > 0.0f ? g.random_stream() : detail::RandomStream{}, p, 1.0f / (1.0f - p), d.time};
    sv.alpha = 1.0f / std::sqrt(static_cast<float>(s.dim));
    Var<T> y = g.template tensor<T>(Shape{d.batch, d.time, s.features});
    bool fused = s.fused;  // and the backend's library runs this shape (else the materialised path)
    if constexpr (fused_attention<B>::value)
      fused = fused && attention_available<G, T>(ctx, d.packed(s, sv.alpha), p);
    if (fused) {
      sv.qkv = in_gemm_type(g, qkv.data, qkv.size());
      sv.lse = g.template scratch<float>(d.head_rows);
      if constexpr (fused_attention<B>::value)
        attention_forward(ctx, d.packed(s, sv.alpha), sv.qkv, sv.qkv + s.features, sv.qkv + 2 * s.features, y.data,
                          sv.lse, sv.drop);
    } else {
      G* heads = g.template scratch<G>(3 * d.per_head);
      sv.q = heads, sv.k = heads + d.per_head, sv.v = heads + 2 * d.per_head;
      for_each(ctx, 3 * d.per_head, detail::ToHeadsOp<T, G>{qkv.data, heads, d.qkv_part(s, 0)});
      sv.probs = g.template scratch<G>(d.scores);
      sv.dropped = p > 0.0f ? g.template scratch<G>(d.scores) : sv.probs;
      Temporaries<P, B> temp(g);
      const std::int64_t time = d.time;
      S* sc = g.template scratch<S>(d.scores);
      const GemmBatch qk{d.n, time * s.dim, time * s.dim, time * time};
      gemm_batched(ctx, Matrix<const G>(sv.q, time, s.dim, s.dim), transpose::no,
                   Matrix<const G>(sv.k, time, s.dim, s.dim), transpose::yes, Matrix<S>(sc, time, time, time), qk,
                   sv.alpha);
      for_each_row(ctx, d.head_rows, time,
                   detail::CausalSoftmaxOp<C, S, G>{sc, sv.probs, sv.dropped, time, sv.drop.stream, p, sv.drop.keep_scale});
      T* heads_out = g.template scratch<T>(d.per_head);
      const GemmBatch pv{d.n, time * time, time * s.dim, time * s.dim};
      gemm_batched(ctx, Matrix<const G>(sv.dropped, time, time, time), transpose::no,
                   Matrix<const G>(sv.v, time, s.dim, s.dim), transpose::no, Matrix<T>(heads_out, time, s.dim, s.dim), pv);
      for_each(ctx, d.per_head, detail::FromHeadsOp<T, T>{heads_out, y.data, d.merged(s), false});
    }
    g.on_backward([=](Graph<P, B>& gb) { backward(gb, s, qkv, y, sv); });
    return y;
  }

  // The materialised path over the cache: per head, S = Q K[0, keys)^T is n x keys.
  static Var<T> attend_cached(Graph<P, B>& g, const Spec& s, Var<T> qkv, const KVCacheView<G>& c, std::int64_t start) {
    auto& ctx = g.context();
    const Dims d(s, qkv.shape);
    const std::int64_t n = d.time, keys = start + n;
    Var<T> y = g.template tensor<T>(Shape{d.batch, n, s.features}, false);
    Temporaries<P, B> temp(g);
    G* q = g.template scratch<G>(d.per_head);
    for_each(ctx, d.per_head, detail::ToHeadsOp<T, G>{qkv.data, q, d.qkv_part(s, 0)});
    for (int part = 1; part < 3; ++part)
      for_each(ctx, d.per_head,
               detail::ToHeadsOp<T, G>{qkv.data, part == 1 ? c.keys : c.values, d.qkv_part(s, part), c.capacity, start});
    const auto scores = static_cast<std::size_t>(d.n * n * keys);
    S* sc = g.template scratch<S>(scores);
    gemm_batched(ctx, Matrix<const G>(q, n, s.dim, s.dim), transpose::no, Matrix<const G>(c.keys, keys, s.dim, s.dim),
                 transpose::yes, Matrix<S>(sc, n, keys, keys), GemmBatch{d.n, n * s.dim, c.capacity * s.dim, n * keys},
                 1.0f / std::sqrt(static_cast<float>(s.dim)));
    G* probs = g.template scratch<G>(scores);
    for_each_row(ctx, d.head_rows, keys,
                 detail::CausalSoftmaxOp<C, S, G>{sc, probs, probs, n, {}, 0.0f, 1.0f, keys, start});
    T* heads_out = g.template scratch<T>(d.per_head);
    gemm_batched(ctx, Matrix<const G>(probs, n, keys, keys), transpose::no, Matrix<const G>(c.values, keys, s.dim, s.dim),
                 transpose::no, Matrix<T>(heads_out, n, s.dim, s.dim),
                 GemmBatch{d.n, n * keys, c.capacity * s.dim, n * s.dim});
    for_each(ctx, d.per_head, detail::FromHeadsOp<T, T>{heads_out, y.data, d.merged(s), false});
    return y;
  }

  static void backward(Graph<P, B>& g, const Spec& s, Var<T> qkv, Var<T> y, const Saved& sv) {
    const T* dy = g.grad(y);
    if (!dy) return;
    const GradOut<T> dqkv = g.grad_out(qkv);
    if (!dqkv) return;
    auto& ctx = g.context();
    const Dims d(s, qkv.shape);
    Temporaries<P, B> temp(g);
    if (sv.lse) {  // the forward ran fused: dQ, dK, dV straight into dqkv, unless it holds a gradient to add to
      const G* dout = in_gemm_type(g, dy, y.size());
      T* dst = dqkv.accumulate ? g.template scratch<T>(qkv.size()) : dqkv.data;
      if constexpr (fused_attention<B>::value)
        attention_backward(ctx, d.packed(s, sv.alpha), sv.qkv, sv.qkv + s.features, sv.qkv + 2 * s.features, y.data,
                           sv.lse, dout, dst, dst + s.features, dst + 2 * s.features, sv.drop);
      if (dqkv.accumulate) for_each(ctx, qkv.size(), detail::AddGradOp<T>{dst, dqkv.data, true});
      return;
    }
    G* dh = g.template scratch<G>(d.per_head);  // dY per head, in the GEMM type
    for_each(ctx, d.per_head, detail::ToHeadsOp<T, G>{dy, dh, d.merged(s)});
    const std::int64_t time = d.time;
    const Matrix<const G> dY(dh, time, s.dim, s.dim), Q(sv.q, time, s.dim, s.dim), K(sv.k, time, s.dim, s.dim),
        V(sv.v, time, s.dim, s.dim);
    const GemmBatch tt{d.n, time * s.dim, time * s.dim, time * time};  // [t x d] [t x d]^T -> [t x t]
    const GemmBatch td{d.n, time * time, time * s.dim, time * s.dim};  // [t x t] [t x d] -> [t x d]
    // dPd = dY V^T (fp32); dS = softmax'(dropout'(dPd)), in the GEMM type.
    float* d_dropped = g.template scratch<float>(d.scores);
    gemm_batched(ctx, dY, transpose::no, V, transpose::yes, Matrix<float>(d_dropped, time, time, time), tt);
    G* ds = g.template scratch<G>(d.scores);
    for_each_row(ctx, d.head_rows, time,
                 detail::CausalSoftmaxGradOp<C, G>{d_dropped, sv.probs, ds, time, sv.drop.stream, sv.drop.p,
                                                   sv.drop.keep_scale});
    // dQ = alpha dS K, dK = alpha dS^T Q, dV = Pd^T dY, per head one after another, then into dqkv in one pass.
    const Matrix<const G> dS(ds, time, time, time), Pd(sv.dropped, time, time, time);
    T* d_parts = g.template scratch<T>(3 * d.per_head);
    const auto part = [&](std::size_t i) { return Matrix<T>(d_parts + i * d.per_head, time, s.dim, s.dim); };
    gemm_batched(ctx, dS, transpose::no, K, transpose::no, part(0), td, sv.alpha);
    gemm_batched(ctx, dS, transpose::yes, Q, transpose::no, part(1), td, sv.alpha);
    gemm_batched(ctx, Pd, transpose::yes, dY, transpose::no, part(2), td);
    for_each(ctx, 3 * d.per_head, detail::FromHeadsOp<T, T>{d_parts, dqkv.data, d.qkv_part(s, 0), dqkv.accumulate});
  }

  std::string name_;
  Linear<P, B> qkv_, proj_;
  Spec s_;
};

}  // namespace amp::nn
