#pragma once
// Opt levels as policy types. A policy is a plain struct of type aliases; layers
// and optimizers ask it for types, and `if constexpr` removes the casts a level
// does not need. A user policy derives from a built-in one and overrides an alias.
// Every alias has an effect:
//   param_type        stored weights and biases (Linear, Conv2d, Embedding)
//   master_type       the optimizer's copy; a separate fp32 master exists exactly
//                     where a role's stored type differs from it
//   grad_type         gradients of the weights and biases
//   activation_type   what layers write between each other
//   norm_param_type   BatchNorm / LayerNorm scale and shift, and their gradients
//   compute_type<op>  what each op category computes in (rounds its results to)
//   loss_scaling      none, a static scale, or dynamic scaling: a compile-time mode
// Sums (GEMM, reductions, statistics) always accumulate in fp32 or wider.
#include <concepts>
#include <string_view>
#include <type_traits>

#include "amp/core/numeric.hpp"

namespace amp {

// Op categories: O1's allow/deny lists are the compute_type table below.
//   gemm: Linear and attention products; conv: convolutions; pointwise:
//   activations, dropout, residual adds; norm: BatchNorm, LayerNorm; softmax:
//   attention's softmax; loss: losses; reduction: pooling sums and means.
enum class op { gemm, conv, pointwise, norm, softmax, loss, reduction };

enum class scaling { none, static_scale, dynamic };

// O0: pure fp32 baseline, no TF32.
struct O0Policy {
  using param_type = float;
  using master_type = float;
  using grad_type = float;
  using activation_type = float;
  using norm_param_type = float;
  template <op K>
  using compute_type = float;
  static constexpr scaling loss_scaling = scaling::none;
  static constexpr std::string_view name = "O0";
};

namespace detail {
// O1's table: GEMM, conv and point-wise ops in the low type, everything numerically touchy in fp32.
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
  static constexpr std::string_view name = "O2";
};

// O3: pure fp16, the speed baseline; sums still accumulate in fp32.
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
  static constexpr std::string_view name = "O2-bf16";
};

template <class P>
concept Policy = requires {
  typename P::param_type;
  typename P::master_type;
  typename P::grad_type;
  typename P::activation_type;
  typename P::norm_param_type;
  typename P::template compute_type<op::gemm>;
  typename P::template compute_type<op::conv>;
  typename P::template compute_type<op::pointwise>;
  typename P::template compute_type<op::norm>;
  typename P::template compute_type<op::softmax>;
  typename P::template compute_type<op::loss>;
  typename P::template compute_type<op::reduction>;
  { P::loss_scaling } -> std::convertible_to<scaling>;
} && Scalar<typename P::param_type> && Scalar<typename P::master_type> && Scalar<typename P::grad_type> &&
    Scalar<typename P::activation_type> && Scalar<typename P::norm_param_type> &&
    Scalar<typename P::template compute_type<op::gemm>> && Scalar<typename P::template compute_type<op::conv>>;

// Facts the library derives from a policy's types (one source of truth), so
// that overriding one alias keeps everything else consistent.

// A role's stored type differs from the master type: the optimizer keeps an fp32 copy.
template <Policy P, class Stored>
inline constexpr bool keeps_master_v = !std::is_same_v<typename P::master_type, Stored>;

template <Policy P>
inline constexpr bool uses_master_weights_v = keeps_master_v<P, typename P::param_type>;

// Weights stored wider than a GEMM or convolution consumes them: a per-step cast cache.
template <Policy P>
inline constexpr bool casts_weights_v =
    !std::is_same_v<typename P::param_type, typename P::template compute_type<op::gemm>> ||
    !std::is_same_v<typename P::param_type, typename P::template compute_type<op::conv>>;

namespace detail {
template <Policy P, class T>
inline constexpr bool policy_uses_v =
    std::is_same_v<typename P::param_type, T> || std::is_same_v<typename P::grad_type, T> ||
    std::is_same_v<typename P::activation_type, T> || std::is_same_v<typename P::norm_param_type, T> ||
    std::is_same_v<typename P::template compute_type<op::gemm>, T> ||
    std::is_same_v<typename P::template compute_type<op::conv>, T> ||
    std::is_same_v<typename P::template compute_type<op::pointwise>, T> ||
    std::is_same_v<typename P::template compute_type<op::norm>, T> ||
    std::is_same_v<typename P::template compute_type<op::softmax>, T> ||
    std::is_same_v<typename P::template compute_type<op::loss>, T> ||
    std::is_same_v<typename P::template compute_type<op::reduction>, T>;
}  // namespace detail

template <Policy P>
inline constexpr bool needs_half_support_v = detail::policy_uses_v<P, half>;

template <Policy P>
inline constexpr bool needs_bfloat16_support_v = detail::policy_uses_v<P, bfloat16>;

template <Policy P>
constexpr std::string_view policy_name() {
  if constexpr (requires { P::name; }) return P::name;
  else return "user policy";
}

}  // namespace amp
