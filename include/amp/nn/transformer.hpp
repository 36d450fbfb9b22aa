#pragma once
// The pre-LN transformer block (GPT-2's, its parameters named as transformers' GPT2Block): x + attention(LN(x)), then
// x + MLP(LN(x)) with MLP = Linear(4x, GELU fused) -> Linear. LayerNorm in
// compute_type<op::norm> with norm_param_type parameters (fp32 under O2), the
// GEMMs in the policy's GEMM type, the residual adds in the pointwise type.
#include <string>

#include "amp/nn/attention.hpp"
#include "amp/nn/linear.hpp"
#include "amp/nn/norm.hpp"
#include "amp/nn/shape_ops.hpp"

namespace amp::nn {

template <class P, class B>
class TransformerBlock {
  static_assert(Policy<P> && Backend<B>);

 public:
  using T = typename P::activation_type;
  struct Config {
    std::int64_t features = 0;
    std::int64_t heads = 1;
    std::int64_t mlp_ratio = 4;
    float attention_dropout = 0.0f;
    float residual_dropout = 0.0f;  // on each branch before its residual add
    initializer init = initializer::gpt2;  // normal(0, 0.02), zero biases: trains faster here than torch's
    attention_kernel attention = attention_kernel::fused;
  };

  TransformerBlock(Builder<P, B> b, const Config& cfg)
      : ln1_(b.child("ln_1"), {.features = cfg.features}),
        attn_(b.child("attn"), {.features = cfg.features, .heads = cfg.heads, .dropout = cfg.attention_dropout,
                                .init = cfg.init, .kernel = cfg.attention}),
        ln2_(b.child("ln_2"), {.features = cfg.features}),
        fc_(b.child("mlp.c_fc"), {.in_features = cfg.features, .out_features = cfg.mlp_ratio * cfg.features,
                                .act = activation::gelu, .init = cfg.init}),
        proj_(b.child("mlp.c_proj"), {.in_features = cfg.mlp_ratio * cfg.features, .out_features = cfg.features,
                                    .init = cfg.init}),
        residual_dropout_(cfg.residual_dropout) {
    AMP_REQUIRE(cfg.mlp_ratio > 0 && cfg.residual_dropout >= 0.0f && cfg.residual_dropout < 1.0f, "TransformerBlock '",
                b.prefix(), "': need mlp_ratio > 0 and residual_dropout in [0, 1)");
  }

  // x: [batch, time, features] -> the same shape.
  Var<T> operator()(Graph<P, B>& g, Var<T> x) const {
    x = add(g, x, branch(g, attn_(g, ln1_(g, x))));
    return add(g, x, branch(g, proj_(g, fc_(g, ln2_(g, x)))));
  }

  // Inference with a key/value cache (CausalSelfAttention): x holds positions start .. start + n - 1.
  using cache_type = typename CausalSelfAttention<P, B>::G;
  Var<T> operator()(Graph<P, B>& g, Var<T> x, const KVCacheView<cache_type>& cache, std::int64_t start) const {
    x = add(g, x, attn_(g, ln1_(g, x), cache, start));
    return add(g, x, proj_(g, fc_(g, ln2_(g, x))));
  }

 private:
  Var<T> branch(Graph<P, B>& g, Var<T> h) const {
    return residual_dropout_ > 0.0f ? dropout(g, h, residual_dropout_) : h;
  }

  LayerNorm<P, B> ln1_;
  CausalSelfAttention<P, B> attn_;
  LayerNorm<P, B> ln2_;
  Linear<P, B> fc_, proj_;
  float residual_dropout_;
};

}  // namespace amp::nn
