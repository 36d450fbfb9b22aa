#pragma once
// Token embedding with an optional learned positional embedding, and the
// output projection tied to the token table (GPT-2's logits = h W_tok^T):
// both uses add into the one gradient. Token ids are int32 in [0, vocab); on
// the host an id outside is an amp::Error, on the GPU its row reads as zeros.
// The table's gradient groups the batch's rows by token id (a stable sort,
// backend/groups.hpp) and sums each group per column in row order in fp32,
// rounded once: deterministic on every backend (the same bits on each), in
// memory proportional to the batch's tokens, not to the vocabulary. Rows are
// read in runs (backend/rows.hpp): a warp or block per row on a GPU.
#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

#include "amp/backend/gemm.hpp"
#include "amp/backend/groups.hpp"
#include "amp/backend/rows.hpp"
#include "amp/model/init.hpp"
#include "amp/model/model.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/nn/ops.hpp"
#include "amp/model/graph_hooks.hpp"

namespace amp::nn {

namespace detail {
// Row r of y: table[id[r]] + positions[offset + r % time], in fp32, rounded
// once; a row op (backend/rows.hpp) reading and writing in runs.
template <class W, class T>
struct EmbedOp {
  const std::int32_t* ids;
  const W* table;
  const W* positions;  // nullptr: none
  std::int64_t vocab, features, time;
  T* y;
  std::int64_t offset = 0;  // the position of the first id (generation continues a sequence)
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t i) const {
    const auto r = static_cast<std::int64_t>(i);
    const std::int32_t id = ids[r];
    const W* token = id >= 0 && id < vocab ? table + static_cast<std::int64_t>(id) * features : nullptr;
    const W* position = positions ? positions + (offset + r % time) * features : nullptr;
    each_run(lanes, features, [&](std::int64_t c, std::int64_t len) {
      float v[run_length] = {}, p[run_length];
      if (token) load_run(token + c, len, v);
      if (position) {
        load_run(position + c, len, p);
        for (int j = 0; j < run_length; ++j) v[j] += p[j];
      }
      store_run(y + r * features + c, len, v);
    });
  }
};

// The table's gradient for group g: dy summed over the rows of the group's
// token id, per column in row order, in fp32, then added to the gradient,
// rounded once. A row op per group, a run of columns per lane (16-byte
// loads of dy's rows). Groups past the count do nothing (the count is on the
// device); ids outside [0, vocab) add nothing.
template <class T, class GW>
struct EmbedGradOp {
  KeyGroups groups;
  const T* dy;
  std::int64_t vocab, features;
  GW* grad;
  template <class Lanes>
  AMP_HOST_DEVICE void operator()(const Lanes& lanes, std::size_t i) const {
    const auto g = static_cast<std::int64_t>(i);
    if (g >= *groups.count) return;
    const std::int32_t id = groups.keys[g];
    if (id < 0 || id >= vocab) return;
    const std::int32_t first = groups.offsets[g], last = groups.offsets[g + 1];
    GW* out = grad + static_cast<std::int64_t>(id) * features;
    each_run(lanes, features, [&](std::int64_t c, std::int64_t len) {
      float acc[run_length] = {}, v[run_length];
      for (std::int32_t k = first; k < last; ++k) {
        load_run(dy + static_cast<std::int64_t>(groups.rows[k]) * features + c, len, v);
        for (int j = 0; j < run_length; ++j) acc[j] += v[j];
      }
      load_run(out + c, len, v);
      for (int j = 0; j < run_length; ++j) v[j] += acc[j];
      store_run(out + c, len, v);
    });
  }
};

// grad[id] += dy's rows of that id, from group_by_key's groups of `rows` ids.
// On a GPU a group takes a block once its row has more runs than a warp has
// lanes: a frequent token's many rows then cost each lane one run's loop.
template <class B, class T, class GW>
void add_embedding_grad(Context<B>& ctx, KeyGroups groups, const T* dy, std::size_t rows, std::int64_t vocab,
                        std::int64_t features, GW* grad) {
  const bool wide = (features + run_length - 1) / run_length > 32;
  for_each_row(ctx, rows, wide ? std::max(features, block_row_width) : features,
               EmbedGradOp<T, GW>{groups, dy, vocab, features, grad});
}

// positions' gradient[t, c] += sum over the batch of dy[b, t, c].
template <class T, class GW>
struct PositionGradOp {
  const T* dy;
  std::int64_t batch, time, features;
  GW* grad;
  AMP_HOST_DEVICE void operator()(std::size_t i) const {
    float acc = 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) acc += cast<float>(dy[b * time * features + static_cast<std::int64_t>(i)]);
    grad[i] = cast<GW>(cast<float>(grad[i]) + acc);
  }
};
}  // namespace detail

template <class P, class B>
class Embedding {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  using W = typename P::param_type;
  using G = typename P::template compute_type<op::gemm>;
  using GW = typename P::grad_type;

  struct Config {
    std::int64_t vocab = 0;
    std::int64_t features = 0;
    std::int64_t max_positions = 0;  // > 0: a learned positional embedding for that many positions
    float init_std = 0.02f;          // normal(0, init_std), as GPT-2
  };

  // The tables are "<prefix>weight" and "<prefix>positions".
  Embedding(Builder<P, B> b, const Config& cfg) : Embedding(b, b, "positions", cfg) {}
  // The position table a module of its own: "<positions' prefix>weight" (GPT-2's wte and wpe).
  Embedding(Builder<P, B> tokens, Builder<P, B> positions, const Config& cfg)
      : Embedding(tokens, positions, "weight", cfg) {}

  // ids [batch, time] -> [batch, time, features]; with positions, the ids
  // sit at positions start .. start + time - 1 (generation continues a sequence).
  Var<T> operator()(Graph<P, B>& g, Var<std::int32_t> ids, std::int64_t start = 0) const {
    AMP_REQUIRE(ids.shape.rank() == 2 && start >= 0 && (s_.max_positions == 0 || start + ids.shape[1] <= s_.max_positions),
                "Embedding '", name_, "': ids ", ids.shape.str(), " from position ", start,
                " are not [batch x time] within ", s_.max_positions, " positions");
    if constexpr (std::is_same_v<B, host>) {
      if (!g.planning())
        for (std::size_t i = 0; i < ids.size(); ++i)
          AMP_REQUIRE(ids.data[i] >= 0 && ids.data[i] < s_.vocab, "Embedding '", name_, "': token id ", ids.data[i],
                      " at position ", i, " is outside [0, ", s_.vocab, ")");
    }
    g.params().visit_layer(s_.table.index);
    Var<T> y = forward(g, s_, ids, start);
    observe_layer(g, y, name_, "embedding");
    return y;
  }

  // The tied output projection: h [.., features] -> logits [.., vocab] = h W^T.
  Var<T> logits(Graph<P, B>& g, Var<T> h) const {
    g.require_current(h, "Embedding '", name_, "'.logits");
    g.params().visit_layer(s_.table.index);
    AMP_REQUIRE(h.shape.rank() >= 1 && h.cols() == s_.features, "Embedding '", name_, "': logits of ", h.shape.str(),
                ", which does not end in ", s_.features, " features");
    return project(g, s_, h);
  }

  Param<role::weight> weight() const { return s_.table; }

 private:
  Embedding(Builder<P, B> b, Builder<P, B> pb, const char* positions_name, const Config& cfg) : name_(b.prefix()) {
    AMP_REQUIRE(cfg.vocab > 0 && cfg.features > 0 && cfg.max_positions >= 0 && cfg.init_std >= 0, "Embedding '",
                name_, "': need vocab > 0, features > 0, max_positions >= 0 and init_std >= 0");
    s_.vocab = cfg.vocab, s_.features = cfg.features, s_.max_positions = cfg.max_positions;
    s_.table = b.template param<role::weight>("weight", {cfg.vocab, cfg.features}, Init::normal(cfg.init_std));
    if (cfg.max_positions > 0)
      s_.positions = pb.template param<role::weight>(positions_name, {cfg.max_positions, cfg.features},
                                                     Init::normal(cfg.init_std));
  }

  struct Spec {
    std::int64_t vocab = 0, features = 0, max_positions = 0;
    Param<role::weight> table, positions;
  };

  static Var<T> forward(Graph<P, B>& g, const Spec& s, Var<std::int32_t> ids, std::int64_t start) {
    const std::int64_t batch = ids.shape[0], time = ids.shape[1];
    Var<T> y = g.template tensor<T>(Shape{batch, time, s.features});
    auto& params = g.params();
    const W* positions = s.max_positions > 0 ? params.values(s.positions).data : nullptr;
    for_each_row(g.context(), static_cast<std::size_t>(batch * time), s.features,
                 detail::EmbedOp<W, T>{ids.data, params.values(s.table).data, positions, s.vocab, s.features, time,
                                       y.data, start});
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;
      auto& ps = gb.params();
      auto& ctx = gb.context();
      const auto rows = static_cast<std::size_t>(batch * time);
      Temporaries<P, B> temp(gb);
      const KeyGroups groups{gb.template scratch<std::int32_t>(rows), gb.template scratch<std::int32_t>(rows),
                             gb.template scratch<std::int32_t>(rows + 1), gb.template scratch<std::int32_t>(1)};
      group_by_key(ctx, ids.data, rows, groups, gb.template scratch<std::byte>(group_by_key_bytes(ctx, rows)));
      detail::add_embedding_grad(ctx, groups, dy, rows, s.vocab, s.features, ps.backward_grads(s.table).data);
      if (s.max_positions > 0)
        for_each(ctx, static_cast<std::size_t>(time * s.features),
                 detail::PositionGradOp<T, GW>{dy, batch, time, s.features,
                                               ps.backward_grads(s.positions).data + start * s.features},
                 static_cast<std::size_t>(batch));
    });
    return y;
  }

  static Var<T> project(Graph<P, B>& g, const Spec& s, Var<T> h) {
    const std::int64_t rows = h.rows();
    Var<T> y = g.template tensor<T>(h.shape.with(-1, s.vocab));
    const Matrix<const G> hg(as_type<G>(g, h.data, h.size()), rows, s.features, s.features);
    const Matrix<const G> w(g.params().template as<G>(s.table).data, s.vocab, s.features, s.features);
    gemm(g.context(), hg, transpose::no, w, transpose::yes, y.matrix());
    g.on_backward([=](Graph<P, B>& gb) {
      const T* dy = gb.grad(y);
      if (!dy) return;
      auto& ctx = gb.context();
      const GradOut<T> dh = gb.grad_out(h);
      Temporaries<P, B> temp(gb);
      const Matrix<const G> dyg(as_type<G>(gb, dy, y.size()), rows, s.vocab, s.vocab);
      gemm(ctx, dyg, transpose::yes, hg, transpose::no, matrix(gb.params().backward_grads(s.table).data, s.vocab, s.features),
           GemmEpilogue<GW>{.beta = 1.0f});  // adds to the embedding's own contribution
      if (dh) gemm(ctx, dyg, transpose::no, w, transpose::no, matrix(dh.data, rows, s.features),
                   GemmEpilogue<T>{.beta = dh.accumulate ? 1.0f : 0.0f});
    });
    detail::GraphHooks::allow_overwrite(g, y);  // the backward reads dy only: a fused loss may write it over y
    return y;
  }

  std::string name_;
  Spec s_;
};

}  // namespace amp::nn
