#pragma once
// The opt levels the examples run, by their command-line names, and the device
// choice. Light on purpose: a program's main includes it without amp's model
// headers, and its levels' translation units hold the training (see
// examples/CMakeLists.txt, amp_example_levels).
#include <algorithm>
#include <string>
#include <vector>

#include <amp/backend/backend.hpp>
#include <amp/policy.hpp>
#if defined(__CUDACC__) || defined(AMP_EXAMPLE_CUDA)
#include <amp/backend/cuda/device.hpp>
#endif

namespace examples {

inline const std::vector<std::string> all_levels = {"O0", "O1", "O2", "O3", "O1-bf16", "O2-bf16", "O2-fp8"};

// Calls fn.template operator()<Policy>() for the policy named `level`.
template <class Fn>
void with_policy(const std::string& level, Fn&& fn) {
  if (level == "O0") fn.template operator()<amp::O0Policy>();
  else if (level == "O1") fn.template operator()<amp::O1Policy>();
  else if (level == "O2") fn.template operator()<amp::O2Policy>();
  else if (level == "O3") fn.template operator()<amp::O3Policy>();
  else if (level == "O1-bf16") fn.template operator()<amp::O1BF16Policy>();
  else if (level == "O2-bf16") fn.template operator()<amp::O2BF16Policy>();
  else if (level == "O2-fp8") fn.template operator()<amp::O2FP8Policy>();
  else amp::fail("unknown --opt-level '", level, "' (expected O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8|all)");
}

// "all", one level, or a comma-separated list ("O0,O2-bf16").
inline std::vector<std::string> parse_levels(const std::string& arg) {
  if (arg == "all") return all_levels;
  std::vector<std::string> levels;
  for (std::size_t start = 0; start <= arg.size();) {
    const std::size_t comma = std::min(arg.find(',', start), arg.size());
    const std::string level = arg.substr(start, comma - start);
    AMP_REQUIRE(std::find(all_levels.begin(), all_levels.end(), level) != all_levels.end(), "unknown --opt-level '",
                level, "' (expected O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8, a comma-separated list of them, or all)");
    levels.push_back(level);
    start = comma + 1;
  }
  return levels;
}

// "auto": the GPU when one is usable, else the CPU.
inline bool use_gpu(const std::string& device) {
  AMP_REQUIRE(device == "auto" || device == "cpu" || device == "cuda", "unknown --device '", device,
              "' (expected auto|cpu|cuda)");
  if (device == "cpu") return false;
#if defined(__CUDACC__) || defined(AMP_EXAMPLE_CUDA)
  const std::string reason = amp::cuda_unavailable_reason();
  AMP_REQUIRE(device != "cuda" || reason.empty(), "--device cuda: ", reason);
  return reason.empty();
#else
  AMP_REQUIRE(device != "cuda", "--device cuda: this program was built without its CUDA backend (rebuild with "
                                "the CUDA toolkit's nvcc on PATH and -DAMP_EXAMPLES_CUDA=ON)");
  return false;
#endif
}

// fn.template operator()<Backend>(): the GPU's backend or the CPU's.
template <class Fn>
decltype(auto) with_backend(bool gpu, Fn&& fn) {
#if defined(__CUDACC__) || defined(AMP_EXAMPLE_CUDA)
  if (gpu) return fn.template operator()<amp::cuda>();
#endif
  (void)gpu;
  return fn.template operator()<amp::host>();
}

}  // namespace examples
