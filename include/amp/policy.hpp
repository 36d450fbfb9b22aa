#pragma once
// Opt levels as policy types. A policy is a plain struct of type aliases; layers
// and optimizers ask it for types, and `if constexpr` removes the casts a level
// does not need. A user policy derives from a built-in one and overrides an alias.
#include <concepts>
#include <string_view>
#include <type_traits>

#include "amp/core/numeric.hpp"

namespace amp {

// Op categories: O1's allow/deny lists are the compute_type table below.
enum class op { gemm, conv, pointwise, norm, softmax, loss, reduction };

enum class scaling { none, static_scale, dynamic };

// O0: pure fp32 baseline, no TF32.
struct O0Policy {
  using param_type = float;
  using master_type = float;
  using grad_type = float;
  using activation_type = float;
  using norm_param_type = float;
  using accumulate_type = float;
  template <op K>
  using compute_type = float;
  static constexpr bool has_master_weights = false;
  static constexpr scaling loss_scaling = scaling::none;
  static constexpr std::string_view name = "O0";
};

namespace detail {
// O1's table: GEMM and conv in the low type, everything numerically touchy in fp32.
template <class Low, op K>
using o1_compute = std::conditional_t<K == op::gemm || K == op::conv || K == op::pointwise, Low, float>;
}  // namespace detail

// O1: fp32 weights cast once per step to fp16 for GEMM/conv; fp32 softmax, norms, losses.
struct O1Policy : O0Policy {
  using activation_type = half;
  template <op K>
  using compute_type = detail::o1_compute<half, K>;
  static constexpr scaling loss_scaling = scaling::dynamic;
  static constexpr std::string_view name = "O1";
};

// O2: "almost fp16": fp16 weights and grads, fp32 master copy and norm parameters.
struct O2Policy : O1Policy {
  using param_type = half;
  using grad_type = half;
  static constexpr bool has_master_weights = true;
  static constexpr std::string_view name = "O2";
};

// O3: pure fp16, the speed baseline; reductions still accumulate in fp32.
struct O3Policy : O0Policy {
  using param_type = half;
  using master_type = half;
  using grad_type = half;
  using activation_type = half;
  using norm_param_type = half;
  template <op K>
  using compute_type = half;
  static constexpr scaling loss_scaling = scaling::static_scale;
  static constexpr std::string_view name = "O3";
};

// bf16 has fp32's exponent range: no loss scaling needed.
struct O1BF16Policy : O0Policy {
  using activation_type = bfloat16;
  template <op K>
  using compute_type = detail::o1_compute<bfloat16, K>;
  static constexpr std::string_view name = "O1-bf16";
};

struct O2BF16Policy : O1BF16Policy {
  using param_type = bfloat16;
  using grad_type = bfloat16;
  static constexpr bool has_master_weights = true;
  static constexpr std::string_view name = "O2-bf16";
};

template <class P>
concept Policy = requires {
  typename P::param_type;
  typename P::master_type;
  typename P::grad_type;
  typename P::activation_type;
  typename P::norm_param_type;
  typename P::accumulate_type;
  typename P::template compute_type<op::gemm>;
  typename P::template compute_type<op::conv>;
  typename P::template compute_type<op::pointwise>;
  typename P::template compute_type<op::norm>;
  typename P::template compute_type<op::softmax>;
  typename P::template compute_type<op::loss>;
  typename P::template compute_type<op::reduction>;
  { P::has_master_weights } -> std::convertible_to<bool>;
  { P::loss_scaling } -> std::convertible_to<scaling>;
} && Scalar<typename P::param_type> && Scalar<typename P::master_type> &&
    Scalar<typename P::grad_type> && Scalar<typename P::activation_type> &&
    Scalar<typename P::norm_param_type> && std::is_same_v<typename P::accumulate_type, float>;

// Facts the library derives from a policy's types, so that overriding one alias
// keeps everything else consistent.
template <Policy P>
inline constexpr bool uses_master_weights_v =
    !std::is_same_v<typename P::master_type, typename P::param_type>;

// O1-style: weights stored wider than the GEMM consumes them -> a per-step cast cache.
template <Policy P>
inline constexpr bool casts_weights_v =
    !std::is_same_v<typename P::param_type, typename P::template compute_type<op::gemm>>;

template <Policy P>
inline constexpr bool needs_half_support_v =
    std::is_same_v<typename P::template compute_type<op::gemm>, half> ||
    std::is_same_v<typename P::param_type, half> || std::is_same_v<typename P::activation_type, half>;

template <Policy P>
inline constexpr bool needs_bfloat16_support_v =
    std::is_same_v<typename P::template compute_type<op::gemm>, bfloat16> ||
    std::is_same_v<typename P::param_type, bfloat16> ||
    std::is_same_v<typename P::activation_type, bfloat16>;

template <Policy P>
constexpr std::string_view policy_name() {
  if constexpr (requires { P::name; }) return P::name;
  else return "user policy";
}

}  // namespace amp
