#pragma once
// Fused causal attention on the GPU (backend/attention.hpp's contract) on
// cuDNN's scaled-dot-product attention: flash attention with the causal mask,
// the scale, dropout and fp32 softmax statistics inside the kernels, through
// NVIDIA's header-only cudnn-frontend (what PyTorch's and Transformer Engine's
// cuDNN attention use). fp16 and bf16 with the output in the GEMM type; fp32
// (O0) keeps the materialised path. Each shape's forward and backward graphs
// are built once per context, the first engine of cuDNN's heuristics (mode A,
// then its fallback list) that supports them, and the backward deterministic;
// a shape cuDNN cannot run reports false from attention_available, and the
// layer takes the materialised path. Dropout draws cuDNN's Philox bits from a
// seed the Dropout's key() gives on the device (no host sync, capturable), not
// attention_keep's: on the GPU the fused and materialised paths drop different
// entries, each consistently between its forward and backward.
//
// The frontend is an extra download (scripts/setup.sh): where cudnn_frontend.h
// is not on the include path, fused_attention<cuda> stays false and the
// attention layers take their materialised path; attention_available says
// false. Every translation unit of one program must see the same choice.
#include "amp/backend/attention.hpp"

#if __has_include(<cudnn_frontend.h>)
#ifndef CUDNN_FRONTEND_SKIP_JSON_LIB
#define CUDNN_FRONTEND_SKIP_JSON_LIB  // amp serialises no graph; the JSON library doubles the compile time
#endif
#include <cstring>  // cudnn-frontend 1.32's shim calls std::strlen without including it

#include <cudnn_frontend.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "amp/backend/cuda/algorithm.cuh"
#include "amp/backend/cuda/cudnn.cuh"

namespace amp {

// fp16 and bf16 with the output in the GEMM type; cuDNN's flash kernels take
// head dimensions up to 128 on every GPU it runs them on.
template <>
struct fused_attention<cuda> : std::true_type {
  static constexpr std::int64_t max_dim = 128;
  template <class G, class O>
  static constexpr bool runs = (std::is_same_v<G, half> || std::is_same_v<G, bfloat16>) && std::is_same_v<O, G>;
};

namespace detail {

namespace fe = cudnn_frontend;

// Unique ids of the attention graphs' tensors.
enum sdpa_uid : std::int64_t { sdpa_q = 1, sdpa_k, sdpa_v, sdpa_o, sdpa_stats, sdpa_seed, sdpa_offset, sdpa_do,
                               sdpa_dq, sdpa_dk, sdpa_dv };

// One shape's graphs, built on first use; empty pointers where cuDNN has no engine.
struct SdpaGraphs {
  std::shared_ptr<fe::graph::Graph> forward, backward;
  std::int64_t forward_workspace = 0, backward_workspace = 0;
  bool built = false;
};

class SdpaState {
 public:
  explicit SdpaState(Context<cuda>&) {}
  // Key: heads, time, dim, the scale's and dropout's bits, the data type.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::uint32_t, std::uint32_t, int>;
  SdpaGraphs& graphs(const Key& key) { return graphs_[key]; }
  std::size_t size() const { return graphs_.size(); }

 private:
  std::map<Key, SdpaGraphs> graphs_;
};

template <class G>
constexpr fe::DataType_t frontend_type() {
  return std::is_same_v<G, half> ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// [heads, 1, time, dim] with each head's rows contiguous; stats [heads, 1, time, 1].
inline fe::graph::Tensor_attributes heads_tensor(const char* name, std::int64_t uid, const AttentionShape& s) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({s.heads, 1, s.time, s.dim})
      .set_stride({s.time * s.dim, s.time * s.dim, s.dim, 1});
}
inline void as_heads_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, std::int64_t uid,
                            const AttentionShape& s) {
  t->set_output(true).set_uid(uid).set_dim({s.heads, 1, s.time, s.dim}).set_stride({s.time * s.dim, s.time * s.dim, s.dim, 1});
}
inline std::shared_ptr<fe::graph::Tensor_attributes> rng_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}

// A graph's plan (heuristics mode A, then the fallback list) and its workspace; nullptr where none builds.
inline std::shared_ptr<fe::graph::Graph> built(std::shared_ptr<fe::graph::Graph> g, cudnnHandle_t handle,
                                               std::int64_t& workspace) {
  if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good() ||
      !g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}).is_good() ||
      !g->check_support(handle).is_good() || !g->build_plans(handle).is_good() ||
      !g->get_workspace_size(workspace).is_good())
    return nullptr;
  return g;
}

template <class G>
void build_sdpa(SdpaGraphs& graphs, cudnnHandle_t handle, const AttentionShape& s, float p) {
  const auto typed = [](fe::graph::Graph& g) {
    g.set_io_data_type(frontend_type<G>())
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  };
  {
    auto g = std::make_shared<fe::graph::Graph>();
    typed(*g);
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("flash_attention")
                          .set_generate_stats(true)
                          .set_causal_mask(true)
                          .set_attn_scale(s.alpha);
    if (p > 0.0f) attributes.set_dropout(p, rng_tensor(*g, "seed", sdpa_seed), rng_tensor(*g, "offset", sdpa_offset));
    auto [o, stats] = g->sdpa(g->tensor(heads_tensor("q", sdpa_q, s)), g->tensor(heads_tensor("k", sdpa_k, s)),
                              g->tensor(heads_tensor("v", sdpa_v, s)), attributes);
    as_heads_output(o, sdpa_o, s);
    stats->set_output(true).set_uid(sdpa_stats).set_data_type(fe::DataType_t::FLOAT);
    graphs.forward = built(g, handle, graphs.forward_workspace);
  }
  if (graphs.forward) {
    auto g = std::make_shared<fe::graph::Graph>();
    typed(*g);
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("flash_attention_backward")
                          .set_causal_mask(true)
                          .set_attn_scale(s.alpha)
                          .set_deterministic_algorithm(true);
    if (p > 0.0f) attributes.set_dropout(p, rng_tensor(*g, "seed", sdpa_seed), rng_tensor(*g, "offset", sdpa_offset));
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(sdpa_stats)
                               .set_dim({s.heads, 1, s.time, 1})
                               .set_stride({s.time, s.time, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto [dq, dk, dv] = g->sdpa_backward(g->tensor(heads_tensor("q", sdpa_q, s)), g->tensor(heads_tensor("k", sdpa_k, s)),
                                         g->tensor(heads_tensor("v", sdpa_v, s)), g->tensor(heads_tensor("o", sdpa_o, s)),
                                         g->tensor(heads_tensor("do", sdpa_do, s)), stats, attributes);
    as_heads_output(dq, sdpa_dq, s);
    as_heads_output(dk, sdpa_dk, s);
    as_heads_output(dv, sdpa_dv, s);
    graphs.backward = built(g, handle, graphs.backward_workspace);
  }
  graphs.built = true;
}

template <class G>
SdpaGraphs& sdpa_graphs(Context<cuda>& ctx, const AttentionShape& s, float p) {
  auto& graphs = ctx.library_state<SdpaState>().graphs(
      {s.heads, s.time, s.dim, float_bits(s.alpha), float_bits(p), std::is_same_v<G, half> ? 0 : 1});
  if (!graphs.built) build_sdpa<G>(graphs, ctx.library_state<cudnn::Handle>().get(), s, p);
  return graphs;
}

// Philox's seed (the op's dropout key, read on the device) and offset 0.
template <class Dropout>
struct SdpaSeedOp {
  Dropout drop;
  std::int64_t* rng;
  AMP_HOST_DEVICE void operator()(std::size_t) const {
    rng[0] = static_cast<std::int64_t>(drop.key() >> 1);
    rng[1] = 0;
  }
};

// The workspace and the two Philox values, from the context's attention scratch.
template <class Dropout>
std::unordered_map<std::int64_t, void*> sdpa_scratch(Context<cuda>& ctx, std::int64_t workspace, const Dropout& drop,
                                                     void*& ws) {
  const auto bytes = (static_cast<std::size_t>(workspace) + 255) / 256 * 256;
  auto* base = ctx.scratch<unsigned char>(scratch_slot::attention, bytes + 2 * sizeof(std::int64_t));
  ws = base;
  std::unordered_map<std::int64_t, void*> pack;
  if (drop.p > 0.0f) {
    auto* rng = reinterpret_cast<std::int64_t*>(base + bytes);
    for_each(ctx, 1, SdpaSeedOp<Dropout>{drop, rng});
    pack = {{sdpa_seed, rng}, {sdpa_offset, rng + 1}};
  }
  return pack;
}

inline void run_sdpa(Context<cuda>& ctx, const fe::graph::Graph& g, std::unordered_map<std::int64_t, void*>& pack,
                     void* workspace, const char* what) {
  ctx.count_launch();
  auto status = g.execute(ctx.library_state<cudnn::Handle>().get(), pack, workspace);
  AMP_REQUIRE(status.is_good(), "cuDNN attention ", what, ": ", status.get_message());
}

}  // namespace detail

// cuDNN runs this shape's forward and backward (types G, O; dropout p or none):
// builds its graphs on first use.
template <class G, class O>
bool attention_available(Context<cuda>& ctx, const AttentionShape& s, float p) {
  if constexpr (!fused_attention<cuda>::runs<G, O>) {
    return false;
  } else {
    ctx.activate();
    const auto& graphs = detail::sdpa_graphs<G>(ctx, s, p);
    return graphs.forward && graphs.backward;
  }
}

// O and each query row's log-sum-exp of its scaled scores (cuDNN's softmax statistics).
template <class G, class O, class Dropout>
void attention_forward(Context<cuda>& ctx, const AttentionShape& s, const G* q, const G* k, const G* v, O* out,
                       float* lse, const Dropout& drop) {
  AMP_REQUIRE((attention_available<G, O>(ctx, s, drop.p)), "attention_forward: cuDNN has no fused attention for ",
              s.heads, " heads x ", s.time, " positions x ", s.dim, " dimensions in these types");
  if constexpr (fused_attention<cuda>::runs<G, O>) {
    const auto& graphs = detail::sdpa_graphs<G>(ctx, s, drop.p);
    void* workspace = nullptr;
    auto pack = detail::sdpa_scratch(ctx, graphs.forward_workspace, drop, workspace);
    pack.insert({{detail::sdpa_q, const_cast<G*>(q)}, {detail::sdpa_k, const_cast<G*>(k)},
                 {detail::sdpa_v, const_cast<G*>(v)}, {detail::sdpa_o, out}, {detail::sdpa_stats, lse}});
    detail::run_sdpa(ctx, *graphs.forward, pack, workspace, "forward");
  }
}

// dQ, dK, dV (overwritten) from dO, O and the forward's statistics.
template <class G, class O, class Dg, class Dropout>
void attention_backward(Context<cuda>& ctx, const AttentionShape& s, const G* q, const G* k, const G* v, const O* out,
                        const float* lse, const G* dout, Dg* dq, Dg* dk, Dg* dv, const Dropout& drop) {
  AMP_REQUIRE((attention_available<G, O>(ctx, s, drop.p) && std::is_same_v<Dg, G>),
              "attention_backward: cuDNN has no fused attention for ", s.heads, " heads x ", s.time, " positions x ",
              s.dim, " dimensions in these types");
  if constexpr (fused_attention<cuda>::runs<G, O> && std::is_same_v<Dg, G>) {
    const auto& graphs = detail::sdpa_graphs<G>(ctx, s, drop.p);
    void* workspace = nullptr;
    auto pack = detail::sdpa_scratch(ctx, graphs.backward_workspace, drop, workspace);
    pack.insert({{detail::sdpa_q, const_cast<G*>(q)}, {detail::sdpa_k, const_cast<G*>(k)},
                 {detail::sdpa_v, const_cast<G*>(v)}, {detail::sdpa_o, const_cast<O*>(out)},
                 {detail::sdpa_stats, const_cast<float*>(lse)}, {detail::sdpa_do, const_cast<G*>(dout)},
                 {detail::sdpa_dq, dq}, {detail::sdpa_dk, dk}, {detail::sdpa_dv, dv}});
    detail::run_sdpa(ctx, *graphs.backward, pack, workspace, "backward");
  }
}

}  // namespace amp

#else  // no cuDNN frontend: no fused kernel on the GPU; a caller that asks directly is told why
#include "amp/backend/cuda/context.cuh"

namespace amp {

template <class G, class O>
bool attention_available(Context<cuda>&, const AttentionShape&, float) {
  return false;
}

template <class G, class O, class Dropout>
void attention_forward(Context<cuda>&, const AttentionShape&, const G*, const G*, const G*, O*, float*, const Dropout&) {
  AMP_REQUIRE(false, "attention_forward: amp was compiled without cuDNN's C++ frontend (cudnn_frontend.h): "
                     "no fused attention on the GPU");
}

template <class G, class O, class Dg, class Dropout>
void attention_backward(Context<cuda>&, const AttentionShape&, const G*, const G*, const G*, const O*, const float*,
                        const G*, Dg*, Dg*, Dg*, const Dropout&) {
  AMP_REQUIRE(false, "attention_backward: amp was compiled without cuDNN's C++ frontend (cudnn_frontend.h): "
                     "no fused attention on the GPU");
}

}  // namespace amp
#endif  // __has_include(<cudnn_frontend.h>)
