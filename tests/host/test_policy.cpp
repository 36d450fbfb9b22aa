#include <doctest/doctest.h>

#include <iostream>
#include <type_traits>

#include "amp/backend/capability.hpp"
#include "amp/core/traits.hpp"
#include "amp/policy.hpp"

using namespace amp;

template <class P, class Param, class Master, class Grad, class Act, class Norm, class Gemm, class Soft, scaling S>
constexpr bool row_is() {
  return std::is_same_v<typename P::param_type, Param> && std::is_same_v<typename P::master_type, Master> &&
         std::is_same_v<typename P::grad_type, Grad> && std::is_same_v<typename P::activation_type, Act> &&
         std::is_same_v<typename P::norm_param_type, Norm> &&
         std::is_same_v<typename P::template compute_type<op::gemm>, Gemm> &&
         std::is_same_v<typename P::template compute_type<op::conv>, Gemm> &&
         std::is_same_v<typename P::template compute_type<op::softmax>, Soft> &&
         std::is_same_v<typename P::template compute_type<op::norm>, Soft> &&
         std::is_same_v<typename P::template compute_type<op::loss>, Soft> &&
         P::loss_scaling == S;
}

// The DESIGN.md table, row by row.
static_assert(row_is<O0Policy, float, float, float, float, float, float, float, scaling::none>());
static_assert(row_is<O1Policy, float, float, float, half, float, half, float, scaling::dynamic>());
static_assert(row_is<O2Policy, half, float, half, half, float, half, float, scaling::dynamic>());
static_assert(row_is<O3Policy, half, half, half, half, half, half, half, scaling::static_scale>());
static_assert(row_is<O1BF16Policy, float, float, float, amp::bfloat16, float, amp::bfloat16, float, scaling::none>());
static_assert(row_is<O2BF16Policy, amp::bfloat16, float, amp::bfloat16, amp::bfloat16, float, amp::bfloat16, float, scaling::none>());

static_assert(!uses_master_weights_v<O0Policy> && !uses_master_weights_v<O1Policy> && uses_master_weights_v<O2Policy> &&
              !uses_master_weights_v<O3Policy> && uses_master_weights_v<O2BF16Policy>);
// O2 keeps fp32 norm parameters, so they need no master copy; its fp16 weights do.
static_assert(!keeps_master_v<O2Policy, O2Policy::norm_param_type> && keeps_master_v<O2Policy, O2Policy::param_type>);
static_assert(casts_weights_v<O1Policy> && !casts_weights_v<O2Policy> && !casts_weights_v<O0Policy>);
static_assert(Policy<O0Policy> && Policy<O1Policy> && Policy<O2Policy> && Policy<O3Policy> &&
              Policy<O1BF16Policy> && Policy<O2BF16Policy>);
static_assert(!Policy<int> && !Policy<float>);

// A user policy: O1, but keep activations in fp32. One alias, everything else inherited.
struct O1Fp32Activations : O1Policy {
  using activation_type = float;
};
static_assert(Policy<O1Fp32Activations>);
static_assert(std::is_same_v<O1Fp32Activations::compute_type<op::gemm>, half>);
static_assert(std::is_same_v<O1Fp32Activations::activation_type, float>);
static_assert(casts_weights_v<O1Fp32Activations>);

struct NotAPolicy {
  using param_type = double;  // not an amp scalar
};
static_assert(!Policy<NotAPolicy>);

template <class P>
void print_row() {
  std::cout << "  " << policy_name<P>() << "\tparam " << type_name<typename P::param_type>() << "\tmaster "
            << type_name<typename P::master_type>() << "\tgrad " << type_name<typename P::grad_type>() << "\tact "
            << type_name<typename P::activation_type>() << "\tgemm "
            << type_name<typename P::template compute_type<op::gemm>>() << "\tloss "
            << type_name<typename P::template compute_type<op::loss>>() << "\n";
}

TEST_CASE("policy table at run time") {
  std::cout << "policy table:\n";
  print_row<O0Policy>();
  print_row<O1Policy>();
  print_row<O2Policy>();
  print_row<O3Policy>();
  print_row<O1BF16Policy>();
  print_row<O2BF16Policy>();
  CHECK(policy_name<O2Policy>() == "O2");
  CHECK(policy_name<O1BF16Policy>() == "O1-bf16");
  CHECK(type_name<O2Policy::param_type>() == "fp16");
  CHECK(type_name<O2BF16Policy::master_type>() == "fp32");
}

TEST_CASE("GPU capability check per policy") {
  const DeviceCapability pascal{"Tesla P100-PCIE-16GB", 6, 0};
  const DeviceCapability volta{"Tesla V100-SXM2-16GB", 7, 0};
  const DeviceCapability hopper{"NVIDIA H200", 9, 0};

  CHECK_FALSE(unsupported_reason<O0Policy>(pascal));
  const auto reason = unsupported_reason<O2Policy>(pascal);
  REQUIRE(reason);
  CHECK(reason->find("O2") != std::string::npos);
  CHECK(reason->find("Tesla P100-PCIE-16GB") != std::string::npos);
  CHECK(reason->find("6.0") != std::string::npos);
  CHECK(reason->find("7.0+") != std::string::npos);
  CHECK_THROWS_AS(require_support<O1Policy>(pascal), Error);

  CHECK_FALSE(unsupported_reason<O1Policy>(volta));
  CHECK_FALSE(unsupported_reason<O3Policy>(volta));
  const auto bf16 = unsupported_reason<O2BF16Policy>(volta);
  REQUIRE(bf16);
  CHECK(bf16->find("8.0+") != std::string::npos);
  CHECK(bf16->find("7.0") != std::string::npos);

  CHECK_FALSE(unsupported_reason<O1BF16Policy>(hopper));
  CHECK_FALSE(unsupported_reason<O1Fp32Activations>(volta));
  CHECK(unsupported_reason<O1Fp32Activations>(pascal));
}
