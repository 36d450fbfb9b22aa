#pragma once
// Which GPUs can run which policy. Pure host logic, so it is tested without a GPU:
// fp16 tensor cores arrive with Volta (7.0), bf16 with Ampere (8.0), FP8 with Ada (8.9).
#include <optional>
#include <string>
#include <string_view>

#include "amp/core/error.hpp"
#include "amp/policy.hpp"

namespace amp {

struct DeviceCapability {
  std::string name;
  int major = 0;
  int minor = 0;
};

// The reason `dev` cannot run policy P, or nothing when it can.
template <Policy P>
std::optional<std::string> unsupported_reason(const DeviceCapability& dev) {
  const int cc = dev.major * 10 + dev.minor;
  const char* need = nullptr;
  if (uses_fp8_v<P> && cc < 89) {
    need = "FP8 tensor cores (compute capability 8.9+, Ada or Hopper)";
  } else if (needs_bfloat16_support_v<P> && cc < 80) {
    need = "bf16 tensor cores (compute capability 8.0+, Ampere or newer)";
  } else if (needs_half_support_v<P> && cc < 70) {
    need = "fp16 tensor cores (compute capability 7.0+, Volta or newer)";
  }
  if (!need) return std::nullopt;
  return detail::concat("policy ", policy_name<P>(), " needs ", need, ", but GPU '", dev.name,
                        "' has compute capability ", dev.major, ".", dev.minor,
                        "; use amp::", uses_fp8_v<P> && cc >= 80 ? "O2BF16Policy" : "O0Policy", " on this GPU");
}

template <Policy P>
void require_support(const DeviceCapability& dev) {
  if (auto reason = unsupported_reason<P>(dev)) throw Error(*reason);
}

}  // namespace amp
