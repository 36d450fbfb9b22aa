#pragma once
// Where the numerics report (model/numerics.hpp) looks: a store's parameters
// and gradients (each role's tensors in two launches), its FP8 operands, and
// the outputs of layers on a graph and the gradients that reach them. Each
// call does nothing unless the report is on and this iteration is reported
// (the search for a non-finite gradient: on every iteration).
#include <string>
#include <type_traits>
#include <vector>

#include "amp/model/graph.hpp"
#include "amp/model/graph_hooks.hpp"
#include "amp/model/numerics.hpp"

namespace amp::nn {

// At the model's build: the report on or off, and when on, each trained
// role's tensors chunked and their workspaces sized, so that no step allocates
// for the search (a captured step runs it too).
template <Policy P, Backend B>
void prepare_numerics(ParameterStore<P, B>& store, int every) {
  auto& report = store.numerics();
  auto& ctx = store.context();
  report.enable(ctx, every);
  if (!report.on()) return;
  for_each_trained_role([&](auto k) {
    constexpr role R = decltype(k)::value;
    auto& g = report.group(static_cast<std::size_t>(R));
    std::vector<std::size_t> offsets;
    for (std::size_t i = 0; i < store.table().size(); ++i) {
      const ParamInfo& p = store.table()[i];
      if (p.kind != R) continue;
      g.params.push_back(static_cast<int>(i));
      g.names.push_back(p.name), g.counts.push_back(p.count), offsets.push_back(p.offset);
    }
    if (g.params.empty()) return;
    g.chunks = TensorChunks<B>(ctx, offsets, g.counts);
    std::vector<std::int32_t> owner;
    for (const std::uint32_t t : g.chunks.owners()) owner.push_back(g.params[t]);
    g.chunk_stats = Buffer<ValueStats, B>(ctx, g.chunks.chunks(), memory_kind::optimizer);
    g.chunk_counts = Buffer<std::uint32_t, B>(ctx, g.chunks.chunks(), memory_kind::optimizer);
    g.chunk_param = Buffer<std::int32_t, B>(ctx, owner.size(), memory_kind::optimizer);
    upload(ctx, g.chunk_param.span(), owner);
  });
}

// The parameters as the forward used them: the stored values, or (O1) the
// cast cache the GEMMs read, with the fp32 values it was rounded from as the
// source; where an fp32 master is kept, it is the source (underflow: the
// master is not zero, the value is).
template <Policy P, Backend B>
void observe_parameters(ParameterStore<P, B>& store) {
  auto& report = store.numerics();
  if (!report.due()) return;
  for_each_trained_role([&](auto k) {
    constexpr role R = decltype(k)::value;
    using Arena = RoleArena<P, B, R>;
    auto& g = report.group(static_cast<std::size_t>(R));
    Arena& a = store.template arena<R>();
    if constexpr (Arena::caches_gemm && std::is_same_v<typename Arena::stored_type, float>) {
      using G = typename Arena::gemm_type;
      report.observe_group(numerics_site::parameter, g, a.template as<G>(store.context()).data, a.values().data);
    } else {
      const float* master = nullptr;
      if constexpr (Arena::has_master) master = a.master().data;
      report.observe_group(numerics_site::parameter, g, static_cast<const typename Arena::stored_type*>(a.values().data),
                           master);
    }
  });
}

// The gradients as the overflow check reads them (scaled, summed over the
// ranks), on reported iterations; and on every iteration, behind the check's
// verdict `found`, the parameter backward reached first among those whose
// gradient is not finite (pure device work: a captured step runs it too).
template <Policy P, Backend B>
void observe_gradients(ParameterStore<P, B>& store, const int* found) {
  auto& report = store.numerics();
  if (!report.on()) return;
  auto& ctx = store.context();
  AMP_REQUIRE(!(report.due() && ctx.capturing()), "numerics report: step ", report.step(), " is a reported step "
              "(ModelOptions::numerics_every = ", report.every(), ") and it is being captured, which records no "
              "report: run reported steps eagerly (see numerics().due())");
  bool reset = true;
  for_each_trained_role([&](auto k) {
    constexpr role R = decltype(k)::value;
    using G = typename RoleArena<P, B, R>::grad_type;
    auto& g = report.group(static_cast<std::size_t>(R));
    if (g.params.empty()) return;
    const G* grads = store.template arena<R>().grads().data;
    g.chunks.reduce(ctx, detail::GatedNonfiniteOf<G>{grads, found}, detail::AddCounts{}, std::uint32_t{0},
                    g.chunk_counts.data(), static_cast<std::uint32_t*>(nullptr));
    for_each(ctx, 1, detail::LastNonfiniteOp{g.chunk_counts.data(), g.chunk_param.data(), g.chunks.chunks(), found,
                                             report.first_nonfinite(), reset});
    reset = false;
    report.observe_group(numerics_site::gradient, g, grads, nullptr);
  });
  if (reset) for_each(ctx, 1, amp::detail::FillOp<std::int32_t>{report.first_nonfinite(), -1});
}

// Every FP8 operand's amax of this iteration and the scale its casts used (before the optimizer's step moves them).
template <Policy P, Backend B>
void observe_fp8(ParameterStore<P, B>& store) {
  if constexpr (uses_fp8_v<P>) {
    auto& report = store.numerics();
    auto& state = store.fp8();
    if (!report.due() || state.layers().empty()) return;
    using C = fp8_config_t<P>;
    std::vector<std::string> names;
    std::vector<float> format_max;
    for (const Fp8Layer& l : state.layers())
      for (int o = 0; o < fp8_operands; ++o) {
        names.push_back(l.name + "." + fp8_operand_name(static_cast<fp8_operand>(o)));
        format_max.push_back(o == static_cast<int>(fp8_operand::grad) ? fp8_format<typename C::backward_type>::max
                                                                      : fp8_format<typename C::forward_type>::max);
      }
    report.observe_fp8(names, state.amax_values(), state.scale_values(), format_max);
  }
}

// A layer's output y on reported iterations: its values now (a training
// forward, not the planning pass, not a checkpoint's replay), and in backward
// the whole gradient that reached it (recorded after the layer's own backward
// op, so it runs after every consumer of y and before the layer's backward;
// it reads the gradient only, so a fused loss may still write over y).
// `prefix`: the layer's parameter prefix ("0.", "h.3.mlp.c_fc."), the row's
// name without its dot; `kind` names a layer without one.
template <Policy P, Backend B, class U>
void observe_layer(Graph<P, B>& g, const Var<U>& y, const std::string& prefix, const char* kind) {
  auto& report = g.params().numerics();
  if (!report.due() || g.replaying() || !g.training()) return;
  const std::string name = prefix.empty() ? std::string(kind) : prefix.substr(0, prefix.size() - 1);
  if (!g.planning()) report.observe(numerics_site::activation, name, y.data, y.size());
  g.on_backward([y, name](Graph<P, B>& gb) {
    if (const U* dy = gb.grad(y); dy && !gb.planning())
      gb.params().numerics().observe(numerics_site::activation_grad, name, dy, y.size());
  });
  detail::GraphHooks::still_overwritable(g, y);
}

}  // namespace amp::nn
