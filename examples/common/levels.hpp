#pragma once
// The opt levels the examples run, by their command-line names, and the device choice.
#include <algorithm>
#include <string>
#include <vector>

#include <amp/amp.hpp>

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
#if defined(__CUDACC__)
  const std::string reason = amp::cuda_unavailable_reason();
  AMP_REQUIRE(device != "cuda" || reason.empty(), "--device cuda: ", reason);
  return reason.empty();
#else
  AMP_REQUIRE(device != "cuda", "--device cuda: this program was built without nvcc, so it has no CUDA backend "
                                "(rebuild with the CUDA toolkit's nvcc on PATH)");
  return false;
#endif
}

// fn(ctx) with a fresh GPU or CPU context (threads: CPU threads, 0 for the default).
template <class Fn>
void with_context(bool gpu, int threads, Fn&& fn) {
#if defined(__CUDACC__)
  if (gpu) {
    amp::Context<amp::cuda> ctx;
    fn(ctx);
    return;
  }
#endif
  (void)gpu;
  amp::Context<amp::host> ctx(threads);
  fn(ctx);
}

// What ran the work, in one line: the CPU with oneDNN's kernels and the fp16
// conversions, or the GPU with its compute capability.
template <amp::Backend B>
std::string device_details(amp::Context<B>& ctx) {
  if constexpr (std::is_same_v<B, amp::host>) {
    const auto& cpu = amp::detail::host_cpu();
    return cpu.name + "; oneDNN " + amp::detail::onednn::version_string() + " " + amp::detail::onednn::isa_name() +
           " kernels; fp16 conversions " + (cpu.avx512f ? "AVX-512" : cpu.f16c ? "F16C" : "software");
  } else {
    const auto& cap = ctx.capability();
    return cap.name + " (compute capability " + std::to_string(cap.major) + "." + std::to_string(cap.minor) + ")";
  }
}

// "cpu (N threads)" or the GPU's name, for tables and JSON.
template <amp::Backend B>
std::string device_label(amp::Context<B>& ctx) {
  if constexpr (std::is_same_v<B, amp::host>) return "cpu (" + std::to_string(ctx.threads()) + " threads)";
  else return ctx.device_name();
}

}  // namespace examples
