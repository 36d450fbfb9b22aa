#pragma once
// Convolution on oneDNN's primitives (what PyTorch's CPU convolutions run):
// fp32, and bf16 with fp32 accumulation on AVX512-BF16 / AMX kernels. Each
// pass of each shape is planned once per context: the primitive with the
// filter layout oneDNN prefers, the reorders of the [K, C, kh, kw] filter into
// it and of the fp32 filter gradient out of it, and their scratch sizes. A call
// then takes its scratch from the context's conv slot and issues one launch
// (Context<host>::issue), so a recorded step keeps its pointers and reruns the
// same primitives. Shapes oneDNN cannot run (it answers "unimplemented", e.g.
// bf16 on a CPU without AVX-512) report false from conv_available, and the
// layer takes its im2col path instead.
#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/conv.hpp"
#include "amp/backend/host/context.hpp"
#include "amp/backend/host/onednn.hpp"
#include "amp/core/error.hpp"
#include "amp/core/numeric.hpp"

namespace amp {

template <>
struct library_conv<host> : std::true_type {};

namespace detail {

template <class T>
inline constexpr bool onednn_conv_type_v = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>;

template <class T>
constexpr int onednn_type() {
  return std::is_same_v<T, float> ? onednn::value::f32 : onednn::value::bf16;
}

inline void check_conv(onednn::status status, const char* what, const ConvGeometry& g) {
  AMP_REQUIRE(status == 0, "oneDNN convolution: ", what, " failed (status ", status, ") for a ", g.kh, "x", g.kw,
              " filter over [", g.n, ", ", g.h, ", ", g.w, ", ", g.c, "] into ", g.k, " channels");
}
inline void check_conv(onednn::status status, const char* what) {
  AMP_REQUIRE(status == 0, "oneDNN convolution: ", what, " failed (status ", status, ")");
}

// A primitive and its descriptor, with one memory object per argument it was run with.
class OnednnPrimitive {
 public:
  OnednnPrimitive() = default;
  OnednnPrimitive(onednn::primitive_desc pd, const ConvGeometry& g) : pd_(pd), g_(g) {
    check_conv(onednn::primitive_create(&p_, pd), "primitive creation", g);
  }
  OnednnPrimitive(OnednnPrimitive&& o) noexcept { *this = std::move(o); }
  OnednnPrimitive& operator=(OnednnPrimitive&& o) noexcept {
    std::swap(pd_, o.pd_), std::swap(p_, o.p_), std::swap(args_, o.args_), std::swap(g_, o.g_);
    return *this;
  }
  ~OnednnPrimitive() {
    for (auto& a : args_) onednn::memory_destroy(a.mem);
    if (p_) onednn::primitive_destroy(p_);
    if (pd_) onednn::primitive_desc_destroy(pd_);
  }

  explicit operator bool() const { return p_ != nullptr; }
  onednn::primitive_desc desc() const { return pd_; }
  const onednn::memory_desc* md(int arg) const {
    return onednn::primitive_desc_query_md(pd_, onednn::value::query_exec_arg_md, arg);
  }
  std::size_t scratch_bytes() const {
    return onednn::memory_desc_get_size(onednn::primitive_desc_query_md(pd_, onednn::value::query_scratchpad_md, 0));
  }

  // The implementation oneDNN chose (e.g. "brg:avx512_core_amx"), for messages.
  const char* impl_name() const {
    const char* name = "?";
    onednn::primitive_desc_query(pd_, onednn::value::query_impl_info_str, 0, static_cast<void*>(&name));
    return name;
  }

  // Runs on these buffers: (argument, address) pairs, the scratchpad among them.
  void run(onednn::engine e, onednn::stream s, std::initializer_list<std::pair<int, const void*>> buffers) {
    std::array<onednn::exec_arg, 6> args{};
    AMP_REQUIRE(buffers.size() <= args.size(), "oneDNN convolution: ", buffers.size(), " arguments");
    std::size_t count = 0;
    for (const auto& [arg, ptr] : buffers) {
      auto it = std::find_if(args_.begin(), args_.end(), [arg](const auto& a) { return a.arg == arg; });
      if (it == args_.end()) {
        onednn::memory m = nullptr;
        check_conv(onednn::memory_create(&m, md(arg), e, nullptr), "memory creation", g_);
        it = args_.insert(args_.end(), {arg, m});
      }
      check_conv(onednn::memory_set_data_handle(it->mem, const_cast<void*>(ptr)), "memory binding", g_);
      args[count++] = *it;
    }
    check_conv(onednn::primitive_execute(p_, s, static_cast<int>(count), args.data()), "execution", g_);
  }

 private:
  onednn::primitive_desc pd_ = nullptr;
  onednn::primitive p_ = nullptr;
  std::vector<onednn::exec_arg> args_;
  ConvGeometry g_{};
};

// One pass of a convolution: its primitive, and the reorder of the filter (or
// of its gradient) between PyTorch's layout and the one the primitive chose.
struct OnednnPass {
  OnednnPrimitive op, reorder;  // reorder: empty when the layouts agree
  std::size_t filter_bytes = 0;  // the filter in the primitive's layout
};
// The three passes of one convolution shape and its types, each made on first use.
struct OnednnConvPlan {
  OnednnPass forward, backward_data, backward_weights;
  bool unimplemented = false;
};

// oneDNN's engine and stream for one context, and the plans of its shapes.
class OnednnState {
 public:
  explicit OnednnState(Context<host>&) {
    check_conv(onednn::engine_create(&engine_, onednn::value::cpu, 0), "engine creation");
    check_conv(onednn::stream_create(&stream_, engine_, onednn::value::in_order), "stream creation");
    check_conv(onednn::primitive_attr_create(&attr_), "attribute creation");
    check_conv(onednn::primitive_attr_set_scratchpad_mode(attr_, onednn::value::scratchpad_user), "scratchpad mode");
  }
  OnednnState(const OnednnState&) = delete;
  OnednnState& operator=(const OnednnState&) = delete;
  ~OnednnState() {
    plans_.clear();
    onednn::primitive_attr_destroy(attr_);
    onednn::stream_destroy(stream_);
    onednn::engine_destroy(engine_);
  }

  onednn::engine engine() const { return engine_; }
  onednn::stream stream() const { return stream_; }
  onednn::primitive_attr attr() const { return attr_; }

  // Key: the geometry, the data type, the input-gradient type and whether there is a bias.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                         std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, int, bool>;
  OnednnConvPlan& plan(const Key& key) { return plans_[key]; }

 private:
  onednn::engine engine_ = nullptr;
  onednn::stream stream_ = nullptr;
  onednn::primitive_attr attr_ = nullptr;
  std::map<Key, OnednnConvPlan> plans_;
};

// Memory descriptors and the op descriptors of one convolution.
struct OnednnConvDesc {
  onednn::memory_desc src, weights, plain_weights, grad_weights, plain_grad_weights, bias, grad_bias, dst, diff_src;
  onednn::dims strides{}, dilates{}, pad_l{}, pad_r{};
  bool has_bias;

  OnednnConvDesc(const ConvGeometry& g, int type, int diff_src_type, bool bias_) : has_bias(bias_) {
    namespace v = onednn::value;
    const onednn::dims x{g.n, g.c, g.h, g.w}, w{g.k, g.c, g.kh, g.kw}, y{g.n, g.k, g.ho, g.wo}, b{g.k};
    check_conv(onednn::memory_desc_init_by_tag(&src, 4, x, type, v::nhwc), "source description", g);
    check_conv(onednn::memory_desc_init_by_tag(&diff_src, 4, x, diff_src_type, v::nhwc), "source description", g);
    check_conv(onednn::memory_desc_init_by_tag(&dst, 4, y, type, v::nhwc), "output description", g);
    check_conv(onednn::memory_desc_init_by_tag(&weights, 4, w, type, v::any), "filter description", g);
    check_conv(onednn::memory_desc_init_by_tag(&plain_weights, 4, w, type, v::ohwi), "filter description", g);
    check_conv(onednn::memory_desc_init_by_tag(&grad_weights, 4, w, v::f32, v::any), "filter description", g);
    check_conv(onednn::memory_desc_init_by_tag(&plain_grad_weights, 4, w, v::f32, v::oihw), "filter description", g);
    check_conv(onednn::memory_desc_init_by_tag(&bias, 1, b, type, v::x), "bias description", g);
    check_conv(onednn::memory_desc_init_by_tag(&grad_bias, 1, b, v::f32, v::x), "bias description", g);
    strides[0] = strides[1] = g.stride;
    dilates[0] = dilates[1] = g.dilation - 1;  // oneDNN counts the gaps
    pad_l[0] = pad_l[1] = g.pad;
    pad_r[0] = g.pad_end_h(), pad_r[1] = g.pad_end_w();
  }
};

}  // namespace detail

namespace detail {

// The reorder from one layout to the other, or none when they are the same.
inline void plan_reorder(OnednnState& state, OnednnPass& pass, const onednn::memory_desc* from,
                         const onednn::memory_desc* to, const ConvGeometry& g) {
  pass.filter_bytes = onednn::memory_desc_get_size(to);
  if (onednn::memory_desc_equal(from, to)) return;
  onednn::primitive_desc pd = nullptr;
  check_conv(onednn::reorder_primitive_desc_create(&pd, from, state.engine(), to, state.engine(), nullptr),
               "filter reorder planning", g);
  pass.reorder = OnednnPrimitive(pd, g);
}

// A pass's primitive from its op descriptor (the forward's descriptor as the hint for backward).
inline OnednnPrimitive plan_pass(OnednnState& state, const onednn::op_desc& op, onednn::primitive_desc hint,
                                 const ConvGeometry& g, const char* what) {
  onednn::primitive_desc pd = nullptr;
  check_conv(onednn::primitive_desc_create(&pd, &op, state.attr(), state.engine(), hint), what, g);
  return OnednnPrimitive(pd, g);
}

template <class T, class D>
OnednnConvPlan& conv_plan(OnednnState& state, const ConvGeometry& g, bool has_bias) {
  return state.plan({g.n, g.h, g.w, g.c, g.k, g.kh, g.kw, g.stride, g.pad, g.dilation, onednn_type<T>(),
                     onednn_type<D>(), has_bias});
}

// Scratch for one pass: oneDNN's scratchpad, then the filter in the pass's layout.
struct OnednnScratch {
  void* pad;
  void* filter;
};
inline OnednnScratch take_scratch(Context<host>& ctx, const OnednnPass& pass) {
  const std::size_t pad = (pass.op.scratch_bytes() + 63) / 64 * 64;
  auto* base = ctx.scratch<unsigned char>(scratch_slot::conv, pad + pass.filter_bytes + 64);
  return {base, base + pad};
}

}  // namespace detail

// The library's convolution for input type T and input-gradient type D (fp32
// or bf16 each) is there for this shape: plans the forward on first use.
template <class T, class D = T>
bool conv_available(Context<host>& ctx, const ConvGeometry& g, bool has_bias) {
  if constexpr (!detail::onednn_conv_type_v<T> || !detail::onednn_conv_type_v<D>) {
    return false;
  } else {
    if (g.pad_end_h() < 0 || g.pad_end_w() < 0) return false;  // a stride that skips the last rows
    auto& state = ctx.library_state<detail::OnednnState>();
    auto& plan = detail::conv_plan<T, D>(state, g, has_bias);
    if (plan.forward.op || plan.unimplemented) return !plan.unimplemented;
    namespace v = detail::onednn::value;
    detail::OnednnConvDesc d(g, detail::onednn_type<T>(), detail::onednn_type<D>(), has_bias);
    detail::onednn::op_desc op;
    detail::check_conv(detail::onednn::convolution_forward_desc_init(&op, v::forward_training, v::convolution_direct,
                                                                       &d.src, &d.weights, has_bias ? &d.bias : nullptr,
                                                                       &d.dst, d.strides, d.dilates, d.pad_l, d.pad_r),
                         "forward description", g);
    detail::onednn::primitive_desc pd = nullptr;
    const auto status = detail::onednn::primitive_desc_create(&pd, &op, state.attr(), state.engine(), nullptr);
    if (status == v::unimplemented) {
      plan.unimplemented = true;
      return false;
    }
    detail::check_conv(status, "forward planning", g);
    plan.forward.op = detail::OnednnPrimitive(pd, g);
    detail::plan_reorder(state, plan.forward, &d.plain_weights, plan.forward.op.md(v::arg_weights), g);
    return true;
  }
}

namespace detail {

// The plan of a planned shape, or an amp::Error naming the pass.
template <class T, class D>
OnednnConvPlan& planned(Context<host>& ctx, const ConvGeometry& g, bool has_bias, const char* pass) {
  AMP_REQUIRE((conv_available<T, D>(ctx, g, has_bias)), pass, ": oneDNN has no convolution for this shape");
  return conv_plan<T, D>(ctx.library_state<OnednnState>(), g, has_bias);
}

// The filter w in the pass's layout: w itself, or its reorder into scratch.
inline const void* filter_for(OnednnState& state, OnednnPass& pass, const void* w, const OnednnScratch& s) {
  if (!pass.reorder) return w;
  pass.reorder.run(state.engine(), state.stream(), {{onednn::value::arg_src, w}, {onednn::value::arg_dst, s.filter}});
  return s.filter;
}

}  // namespace detail

// y = conv(x, w) + bias, y in T; w channels-last [K, kh, kw, C].
template <class T>
void conv_forward(Context<host>& ctx, const ConvGeometry& g, const T* x, const T* w, const T* bias, T* y) {
  auto& pass = detail::planned<T, T>(ctx, g, bias != nullptr, "conv_forward").forward;
  auto& state = ctx.library_state<detail::OnednnState>();
  const detail::OnednnScratch s = detail::take_scratch(ctx, pass);
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), &state, &pass, x, w, bias, y, s] {
    namespace v = detail::onednn::value;
    detail::use_threads(threads);
    const void* filter = detail::filter_for(state, pass, w, s);
    if (bias)
      pass.op.run(state.engine(), state.stream(),
                  {{v::arg_src, x}, {v::arg_weights, filter}, {v::arg_bias, bias}, {v::arg_dst, y}, {v::arg_scratchpad, s.pad}});
    else
      pass.op.run(state.engine(), state.stream(),
                  {{v::arg_src, x}, {v::arg_weights, filter}, {v::arg_dst, y}, {v::arg_scratchpad, s.pad}});
  });
}

// dx = the input gradient of dy through w [K, kh, kw, C] (overwritten, in D: T or fp32).
template <class T, class D>
void conv_backward_data(Context<host>& ctx, const ConvGeometry& g, const T* dy, const T* w, D* dx, bool has_bias) {
  auto& plan = detail::planned<T, D>(ctx, g, has_bias, "conv_backward_data");
  auto& state = ctx.library_state<detail::OnednnState>();
  auto& pass = plan.backward_data;
  if (!pass.op) {
    namespace v = detail::onednn::value;
    detail::OnednnConvDesc d(g, detail::onednn_type<T>(), detail::onednn_type<D>(), has_bias);
    detail::onednn::op_desc op;
    detail::check_conv(detail::onednn::convolution_backward_data_desc_init(&op, v::convolution_direct, &d.diff_src,
                                                                             &d.weights, &d.dst, d.strides, d.dilates,
                                                                             d.pad_l, d.pad_r),
                         "input-gradient description", g);
    pass.op = detail::plan_pass(state, op, plan.forward.op.desc(), g, "input-gradient planning");
    detail::plan_reorder(state, pass, &d.plain_weights, pass.op.md(v::arg_weights), g);
  }
  const detail::OnednnScratch s = detail::take_scratch(ctx, pass);
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), &state, &pass, dy, w, dx, s] {
    namespace v = detail::onednn::value;
    detail::use_threads(threads);
    const void* filter = detail::filter_for(state, pass, w, s);
    pass.op.run(state.engine(), state.stream(),
                {{v::arg_diff_dst, dy}, {v::arg_weights, filter}, {v::arg_diff_src, dx}, {v::arg_scratchpad, s.pad}});
  });
}

// dw [K, C, kh, kw] and dbias (when not null) from x and dy, overwritten in fp32.
template <class T, class D = T>
void conv_backward_weights(Context<host>& ctx, const ConvGeometry& g, const T* x, const T* dy, float* dw, float* dbias) {
  const bool has_bias = dbias != nullptr;
  auto& plan = detail::planned<T, D>(ctx, g, has_bias, "conv_backward_weights");
  auto& state = ctx.library_state<detail::OnednnState>();
  auto& pass = plan.backward_weights;
  if (!pass.op) {
    namespace v = detail::onednn::value;
    detail::OnednnConvDesc d(g, detail::onednn_type<T>(), detail::onednn_type<D>(), has_bias);
    detail::onednn::op_desc op;
    detail::check_conv(detail::onednn::convolution_backward_weights_desc_init(
                             &op, v::convolution_direct, &d.src, &d.grad_weights, has_bias ? &d.grad_bias : nullptr,
                             &d.dst, d.strides, d.dilates, d.pad_l, d.pad_r),
                         "filter-gradient description", g);
    pass.op = detail::plan_pass(state, op, plan.forward.op.desc(), g, "filter-gradient planning");
    detail::plan_reorder(state, pass, pass.op.md(v::arg_diff_weights), &d.plain_grad_weights, g);
    pass.filter_bytes = detail::onednn::memory_desc_get_size(pass.op.md(v::arg_diff_weights));
  }
  const detail::OnednnScratch s = detail::take_scratch(ctx, pass);
  ctx.count_launch();
  ctx.issue([threads = ctx.threads(), &state, &pass, x, dy, dw, dbias, s] {
    namespace v = detail::onednn::value;
    detail::use_threads(threads);
    void* grad = pass.reorder ? s.filter : static_cast<void*>(dw);
    if (dbias)
      pass.op.run(state.engine(), state.stream(),
                  {{v::arg_src, x}, {v::arg_diff_dst, dy}, {v::arg_diff_weights, grad}, {v::arg_diff_bias, dbias},
                   {v::arg_scratchpad, s.pad}});
    else
      pass.op.run(state.engine(), state.stream(),
                  {{v::arg_src, x}, {v::arg_diff_dst, dy}, {v::arg_diff_weights, grad}, {v::arg_scratchpad, s.pad}});
    if (pass.reorder) pass.reorder.run(state.engine(), state.stream(), {{v::arg_src, grad}, {v::arg_dst, dw}});
  });
}

}  // namespace amp
