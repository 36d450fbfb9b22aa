#pragma once
// A level's context on backend B, what to call that device in tables and
// JSON, and the communicator of a --distributed job on it. The levels'
// translation units include it; the device choice (common/levels.hpp) is main's.
#include <string>
#include <type_traits>

#include <amp/amp.hpp>
#if defined(AMP_EXAMPLE_PARALLEL)
#include <amp/parallel.hpp>
#endif

#include "common/distributed.hpp"

namespace examples {

// fn(ctx) with a fresh context of backend B (threads: CPU threads, 0 for the default).
template <amp::Backend B, class Fn>
decltype(auto) with_context(int threads, Fn&& fn) {
  if constexpr (std::is_same_v<B, amp::host>) {
    amp::Context<amp::host> ctx(threads);
    return fn(ctx);
  } else {
    amp::Context<amp::cuda> ctx;
    return fn(ctx);
  }
}

// What ran the work, in one line: the CPU with oneDNN's kernels and the fp16
// conversions, or the GPU with its compute capability.
template <amp::Backend B>
std::string device_details(amp::Context<B>& ctx) {
  if constexpr (std::is_same_v<B, amp::host>) {
    return amp::host_details();
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

// f(comm): comm is this job's communicator for ctx (MPI's on the CPU, NCCL
// bootstrapped over MPI on the GPU), or nullptr when the process is alone.
template <amp::Backend B, class F>
auto with_collective(amp::Context<B>& ctx, F&& f) {
#if defined(AMP_EXAMPLE_PARALLEL)
  if (dist.comm) {
    if constexpr (std::is_same_v<B, amp::host>) {
      return f(static_cast<amp::Collective<B>*>(&*dist.comm));
    } else {
#if defined(__CUDACC__)  // NCCL exists only under nvcc; a host-only build has no other backend
      amp::parallel::NcclCommunicator nccl(*dist.comm, ctx);
      auto r = f(static_cast<amp::Collective<B>*>(&nccl));
      nccl.synchronize();
      return r;
#endif
    }
  }
#endif
  (void)ctx;
  return f(static_cast<amp::Collective<B>*>(nullptr));
}

}  // namespace examples
