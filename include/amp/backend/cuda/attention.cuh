#pragma once
// Fused causal attention on the GPU (backend/attention.hpp's contract) on
// cuDNN's scaled-dot-product attention: flash attention with the causal mask,
// the scale, dropout and fp32 softmax statistics inside the kernels, through
// NVIDIA's header-only cudnn-frontend (what PyTorch's and Transformer Engine's
// cuDNN attention use). fp16 and bf16 with the output in the GEMM type; fp32
// (O0) keeps the materialised path. Each shape's forward and backward graphs
// are built once per context, the first engine of cuDNN's heuristics (mode A,
// then its fallback list) that supports them, and the backward deterministic;
// a shape cuDNN cannot run reports false from attention_available (and the
// frontend's reason on stderr, once), and the layer takes the materialised
// path. Q, K, V, O and their gradients are strided views (AttentionShape's
// layout): the layer's packed qkv buffer, its merged output and their
// gradients, read and written in place. Dropout draws cuDNN's Philox bits from a
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

#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

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

// Unique ids of the attention graphs' tensors; they index a call's pointers.
enum sdpa_uid : std::int64_t { sdpa_q = 1, sdpa_k, sdpa_v, sdpa_o, sdpa_stats, sdpa_seed, sdpa_offset, sdpa_do,
                               sdpa_dq, sdpa_dk, sdpa_dv, sdpa_uid_end };

// One built graph: its plan, its workspace, and the uids of its variant pack in
// the order execute() takes the pointers (the frontend's sorted order), so a
// call fills a small array instead of hashing a map.
struct SdpaPlan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  std::vector<std::int64_t> uids;
  explicit operator bool() const { return graph != nullptr; }
};

// One shape's graphs, built on first use; empty where cuDNN has no engine.
struct SdpaGraphs {
  SdpaPlan forward, backward;
  bool built = false;
};

class SdpaState {
 public:
  explicit SdpaState(Context<cuda>& ctx) { ctx.library_state<cudnn::Handle>(); }  // the handle first: freed after the graphs made on it
  // Key: heads, time, dim, the layout (group, strides), the scale's and dropout's bits, the data type.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::uint32_t, std::uint32_t, int>;
  SdpaGraphs& graphs(const Key& key) { return graphs_[key]; }
  std::size_t size() const { return graphs_.size(); }

 private:
  std::map<Key, SdpaGraphs> graphs_;
};

template <class G>
constexpr fe::DataType_t frontend_type() {
  return std::is_same_v<G, half> ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// cuDNN's [batch, heads, time, dim] over the shape's layout, rows `rows` values apart:
// strided views into the caller's buffers (backend/attention.hpp).
inline std::vector<std::int64_t> heads_dims(const AttentionShape& s) {
  return {s.heads / s.group, s.group, s.time, s.dim};
}
inline std::vector<std::int64_t> heads_strides(const AttentionShape& s, std::int64_t rows) {
  return {s.time * rows, s.dim, rows, 1};
}
inline fe::graph::Tensor_attributes heads_tensor(const char* name, std::int64_t uid, const AttentionShape& s,
                                                 std::int64_t rows) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(heads_dims(s)).set_stride(
      heads_strides(s, rows));
}
inline void as_heads_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, std::int64_t uid,
                            const AttentionShape& s, std::int64_t rows) {
  t->set_output(true).set_uid(uid).set_dim(heads_dims(s)).set_stride(heads_strides(s, rows));
}
// The log-sum-exps, [batch, heads, time, 1] contiguous.
inline fe::graph::Tensor_attributes& as_stats(fe::graph::Tensor_attributes& t, const AttentionShape& s) {
  return t.set_uid(sdpa_stats)
      .set_dim({s.heads / s.group, s.group, s.time, 1})
      .set_stride({s.group * s.time, s.time, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}
inline std::shared_ptr<fe::graph::Tensor_attributes> rng_tensor(fe::graph::Graph& g, const char* name, std::int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64));
}

// A graph's plan (heuristics mode A, then the fallback list), its workspace and
// its variant pack's order; empty where none builds, with the frontend's reason in `why`.
inline SdpaPlan built(std::shared_ptr<fe::graph::Graph> g, cudnnHandle_t handle, std::string& why) {
  SdpaPlan plan;
  const auto failed = [&](fe::error_t status) {
    if (status.is_good()) return false;
    why = status.get_message();
    return true;
  };
  if (failed(g->validate()) || failed(g->build_operation_graph(handle)) ||
      failed(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK})) ||
      failed(g->check_support(handle)) || failed(g->build_plans(handle)) || failed(g->get_workspace_size(plan.workspace)))
    return {};
  plan.uids = g->get_variant_pack_uids_sorted();
  for (const std::int64_t uid : plan.uids)
    if (uid <= 0 || uid >= sdpa_uid_end) {
      why = "the variant pack holds uid " + std::to_string(uid) + ", not one of amp's";
      return {};
    }
  plan.graph = std::move(g);
  return plan;
}

template <class G>
void build_sdpa(SdpaGraphs& graphs, cudnnHandle_t handle, const AttentionShape& s, float p, std::string& why) {
  const auto typed = [](fe::graph::Graph& g) {
    g.set_io_data_type(frontend_type<G>())
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  };
  const std::int64_t in = s.in_rows(), out = s.out_rows();
  {
    auto g = std::make_shared<fe::graph::Graph>();
    typed(*g);
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("flash_attention")
                          .set_generate_stats(true)
                          .set_causal_mask(true)
                          .set_attn_scale(s.alpha);
    if (p > 0.0f) attributes.set_dropout(p, rng_tensor(*g, "seed", sdpa_seed), rng_tensor(*g, "offset", sdpa_offset));
    auto [o, stats] = g->sdpa(g->tensor(heads_tensor("q", sdpa_q, s, in)), g->tensor(heads_tensor("k", sdpa_k, s, in)),
                              g->tensor(heads_tensor("v", sdpa_v, s, in)), attributes);
    as_heads_output(o, sdpa_o, s, out);
    as_stats(stats->set_output(true), s);
    graphs.forward = built(g, handle, why);
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
    fe::graph::Tensor_attributes stats;
    auto [dq, dk, dv] = g->sdpa_backward(
        g->tensor(heads_tensor("q", sdpa_q, s, in)), g->tensor(heads_tensor("k", sdpa_k, s, in)),
        g->tensor(heads_tensor("v", sdpa_v, s, in)), g->tensor(heads_tensor("o", sdpa_o, s, out)),
        g->tensor(heads_tensor("do", sdpa_do, s, out)), g->tensor(as_stats(stats.set_name("stats"), s)), attributes);
    as_heads_output(dq, sdpa_dq, s, in);
    as_heads_output(dk, sdpa_dk, s, in);
    as_heads_output(dv, sdpa_dv, s, in);
    graphs.backward = built(g, handle, why);
  }
  graphs.built = true;
}

template <class G>
SdpaGraphs& sdpa_graphs(Context<cuda>& ctx, const AttentionShape& s, float p) {
  auto& graphs = ctx.library_state<SdpaState>().graphs({s.heads, s.time, s.dim, s.group, s.in_rows(), s.out_rows(),
                                                        float_bits(s.alpha), float_bits(p),
                                                        std::is_same_v<G, half> ? 0 : 1});
  if (!graphs.built) {
    std::string why;
    build_sdpa<G>(graphs, ctx.library_state<cudnn::Handle>().get(), s, p, why);
    if (!graphs.forward || !graphs.backward) {  // one line, once per shape and context: the frontend's own reason
      for (char& c : why) c = c == '\n' ? ' ' : c;
      std::fprintf(stderr,
                   "amp: cuDNN has no fused attention %s for %lld x %lld heads x %lld positions x %lld dimensions "
                   "(%s, dropout %g): %s; attention takes its materialised path (logged once)\n",
                   graphs.forward ? "backward" : "forward", static_cast<long long>(s.heads / s.group),
                   static_cast<long long>(s.group), static_cast<long long>(s.time), static_cast<long long>(s.dim),
                   std::is_same_v<G, half> ? "fp16" : "bf16", static_cast<double>(p), why.c_str());
    }
  }
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

// A call's pointers, indexed by uid.
using SdpaPointers = std::array<void*, sdpa_uid_end>;

// The workspace and the two Philox values, from the context's attention scratch.
template <class Dropout>
void* sdpa_scratch(Context<cuda>& ctx, std::int64_t workspace, const Dropout& drop, SdpaPointers& by_uid) {
  const auto bytes = (static_cast<std::size_t>(workspace) + 255) / 256 * 256;
  auto* base = ctx.scratch<unsigned char>(scratch_slot::attention, bytes + 2 * sizeof(std::int64_t));
  if (drop.p > 0.0f) {
    auto* rng = reinterpret_cast<std::int64_t*>(base + bytes);
    for_each(ctx, 1, SdpaSeedOp<Dropout>{drop, rng});
    by_uid[sdpa_seed] = rng;
    by_uid[sdpa_offset] = rng + 1;
  }
  return base;
}

inline void run_sdpa(Context<cuda>& ctx, const SdpaPlan& plan, const SdpaPointers& by_uid, void* workspace,
                     const char* what) {
  SdpaPointers pack{};
  for (std::size_t i = 0; i < plan.uids.size(); ++i) pack[i] = by_uid[static_cast<std::size_t>(plan.uids[i])];
  ctx.count_launch();
  auto status = plan.graph->execute(ctx.library_state<cudnn::Handle>().get(), pack.data(),
                                    static_cast<int>(plan.uids.size()), workspace);
  AMP_REQUIRE(status.is_good(), "cuDNN attention ", what, ": ", status.get_message());
}

}  // namespace detail

// cuDNN runs this shape's forward and backward (types G, O; dropout p or none):
// builds its graphs on first use; where it cannot, says why on stderr once.
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
    const auto& plan = detail::sdpa_graphs<G>(ctx, s, drop.p).forward;
    detail::SdpaPointers by_uid{};
    void* workspace = detail::sdpa_scratch(ctx, plan.workspace, drop, by_uid);
    by_uid[detail::sdpa_q] = const_cast<G*>(q), by_uid[detail::sdpa_k] = const_cast<G*>(k);
    by_uid[detail::sdpa_v] = const_cast<G*>(v), by_uid[detail::sdpa_o] = out, by_uid[detail::sdpa_stats] = lse;
    detail::run_sdpa(ctx, plan, by_uid, workspace, "forward");
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
    const auto& plan = detail::sdpa_graphs<G>(ctx, s, drop.p).backward;
    detail::SdpaPointers by_uid{};
    void* workspace = detail::sdpa_scratch(ctx, plan.workspace, drop, by_uid);
    by_uid[detail::sdpa_q] = const_cast<G*>(q), by_uid[detail::sdpa_k] = const_cast<G*>(k);
    by_uid[detail::sdpa_v] = const_cast<G*>(v), by_uid[detail::sdpa_o] = const_cast<O*>(out);
    by_uid[detail::sdpa_stats] = const_cast<float*>(lse), by_uid[detail::sdpa_do] = const_cast<G*>(dout);
    by_uid[detail::sdpa_dq] = dq, by_uid[detail::sdpa_dk] = dk, by_uid[detail::sdpa_dv] = dv;
    detail::run_sdpa(ctx, plan, by_uid, workspace, "backward");
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
