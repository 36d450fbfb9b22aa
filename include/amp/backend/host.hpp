#pragma once
// The CPU backend: context, element-wise launches and reductions, oneDNN GEMMs and convolutions.
#include "amp/backend/host/algorithm.hpp"
#include "amp/backend/host/attention.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/backend/host/conv.hpp"
#include "amp/backend/host/fence.hpp"
#include "amp/backend/host/gemm.hpp"
#include "amp/backend/host/graph.hpp"
#include "amp/backend/host/mirror.hpp"

#include <string>

namespace amp {

// The CPU as amp uses it, in one line: its name, oneDNN's version and kernels, the fp16 conversions.
inline std::string host_details() {
  const auto& cpu = detail::host_cpu();
  return cpu.name + "; oneDNN " + detail::onednn::version_string() + " " + detail::onednn::isa_name() +
         " kernels; fp16 conversions " + (cpu.avx512f ? "AVX-512" : cpu.f16c ? "F16C" : "software");
}

}  // namespace amp
