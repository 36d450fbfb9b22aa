#pragma once
// Models. A net is a plain struct: its constructor declares its parameters
// through a Builder (which names them, "0.weight" or "block1.conv.weight", as
// PyTorch would), and its forward(graph, inputs...) calls layers and ops, which
// record on the graph. Model<P, B, Net> owns the parameters and the graph,
// sizes every buffer at construction with a planning pass at the largest batch,
// and copies each input into the graph (values converted to activation_type
// once, as Apex's O2 casts inputs), so a training step allocates nothing.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/model/graph.hpp"
#include "amp/model/numerics_sites.hpp"
#include "amp/model/output.hpp"
#include "amp/model/parameters.hpp"

namespace amp::nn {

// Declares a module's parameters under its name.
template <Policy P, Backend B>
class Builder {
 public:
  explicit Builder(ParameterStore<P, B>& store, std::string prefix = {}) : store_(&store), prefix_(std::move(prefix)) {}

  template <role R>
  Param<R> param(const std::string& name, Shape shape, Init init, bool decay = R == role::weight || R == role::fp32) {
    return store_->template declare<R>(prefix_ + name, shape, init, decay);
  }
  // The builder of a sub-module: its parameters are named "<name>.<param>".
  Builder child(const std::string& name) const { return Builder(*store_, prefix_ + name + "."); }
  const std::string& prefix() const { return prefix_; }
  ParameterStore<P, B>& store() const { return *store_; }

 private:
  ParameterStore<P, B>* store_;
  std::string prefix_;
};

// One input of a model: its shape per sample, and whether it holds indices
// (class labels, token ids: int32, no gradient) rather than values.
struct Input {
  Shape sample;
  bool indices = false;
};
inline Input indices(Shape sample) { return {sample, true}; }

struct ModelOptions {
  std::int64_t max_batch = 128;
  std::uint64_t seed = 0;  // the initial values, and the dropout masks unless dropout_seed is set
  // The dropout masks' stream apart from the initial values: data-parallel
  // ranks draw their own masks from one set of initial weights (ZeRO-1 needs the
  // ranks to start alike, as no rank holds every master to send).
  std::optional<std::uint64_t> dropout_seed = {};
  // Forwards of the largest batch that one iteration may hold before its
  // backward (a GAN's discriminator on the real and the fake batch: 2). The
  // activation memory is planned for this many.
  int forwards_per_iteration = 1;
  std::vector<Input> inputs = {};  // empty: the net's default_inputs()
  // The loss writes its gradient over the outputs (fused_cross_entropy): no
  // separate gradient is planned for them (another loss still works, from
  // memory taken at its first iteration).
  bool fused_loss = false;
  // ZeRO-1: this process keeps the fp32 masters (and its optimizer the state)
  // of shard `rank` of `ranks` only; train under parallel::DataParallel with zero = 1.
  Shard shard = {};
  // The numerics report (model/numerics.hpp): every N-th iteration's
  // statistics of parameters, gradients, layer outputs and FP8 operands,
  // taken with parameters().numerics().take(); 0: off, nothing runs.
  int numerics_every = 0;
};

namespace detail {
template <class X>
inline constexpr bool is_tuple_v = false;
template <class... Xs>
inline constexpr bool is_tuple_v<std::tuple<Xs...>> = true;

// Any view of an input as a TensorView of const elements.
template <class E>
TensorView<const E> input_view(TensorView<E> x) {
  return {x.data, x.shape};
}
template <class E>
TensorView<const E> input_view(Matrix<E> x) {
  AMP_REQUIRE(x.contiguous(), "Model::forward: the input matrix must be contiguous (ld ", x.ld, ", cols ", x.cols, ")");
  return {x.data, Shape{x.rows, x.cols}};
}

// Calls f(v) on a net's output: one Var, or each Var of a tuple.
template <class Out, class F>
void each_output(Out& out, F&& f) {
  if constexpr (is_tuple_v<Out>) std::apply([&](auto&... v) { (f(v), ...); }, out);
  else f(out);
}
}  // namespace detail

template <Policy P, Backend B, class Net>
class Model {
 public:
  using policy = P;
  using backend = B;
  using T = typename P::activation_type;

  template <class... Args>
  Model(Context<B>& ctx, ModelOptions options, Args&&... args)
      : ctx_(&ctx),
        options_(check(std::move(options))),
        store_(ctx),
        net_(Builder<P, B>(store_), std::forward<Args>(args)...),
        graph_(ctx, store_, options_.dropout_seed.value_or(options_.seed)) {
    if constexpr (std::is_same_v<B, cuda>) ctx.template require<P>();
    if (options_.inputs.empty()) {
      if constexpr (requires { net_.default_inputs(); }) options_.inputs = net_.default_inputs();
      AMP_REQUIRE(!options_.inputs.empty(), "Model: ModelOptions::inputs must give the shape of each input sample");
    }
    store_.allocate(options_.shard);
    prepare_numerics(store_, options_.numerics_every);
    store_.initialize(options_.seed);
    plan();
    // The report's reductions of a layer's output (at most the arena's values, at 2 bytes each) allocate nothing later.
    if (store_.numerics().on()) reserve_reduction<ValueStats>(ctx, std::max(graph_.arena_bytes() / 2, store_.count()));
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Runs the net on a batch (leading dimension <= max_batch) and returns what
  // it returns. Inputs are TensorViews or (2-D, rows = batch) Matrices. The
  // forward joins the iteration in progress until its backward (see Graph).
  template <class... X>
  auto forward(Context<B>& ctx, X... x) {
    AMP_REQUIRE(&ctx == ctx_, "Model::forward: a context other than the model's");
    AMP_REQUIRE(sizeof...(X) == options_.inputs.size(), "Model::forward: ", sizeof...(X), " inputs for a model of ",
                options_.inputs.size());
    check_inputs(std::index_sequence_for<X...>{}, detail::input_view(x)...);  // a refused forward changes nothing
    graph_.begin_forward();
    return forward_inputs(std::index_sequence_for<X...>{}, detail::input_view(x)...);
  }

  // An evaluation forward through another entry of the net, f(graph, net,
  // ids) for int32 ids of any shape: paths whose inputs the plan does not fix,
  // such as generation from a key/value cache (nn/generate.hpp).
  template <class F>
  auto infer(Context<B>& ctx, TensorView<const std::int32_t> ids, F&& f) {
    AMP_REQUIRE(&ctx == ctx_, "Model::infer: a context other than the model's");
    AMP_REQUIRE(!graph_.training(), "Model::infer: evaluation mode only (call eval() first)");
    graph_.begin_forward();
    Var<std::int32_t> v = graph_.template tensor<std::int32_t>(ids.shape, false);
    ctx_->copy(v.data, ids.data, v.size() * sizeof(std::int32_t));
    return wrap(std::forward<F>(f)(graph_, net_, v));
  }

  ParameterStore<P, B>& parameters() { return store_; }
  const ParameterStore<P, B>& parameters() const { return store_; }
  Graph<P, B>& graph() { return graph_; }
  Net& net() { return net_; }
  Context<B>& context() const { return *ctx_; }
  std::int64_t max_batch() const { return options_.max_batch; }
  const std::vector<Input>& inputs() const { return options_.inputs; }

  // Training mode (batch statistics, dropout) or evaluation mode (running statistics, no dropout).
  void train(bool on = true) { graph_.set_training(on); }
  void eval() { graph_.set_training(false); }
  bool training() const { return graph_.training(); }

 private:
  static ModelOptions check(ModelOptions o) {
    AMP_REQUIRE(o.max_batch > 0, "Model: max_batch must be positive, got ", o.max_batch);
    AMP_REQUIRE(o.forwards_per_iteration >= 1 && o.forwards_per_iteration <= 64,
                "Model: forwards_per_iteration must be in [1, 64], got ", o.forwards_per_iteration);
    AMP_REQUIRE(!o.numerics_every || o.shard.ranks == 1, "Model: the numerics report reads whole gradients; under "
                "ZeRO-1 (a shard of ", o.shard.ranks, " ranks) a rank holds the summed gradients of its shard only");
    return o;
  }

  template <std::size_t... I, class... In>
  auto forward_inputs(std::index_sequence<I...>, TensorView<const In>... x) {
    return wrap(net_.forward(graph_, input<I>(x)...));
  }

  // The net's Var (or tuple of Vars) as Output(s) that know their graph.
  template <class U>
  Output<P, B, U> wrap(Var<U> v) {
    return {v, &graph_};
  }
  template <class... U>
  auto wrap(std::tuple<Var<U>...> vs) {
    return std::apply([&](auto... v) { return std::make_tuple(wrap(v)...); }, vs);
  }

  template <std::size_t... I, class... In>
  void check_inputs(std::index_sequence<I...>, TensorView<const In>... x) const {
    (check_input<I>(x), ...);
  }
  template <std::size_t I, class In>
  void check_input(TensorView<const In> x) const {
    const Input& spec = options_.inputs[I];
    const std::int64_t batch = x.shape.rank() ? x.shape[0] : 0;
    AMP_REQUIRE(batch >= 1 && batch <= options_.max_batch && x.shape.sample() == spec.sample, "Model::forward: input ",
                I, " has shape ", x.shape.str(), ", expected [batch x ", spec.sample.str().substr(1),
                " with batch in 1..", options_.max_batch);
    if constexpr (std::is_same_v<In, std::int32_t>) {
      AMP_REQUIRE(spec.indices, "Model::forward: input ", I, " holds int32 indices, but the model takes values there");
    } else {
      static_assert(Scalar<In>, "Model::forward: inputs are fp32/fp16/bf16 values or int32 indices");
      AMP_REQUIRE(!spec.indices, "Model::forward: input ", I, " must hold int32 indices");
    }
  }

  // The input copied into the graph: values as activation_type, indices as int32.
  template <std::size_t I, class In>
  auto input(TensorView<const In> x) {
    if constexpr (std::is_same_v<In, std::int32_t>) {
      Var<std::int32_t> v = graph_.template tensor<std::int32_t>(x.shape, false);
      ctx_->copy(v.data, x.data, v.size() * sizeof(std::int32_t));
      return v;
    } else {
      Var<T> v = graph_.template tensor<T>(x.shape, false);
      convert(*ctx_, Span<const In>(x.data, v.size()), v.span());
      return v;
    }
  }

  // The planning pass: forwards_per_iteration forwards and one backward at
  // the largest batch on zeros, so that the graph's arena and every workspace
  // are sized now, not in the loop. Under an FP8 policy a first pass finds the
  // order of the layers (which stay out of FP8), the second plans with them.
  void plan() {
    if constexpr (uses_fp8_v<P>) {
      store_.fp8().begin_discovery();
      plan_pass(false);  // the forwards alone: the order is all it is for
      store_.fp8().resolve();
    }
    plan_pass(true);
  }
  void plan_pass(bool with_backward) {
    graph_.begin_planning(options_.forwards_per_iteration);
    for (int k = 0; k < options_.forwards_per_iteration; ++k) {
      graph_.begin_forward();
      auto out = plan_forward();
      detail::each_output(out, [&](auto& v) {
        using U = std::remove_pointer_t<decltype(v.data)>;
        if (options_.fused_loss) graph_.grad_in_place(v);
        else if (auto g = graph_.grad_out(v)) fill(*ctx_, Span<U>(g.data, v.size()), cast<U>(0.0f));
        reserve_reduction<LossValue>(*ctx_, v.size());  // what a loss over this output reduces
        ctx_->template scratch<LossValue>(scratch_slot::loss_rows, static_cast<std::size_t>(v.rows()));  // per row
      });
    }
    if (with_backward) graph_.backward();
    graph_.end_planning();
  }

  // A zero input of the largest batch; it becomes a Var<T> or a Var<int32_t>,
  // whichever the net's forward takes.
  struct PlanInput {
    Model* model;
    std::size_t index;
    operator Var<T>() const { return model->template zero_input<T>(index, false); }
    operator Var<std::int32_t>() const { return model->template zero_input<std::int32_t>(index, true); }
  };
  template <class U>
  Var<U> zero_input(std::size_t index, bool indices) {
    const Input& spec = options_.inputs[index];
    AMP_REQUIRE(spec.indices == indices, "Model: input ", index, " is declared as ", spec.indices ? "indices" : "values",
                " but the net's forward takes ", indices ? "indices" : "values");
    Var<U> v = graph_.template tensor<U>(spec.sample.batched(options_.max_batch), false);
    fill(*ctx_, v.span(), cast<U>(0.0f));
    return v;
  }

  // How many inputs the net's forward takes (1 to 4).
  static constexpr std::size_t net_arity() {
    if constexpr (requires(Net& n, Graph<P, B>& g, PlanInput x) { n.forward(g, x); }) return 1;
    else if constexpr (requires(Net& n, Graph<P, B>& g, PlanInput x) { n.forward(g, x, x); }) return 2;
    else if constexpr (requires(Net& n, Graph<P, B>& g, PlanInput x) { n.forward(g, x, x, x); }) return 3;
    else if constexpr (requires(Net& n, Graph<P, B>& g, PlanInput x) { n.forward(g, x, x, x, x); }) return 4;
    else return 0;
  }

  auto plan_forward() {
    constexpr std::size_t arity = net_arity();
    static_assert(arity > 0, "Model: the net needs forward(Graph&, Var...) taking 1 to 4 inputs");
    AMP_REQUIRE(options_.inputs.size() == arity, "Model: the net's forward takes ", arity,
                " inputs, ModelOptions::inputs describes ", options_.inputs.size());
    const auto in = [&](std::size_t i) { return PlanInput{this, i}; };
    if constexpr (arity == 1) return net_.forward(graph_, in(0));
    else if constexpr (arity == 2) return net_.forward(graph_, in(0), in(1));
    else if constexpr (arity == 3) return net_.forward(graph_, in(0), in(1), in(2));
    else return net_.forward(graph_, in(0), in(1), in(2), in(3));
  }

  Context<B>* ctx_;
  ModelOptions options_;
  ParameterStore<P, B> store_;
  Net net_;
  Graph<P, B> graph_;
};

}  // namespace amp::nn
