#pragma once
// Convolution on cuDNN's graph API (what PyTorch's GPU convolutions run):
// fp32, fp16 and bf16, NHWC, fp32 accumulation. Each pass of each shape is
// planned once per context: an operation graph (forward with the bias add
// fused behind the convolution, so y rounds once), the first engine cuDNN's
// heuristics rank that is deterministic, sums in fp32 and, for fp32 data,
// keeps fp32 (no TF32: O0 means fp32), and its workspace size. A call runs
// the plan on the context's stream with the filter as the layer passes it,
// channels-last [K, kh, kw, C] (what cuDNN's NHWC kernels read): no
// allocation after the first call of a shape, no host sync, capturable.
// A shape is cuDNN's only when all three passes plan (the forward, the input
// gradient, the filter gradient): conv_available plans them together, and a
// shape where any has no engine (dilation, C = 1, odd channels may not) takes
// the layer's im2col path from its forward on, never an error in backward.
// An fp32 input gradient or filter gradient of 16-bit data is asked of cuDNN
// in fp32 first; where no engine writes fp32 it is written in T and widened.
#include <array>
#include <cstdio>
#include <map>
#include <tuple>
#include <type_traits>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/column_sums.hpp"
#include "amp/backend/conv.hpp"
#include "amp/backend/cuda/algorithm.cuh"
#include "amp/backend/cuda/cudnn.cuh"

namespace amp {

template <>
struct library_conv<cuda> : std::true_type {};

namespace detail {

template <class T>
inline constexpr bool cudnn_conv_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// Unique ids of a convolution graph's tensors.
enum conv_uid : std::int64_t { uid_x = 1, uid_w, uid_y, uid_bias, uid_sum };

// One pass: its plan, and whether its output is written in T and widened to fp32 after.
struct CudnnPass {
  cudnn::Plan plan;
  bool widens = false;
  bool planned = false;
};
struct CudnnConvPlan {
  CudnnPass forward, backward_data, backward_data_fp32, backward_weights;
  bool checked = false, usable = false;  // all three passes planned, each with an engine
};

// The plans of a context's convolution shapes.
class CudnnConvState {
 public:
  // The handle first: the plans made on it are freed before it.
  explicit CudnnConvState(Context<cuda>& ctx) { ctx.library_state<cudnn::Handle>(); }

  // Key: the geometry, the data type and whether there is a bias.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, bool>;
  CudnnConvPlan& plan(const Key& key) { return plans_[key]; }
  std::size_t size() const { return plans_.size(); }
  // Shapes where a pass has no allowed engine (the layer took im2col there).
  std::size_t without_engine() const {
    std::size_t n = 0;
    for (const auto& [key, p] : plans_) n += p.checked && !p.usable;
    return n;
  }
  // Gradient passes written in T and widened, for want of an engine that writes fp32.
  std::size_t passes_widened() const {
    std::size_t n = 0;
    for (const auto& [key, p] : plans_) n += p.backward_data_fp32.widens + p.backward_weights.widens;
    return n;
  }

 private:
  std::map<Key, CudnnConvPlan> plans_;
};

template <class T>
CudnnConvPlan& cudnn_conv_plan(Context<cuda>& ctx, const ConvGeometry& g, bool has_bias) {
  return ctx.library_state<CudnnConvState>().plan({g.n, g.h, g.w, g.c, g.k, g.kh, g.kw, g.stride, g.pad, g.dilation,
                                                   cudnn::data_type<T>(), has_bias});
}

// The tensors of a convolution, channels-last: images [N, H, W, C], filters [K, kh, kw, C].
inline cudnn::Descriptor image(std::int64_t uid, cudnnDataType_t type, std::int64_t n, std::int64_t h, std::int64_t w,
                               std::int64_t c, bool is_virtual = false) {
  return cudnn::tensor(uid, type, {n, c, h, w}, {h * w * c, 1, w * c, c}, is_virtual);
}
inline cudnn::Descriptor filter(cudnnDataType_t type, const ConvGeometry& g) {
  return cudnn::tensor(uid_w, type, {g.k, g.c, g.kh, g.kw}, {g.c * g.kh * g.kw, 1, g.kw * g.c, g.c});
}
inline cudnn::Descriptor convolution(const ConvGeometry& g) {
  const std::int64_t spatial = 2, pad[2] = {g.pad, g.pad}, stride[2] = {g.stride, g.stride},
                     dilation[2] = {g.dilation, g.dilation};
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnn::Descriptor d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, &spatial)
      .set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, pad, 2)
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, pad, 2)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, dilation, 2)
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, stride, 2)
      .finalize();
  return d;
}

// One of the three convolution operations on tensors a, b (its inputs) and out,
// with alpha 1 and beta 0 (cuDNN overwrites).
// names: a, b, out, the convolution, alpha, beta.
inline cudnn::Descriptor conv_op(cudnnBackendDescriptorType_t type, std::array<cudnnBackendAttributeName_t, 6> names,
                                 cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t out,
                                 cudnnBackendDescriptor_t conv) {
  const float one = 1.0f, zero = 0.0f;
  cudnn::Descriptor op(type);
  op.set(names[0], a).set(names[1], b).set(names[2], out).set(names[3], conv);
  op.set(names[4], CUDNN_TYPE_FLOAT, &one).set(names[5], CUDNN_TYPE_FLOAT, &zero);
  return op;
}

template <class T>
cudnn::Notes conv_notes() {
  return {.tensor_cores = !std::is_same_v<T, float>};
}

template <class T>
cudnn::Plan plan_forward(cudnnHandle_t handle, const ConvGeometry& g, bool has_bias) {
  constexpr cudnnDataType_t t = cudnn::data_type<T>();
  cudnn::Graph graph;
  const auto x = graph.keep(image(uid_x, t, g.n, g.h, g.w, g.c));
  const auto w = graph.keep(filter(t, g));
  const auto y = graph.keep(image(uid_y, t, g.n, g.ho, g.wo, g.k));
  const auto conv = graph.keep(convolution(g));
  // With a bias the convolution's fp32 sum stays inside the graph, and the add rounds once into y.
  const auto sum = has_bias ? graph.keep(image(uid_sum, CUDNN_DATA_FLOAT, g.n, g.ho, g.wo, g.k, true)) : y;
  graph.add(conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
                    x, w, sum, conv));
  if (has_bias) {
    const auto bias = graph.keep(cudnn::tensor(uid_bias, t, {1, g.k, 1, 1}, {g.k, 1, g.k, g.k}));
    const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    cudnn::Descriptor add(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    add.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision)
        .finalize();
    cudnn::Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, graph.keep(std::move(add)))
        .set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, sum)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, bias)
        .set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    graph.add(std::move(op));
  }
  return std::move(graph).plan(handle, conv_notes<T>());
}

// A backward pass, its output in type `out`: the input gradient dx from dy and
// the filter, or (weights) the filter gradient dw [K, kh, kw, C] from x and dy.
template <class T>
cudnn::Plan plan_backward(cudnnHandle_t handle, const ConvGeometry& g, cudnnDataType_t out, bool weights) {
  constexpr cudnnDataType_t t = cudnn::data_type<T>();
  cudnn::Graph graph;
  const auto x = graph.keep(image(uid_x, weights ? t : out, g.n, g.h, g.w, g.c));
  const auto w = graph.keep(filter(weights ? out : t, g));
  const auto dy = graph.keep(image(uid_y, t, g.n, g.ho, g.wo, g.k));
  const auto conv = graph.keep(convolution(g));
  if (weights)
    graph.add(conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
                      x, dy, w, conv));
  else
    graph.add(conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                      {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
                      dy, w, x, conv));
  return std::move(graph).plan(handle, conv_notes<T>());
}

// A pass of output type D (or T where D is fp32 and no engine writes it), planned on first use.
template <class T, class D, class Make>
CudnnPass& planned_pass(CudnnPass& pass, Make make) {
  if (pass.planned) return pass;
  pass.plan = make(cudnn::data_type<D>());
  if (!pass.plan && !std::is_same_v<T, D>) {
    pass.plan = make(cudnn::data_type<T>());
    pass.widens = static_cast<bool>(pass.plan);
  }
  pass.planned = true;
  return pass;
}

// Scratch for one pass, 256-byte aligned pieces: the workspace, the filter
// gradient channels-last, the bias, and an output to widen.
struct CudnnScratch {
  void *workspace, *filter, *bias, *widen;
};
inline CudnnScratch take_scratch(Context<cuda>& ctx, const CudnnPass& pass, std::size_t filter_bytes,
                                 std::size_t bias_bytes, std::size_t widen_bytes) {
  const auto up = [](std::size_t b) { return (b + 255) / 256 * 256; };
  const std::size_t at_filter = up(pass.plan.workspace_bytes()), at_bias = at_filter + up(filter_bytes),
                    at_widen = at_bias + up(bias_bytes);
  auto* base = ctx.scratch<unsigned char>(scratch_slot::conv, at_widen + up(widen_bytes));
  return {base, base + at_filter, base + at_bias, base + at_widen};
}

}  // namespace detail

// cuDNN has the convolution for input type T and input-gradient type D (T or
// fp32) for this shape: its three passes are planned together on first use.
template <class T, class D = T>
bool conv_available(Context<cuda>& ctx, const ConvGeometry& g, bool has_bias) {
  if constexpr (!detail::cudnn_conv_type_v<T> || !(std::is_same_v<D, T> || std::is_same_v<D, float>)) {
    return false;
  } else {
    auto& plan = detail::cudnn_conv_plan<T>(ctx, g, has_bias);
    if (!plan.checked) {
      ctx.activate();
      const cudnnHandle_t handle = ctx.library_state<detail::cudnn::Handle>().get();
      plan.forward.plan = detail::plan_forward<T>(handle, g, has_bias);
      plan.forward.planned = true;
      const auto data = [&](cudnnDataType_t out) { return detail::plan_backward<T>(handle, g, out, false); };
      const auto weights = [&](cudnnDataType_t out) { return detail::plan_backward<T>(handle, g, out, true); };
      // An fp32 input gradient falls back to T and widens, so its T plan stands for both.
      const bool forward = static_cast<bool>(plan.forward.plan),
                 backward_data = forward && detail::planned_pass<T, T>(plan.backward_data, data).plan,
                 backward_weights = backward_data && detail::planned_pass<T, float>(plan.backward_weights, weights).plan;
      plan.usable = backward_weights;
      plan.checked = true;
      if (!plan.usable)
        std::fprintf(stderr,
                     "amp: cuDNN %zu has no allowed engine for the %s of a %lldx%lldx%lldx%lld convolution to %lld "
                     "channels (kernel %lld, stride %lld, pad %lld, dilation %lld, cudnnDataType %d): the layer runs "
                     "it as im2col and GEMMs (logged once per shape)\n",
                     cudnnGetVersion(), !forward ? "forward" : !backward_data ? "input gradient" : "filter gradient",
                     static_cast<long long>(g.n), static_cast<long long>(g.h), static_cast<long long>(g.w),
                     static_cast<long long>(g.c), static_cast<long long>(g.k), static_cast<long long>(g.kh),
                     static_cast<long long>(g.stride), static_cast<long long>(g.pad),
                     static_cast<long long>(g.dilation), static_cast<int>(detail::cudnn::data_type<T>()));
    }
    return plan.usable;
  }
}

namespace detail {
// The plans of a shape conv_available accepted; a pass asked for on a shape it refused is amp's bug.
template <class T, class D>
CudnnConvPlan& cudnn_planned(Context<cuda>& ctx, const ConvGeometry& g, bool has_bias, const char* pass) {
  AMP_REQUIRE((conv_available<T, D>(ctx, g, has_bias)), pass, ": cuDNN has no convolution for this shape");
  ctx.activate();
  return cudnn_conv_plan<T>(ctx, g, has_bias);
}
inline std::size_t filter_elements(const ConvGeometry& g) { return static_cast<std::size_t>(g.k * g.window()); }
inline TapMajorIndex tap_major(const ConvGeometry& g) { return {g.c, g.kh * g.kw}; }
}  // namespace detail

// y = conv(x, w) + bias, y in T; w channels-last [K, kh, kw, C].
template <class T>
void conv_forward(Context<cuda>& ctx, const ConvGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  auto& pass = detail::cudnn_planned<T, T>(ctx, g, bias != nullptr, "conv_forward").forward;
  const auto s = detail::take_scratch(ctx, pass, 0, bias ? g.k * sizeof(T) : 0, 0);
  T* filter = const_cast<T*>(w);
  const cudnnHandle_t handle = ctx.library_state<detail::cudnn::Handle>().get();
  ctx.count_launch();
  if (bias) {
    ctx.copy(s.bias, bias, static_cast<std::size_t>(g.k) * sizeof(T));  // to an aligned place
    pass.plan.run(handle, {detail::uid_x, detail::uid_w, detail::uid_bias, detail::uid_y},
                  {const_cast<T*>(x), filter, s.bias, y}, s.workspace);
  } else {
    pass.plan.run(handle, {detail::uid_x, detail::uid_w, detail::uid_y}, {const_cast<T*>(x), filter, y}, s.workspace);
  }
}

// dx = the input gradient of dy through w [K, kh, kw, C] (overwritten, in D: T or fp32).
template <class T, class D>
void conv_backward_data(Context<cuda>& ctx, const ConvGeometry& g, const T* dy, const T* w, D* dx, bool has_bias) {
  auto& plan = detail::cudnn_planned<T, D>(ctx, g, has_bias, "conv_backward_data");
  const cudnnHandle_t handle = ctx.library_state<detail::cudnn::Handle>().get();
  detail::CudnnPass* chosen = &plan.backward_data;
  if constexpr (!std::is_same_v<D, T>) {  // fp32 asked of cuDNN once; without an engine, T's plan and a widening
    auto& fp32 = plan.backward_data_fp32;
    if (!fp32.planned) {
      fp32.plan = detail::plan_backward<T>(handle, g, CUDNN_DATA_FLOAT, false);
      fp32.widens = !fp32.plan;
      fp32.planned = true;
    }
    if (fp32.plan) chosen = &fp32;
  }
  auto& pass = *chosen;
  const bool widens = !std::is_same_v<D, T> && chosen == &plan.backward_data;
  const std::size_t inputs = static_cast<std::size_t>(g.n * g.h * g.w * g.c);
  const auto s = detail::take_scratch(ctx, pass, 0, 0, widens ? inputs * sizeof(T) : 0);
  ctx.count_launch();
  pass.plan.run(handle, {detail::uid_y, detail::uid_w, detail::uid_x},
                {const_cast<T*>(dy), const_cast<T*>(w), widens ? s.widen : static_cast<void*>(dx)}, s.workspace);
  if (widens) convert(ctx, Span<const T>{static_cast<const T*>(s.widen), inputs}, Span<D>{dx, inputs});
}

// dw [K, C, kh, kw] and dbias (when not null) from x and dy, overwritten in fp32.
template <class T, class D = T>
void conv_backward_weights(Context<cuda>& ctx, const ConvGeometry& g, const T* x, const T* dy, float* dw, float* dbias) {
  auto& pass = detail::cudnn_planned<T, D>(ctx, g, dbias != nullptr, "conv_backward_weights").backward_weights;
  const cudnnHandle_t handle = ctx.library_state<detail::cudnn::Handle>().get();
  const std::size_t count = detail::filter_elements(g);
  const std::size_t partials = dbias ? column_sum_partials(g.pixels(), g.k) : 0;
  const auto s = detail::take_scratch(ctx, pass, count * (pass.widens ? sizeof(T) : sizeof(float)), 0,
                                      partials * sizeof(float));
  ctx.count_launch();
  pass.plan.run(handle, {detail::uid_x, detail::uid_y, detail::uid_w}, {const_cast<T*>(x), const_cast<T*>(dy), s.filter},
                s.workspace);
  if (pass.widens)
    for_each(ctx, count, detail::FromTapMajorOp<T>{static_cast<const T*>(s.filter), dw, detail::tap_major(g)});
  else
    for_each(ctx, count, detail::FromTapMajorOp<float>{static_cast<const float*>(s.filter), dw, detail::tap_major(g)});
  if (dbias)
    column_sums(ctx, g.pixels(), g.k, detail::ValueAt<T>{dy, g.k}, static_cast<float*>(s.widen), dbias);
}

}  // namespace amp
