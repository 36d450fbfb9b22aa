#pragma once
// A model composed at compile time. Layers are instantiated with the policy and
// the backend; their parameters live in one Parameters object (one flat arena
// per role) and their activations are planned for max_batch at build time, so
// the training loop allocates nothing.
#include <cstdint>
#include <type_traits>

#include "amp/nn/output.hpp"
#include "amp/nn/parameters.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

namespace detail {
// head, then tail: members are built in declaration order, so each layer sees
// the feature count of the one before it.
template <class... Layers>
struct Chain {
  template <class Ctx, class Plan>
  Chain(Ctx&, Plan&, std::int64_t, std::int64_t features, bool) : features_(features) {}
  std::int64_t out_features() const { return features_; }
  template <class Params>
  void init(Params&, std::uint64_t) {}
  template <class Ctx, class Params, class X>
  X forward(Ctx&, Params&, X x) { return x; }
  template <class Ctx, class Params, class D>
  D backward(Ctx&, Params&, D dy) { return dy; }
  std::int64_t features_;
};

template <class Head, class... Tail>
struct Chain<Head, Tail...> {
  template <class Ctx, class Plan>
  Chain(Ctx& ctx, Plan& plan, std::int64_t max_batch, std::int64_t features, bool need_dx,
        const typename Head::Config& head_cfg, const typename Tail::Config&... tail_cfgs)
      : head(ctx, head_cfg, max_batch, features, plan, need_dx),
        tail(ctx, plan, max_batch, head.out_features(), true, tail_cfgs...) {}

  std::int64_t out_features() const { return tail.out_features(); }
  template <class Params>
  void init(Params& params, std::uint64_t seed) {
    head.init(params, seed);
    tail.init(params, seed);
  }
  template <class Ctx, class Params, class X>
  X forward(Ctx& ctx, Params& params, X x) {
    return tail.forward(ctx, params, head.forward(ctx, params, x));
  }
  template <class Ctx, class Params, class D>
  D backward(Ctx& ctx, Params& params, D dy) {
    return head.backward(ctx, params, tail.backward(ctx, params, dy));
  }

  Head head;
  Chain<Tail...> tail;
};
}  // namespace detail

struct SequentialOptions {
  std::int64_t max_batch = 128;
  std::uint64_t seed = 0;
};

template <Policy P, Backend B, template <class, class> class... Layers>
class Sequential final : public Backprop<P, B> {
 public:
  using policy = P;
  using backend = B;
  using T = typename P::activation_type;

  Sequential(Context<B>& ctx, SequentialOptions opt, const typename Layers<P, B>::Config&... cfgs)
      : max_batch_(check_batch(opt.max_batch)),
        chain_(ctx, plan_, opt.max_batch, 0, false, cfgs...),
        params_(ctx, plan_),
        grad_out_(ctx, {opt.max_batch, chain_.out_features()}, memory_kind::activations),
        loss_slot_(ctx, 1, memory_kind::activations),
        unit_scale_(ctx, 1, memory_kind::activations) {
    fill(ctx, unit_scale_.span(), 1.0f);
    if constexpr (std::is_same_v<B, cuda>) ctx.template require<P>();
    in_features_ = in_features_of(cfgs...);
    chain_.init(params_, opt.seed);
  }

  Parameters<P, B>& parameters() { return params_; }
  const Parameters<P, B>& parameters() const { return params_; }
  std::int64_t max_batch() const { return max_batch_; }
  std::int64_t in_features() const { return in_features_; }
  std::int64_t out_features() const { return chain_.out_features(); }
  auto& layers() { return chain_; }

  // x: rows = batch (<= max_batch), cols = in_features, row-major and contiguous.
  // Inputs of another type are cast once into activation_type, as Apex's O2 does.
  template <class In>
  Output<P, B> forward(Context<B>& ctx, Matrix<const In> x) {
    AMP_REQUIRE(x.cols == in_features_ && x.rows >= 1 && x.rows <= max_batch_ && x.contiguous(),
                "Sequential::forward: input [", x.rows, "x", x.cols, "] (ld ", x.ld, ") does not fit a model of ",
                in_features_, " input features and max_batch ", max_batch_, " (rows 1..", max_batch_,
                ", contiguous)");
    rows_ = x.rows;
    Matrix<const T> xa;
    if constexpr (std::is_same_v<In, T>) {
      xa = x;
    } else {
      if (!input_.data()) input_ = Tensor<T, B>(ctx, {max_batch_, in_features_}, memory_kind::activations);
      const Matrix<T> cast_in = input_.matrix().first_rows(x.rows);
      convert(ctx, x.span(), cast_in.span());
      xa = cast_in;
    }
    return {chain_.forward(ctx, params_, xa), this};
  }
  template <class In>
  Output<P, B> forward(Context<B>& ctx, Matrix<In> x) {
    return forward(ctx, Matrix<const In>(x));
  }

  Matrix<T> grad_output(std::int64_t rows) override { return grad_out_.matrix().first_rows(rows); }
  void backward(Context<B>& ctx) override { chain_.backward(ctx, params_, Matrix<const T>(grad_output(rows_))); }
  LossValue* loss_slot() override { return loss_slot_.data(); }
  const float* unit_scale() override { return unit_scale_.data(); }

 private:
  static std::int64_t check_batch(std::int64_t b) {
    AMP_REQUIRE(b > 0, "Sequential: max_batch must be positive, got ", b);
    return b;
  }
  template <class First, class... Rest>
  static std::int64_t in_features_of(const First& first, const Rest&...) {
    if constexpr (requires { first.in_features; }) return first.in_features;
    else return 0;
  }

  std::int64_t max_batch_;
  ParameterPlan plan_;
  detail::Chain<Layers<P, B>...> chain_;
  Parameters<P, B> params_;
  Tensor<T, B> grad_out_;
  Buffer<LossValue, B> loss_slot_;
  Buffer<float, B> unit_scale_;
  Tensor<T, B> input_;
  std::int64_t in_features_ = 0;
  std::int64_t rows_ = 0;
};

}  // namespace amp::nn
