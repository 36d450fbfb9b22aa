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
//   fp8 (optional)    Linear layers' GEMMs in FP8: the formats, the scaling recipe
//                     and which layers stay in compute_type<gemm> (see Fp8)
// Sums (GEMM, reductions, statistics) always accumulate in fp32 or wider.
#include <array>
#include <concepts>
#include <string_view>
#include <type_traits>

#include "amp/core/fp8.hpp"
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

// FP8 scaling recipes (Transformer Engine's). Delayed: each FP8 operand keeps
// the amaxes of its last History iterations; the optimizer's step sets its
// scale to fp8_max / max(history) / 2^Margin, on the device, and the next
// iteration casts with it (the amax of a cast is found in the same pass).
template <int History = 1024, int Margin = 0>
struct DelayedScaling {
  static_assert(History >= 1 && Margin >= 0);
  static constexpr bool delayed = true;
  static constexpr int history = History, margin = Margin;
};
// Current: each cast first finds its own tensor's amax (one more read) and
// scales by fp8_max / amax / 2^Margin.
template <int Margin = 0>
struct CurrentScaling {
  static_assert(Margin >= 0);
  static constexpr bool delayed = false;
  static constexpr int history = 1, margin = Margin;
};

// What runs in FP8: Linear layers' three GEMMs (forward, input gradient,
// weight gradient), with inputs and weights in Forward and the output
// gradient in Backward (HYBRID: E4M3 forward, E5M2 gradients), fp32
// accumulation. The first KeepFirst and the last KeepLast layers with
// weights (Linear, Conv2d, Embedding, in the order of the model's forward)
// stay in compute_type<gemm>; convolutions and attention's products always do.
template <class Recipe = DelayedScaling<>, class Forward = fp8_e4m3, class Backward = fp8_e5m2, int KeepFirst = 1,
          int KeepLast = 1>
struct Fp8 {
  static_assert(is_fp8_v<Forward> && is_fp8_v<Backward> && KeepFirst >= 0 && KeepLast >= 0);
  using recipe = Recipe;
  using forward_type = Forward;
  using backward_type = Backward;
  static constexpr int keep_first = KeepFirst, keep_last = KeepLast;
};

// O2-fp8: O2-bf16 (bf16 weights and activations, fp32 masters, fp32 norms,
// softmax and losses), with its Linear GEMMs in FP8 under delayed scaling.
struct O2FP8Policy : O2BF16Policy {
  using fp8 = Fp8<>;
  static constexpr std::string_view name = "O2-fp8";
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

// The policy runs Linear layers in FP8 (it has an fp8 alias).
template <Policy P>
inline constexpr bool uses_fp8_v = requires { typename P::fp8::recipe; };

namespace detail {
template <class P>
struct fp8_config {
  using type = Fp8<>;
};
template <class P>
  requires requires { typename P::fp8::recipe; }
struct fp8_config<P> {
  using type = typename P::fp8;
};
}  // namespace detail

// The policy's Fp8, or Fp8<> (never used) for a policy without one.
template <Policy P>
using fp8_config_t = typename detail::fp8_config<P>::type;

template <Policy P>
inline constexpr bool needs_half_support_v = detail::policy_uses_v<P, half>;

template <Policy P>
inline constexpr bool needs_bfloat16_support_v = detail::policy_uses_v<P, bfloat16>;

template <Policy P>
constexpr std::string_view policy_name() {
  if constexpr (requires { P::name; }) return P::name;
  else return "user policy";
}

// --- a precision per layer ------------------------------------------------------------
// A layer may compute at another precision than its model: nn::Linear<KeepFp32<P>, B>
// in a model of policy P. Its inputs and outputs stay P's activation_type (the
// layer converts at its boundary); its parameters live in P's store, in the role
// its own policy's types pick (model/arena.hpp). A layer policy names its model's
// policy as model_policy; a model's policy is its own.
namespace detail {
template <class Q>
struct model_policy {
  using type = Q;
};
template <class Q>
  requires requires { typename Q::model_policy; }
struct model_policy<Q> {
  using type = typename Q::model_policy;
};

// "<a><b>" as a compile-time string_view.
template <const std::string_view& A, const std::string_view& B>
struct joined_name {
  static constexpr auto chars = [] {
    std::array<char, A.size() + B.size()> c{};
    for (std::size_t i = 0; i < A.size(); ++i) c[i] = A[i];
    for (std::size_t i = 0; i < B.size(); ++i) c[A.size() + i] = B[i];
    return c;
  }();
  static constexpr std::string_view value{chars.data(), chars.size()};
};
template <class M>
inline constexpr std::string_view policy_name_v = policy_name<M>();
inline constexpr std::string_view keep_fp32_suffix = "+fp32", no_fp8_suffix = "+no-fp8";
}  // namespace detail

// The policy of the model a layer of policy Q belongs to.
template <class Q>
using model_policy_t = typename detail::model_policy<Q>::type;

// A layer of a model of policy M kept in fp32: O0's types (fp32 weights without
// a separate master, fp32 gradients, every op in fp32, no FP8); the model's scaler.
template <Policy M>
struct KeepFp32 : O0Policy {
  using model_policy = model_policy_t<M>;
  static constexpr scaling loss_scaling = M::loss_scaling;
  static constexpr std::string_view name = detail::joined_name<detail::policy_name_v<M>, detail::keep_fp32_suffix>::value;
};

// A layer of a model of policy M with M's types but its GEMMs in compute_type<gemm>, not FP8.
template <Policy M>
struct NoFp8 : M {
  using fp8 = void;  // no fp8::recipe: uses_fp8_v is false
  using model_policy = model_policy_t<M>;
  static constexpr std::string_view name = detail::joined_name<detail::policy_name_v<M>, detail::no_fp8_suffix>::value;
};

}  // namespace amp
