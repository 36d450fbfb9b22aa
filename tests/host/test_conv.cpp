// The library convolution (oneDNN on the host) against a direct FP64
// convolution, pass by pass (support/conv_reference.hpp, shared with the CUDA
// twin on cuDNN), and amp's binding of oneDNN's C API against <dnnl.h>.
#include <doctest/doctest.h>

#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/amp.hpp"
#include "support/conv_reference.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;

namespace {

namespace v = amp::detail::onednn::value;
static_assert(v::unimplemented == dnnl_unimplemented && v::cpu == dnnl_cpu && v::in_order == dnnl_stream_default_flags);
static_assert(v::f32 == dnnl_f32 && v::bf16 == dnnl_bf16);
static_assert(v::any == dnnl_format_tag_any && v::nhwc == dnnl_nhwc && v::oihw == dnnl_oihw && v::x == dnnl_x);
static_assert(v::forward_training == dnnl_forward_training && v::backward_data == dnnl_backward_data &&
              v::backward_weights == dnnl_backward_weights && v::convolution_direct == dnnl_convolution_direct);
static_assert(v::scratchpad_user == dnnl_scratchpad_mode_user && v::query_scratchpad_md == dnnl_query_scratchpad_md &&
              v::query_exec_arg_md == dnnl_query_exec_arg_md && v::query_impl_info_str == dnnl_query_impl_info_str);
static_assert(v::arg_src == DNNL_ARG_SRC && v::arg_dst == DNNL_ARG_DST && v::arg_weights == DNNL_ARG_WEIGHTS &&
              v::arg_bias == DNNL_ARG_BIAS && v::arg_scratchpad == DNNL_ARG_SCRATCHPAD &&
              v::arg_diff_src == DNNL_ARG_DIFF_SRC && v::arg_diff_dst == DNNL_ARG_DIFF_DST &&
              v::arg_diff_weights == DNNL_ARG_DIFF_WEIGHTS && v::arg_diff_bias == DNNL_ARG_DIFF_BIAS);
static_assert(sizeof(amp::detail::onednn::memory_desc) >= sizeof(dnnl_memory_desc_t) &&
              alignof(amp::detail::onednn::memory_desc) >= alignof(dnnl_memory_desc_t));
static_assert(sizeof(amp::detail::onednn::op_desc) >= sizeof(dnnl_convolution_desc_t) &&
              alignof(amp::detail::onednn::op_desc) >= alignof(dnnl_convolution_desc_t));
static_assert(sizeof(amp::detail::onednn::dims) == sizeof(dnnl_dims_t));
static_assert(sizeof(amp::detail::onednn::exec_arg) == sizeof(dnnl_exec_arg_t));

}  // namespace

TEST_CASE_TEMPLATE("oneDNN convolution passes against an FP64 direct convolution", T, float, bfloat16) {
  Context<host> ctx;
  if (std::is_same_v<T, bfloat16> && !conv_available<T>(ctx, conv_cases()[1], true)) {
    // oneDNN 2.x convolves bf16 with AVX-512 only; elsewhere the layers take im2col + GEMM (test_layers).
    std::printf("[amp-skip] oneDNN has no bf16 convolution on this CPU (%s kernels)\n",
                std::string(amp::detail::onednn::isa_name()).c_str());
    return;
  }
  std::uint32_t seed = 11;
  for (const ConvGeometry& g : conv_cases())
    for (const bool bias : {true, false}) check_conv_passes<T>(ctx, g, bias, seed += 4);
  // Which kernels oneDNN chose on this CPU for the CNN's middle layer, for the log.
  auto& plan = amp::detail::conv_plan<T, T>(ctx.library_state<amp::detail::OnednnState>(), conv_cases()[1], true);
  MESSAGE("oneDNN ", sizeof(T) == 2 ? "bf16" : "fp32", " convolution kernels here: forward ",
          std::string(plan.forward.op.impl_name()), ", input gradient ", std::string(plan.backward_data.op.impl_name()),
          ", filter gradient ", std::string(plan.backward_weights.op.impl_name()));
}

TEST_CASE("oneDNN convolution: shapes it cannot run are refused, not run wrong") {
  Context<host> ctx;
  // Stride 3 over 8 pixels with no padding: the last row is never read (oneDNN
  // would need negative end padding); the layer takes its im2col path there.
  CHECK_FALSE(conv_available<float>(ctx, conv_geometry(1, 8, 8, 2, 2, 3, 3, 0, 1), true));
  // fp16 has no oneDNN convolution on CPUs in oneDNN 2.x.
  CHECK_FALSE(conv_available<half>(ctx, conv_geometry(1, 8, 8, 2, 2, 3, 1, 1, 1), true));
  std::vector<float> x(4), w(4), y(4);
  CHECK_THROWS_WITH_AS(conv_forward(ctx, conv_geometry(1, 8, 8, 2, 2, 3, 3, 0, 1), x.data(), w.data(),
                                    static_cast<const float*>(nullptr), y.data()),
                       doctest::Contains("oneDNN has no convolution for this shape"), Error);
}
