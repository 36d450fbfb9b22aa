// Every alias of a policy has an effect: a user policy that overrides only that
// alias changes exactly that storage or compute type, and still trains.
#include <doctest/doctest.h>

#include <cmath>

#include "amp/amp.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;
using nn::Var;

namespace {
template <op Changed, class Low>
struct ComputeOverride {
  template <op K>
  using type = std::conditional_t<K == Changed, Low, float>;
};

// One user policy per alias.
struct ParamHalf : O0Policy { using param_type = half; };
struct O3WithMaster : O3Policy { using master_type = float; };
struct O2Fp32Grads : O2Policy { using grad_type = float; };
struct O1Fp32Activations : O1Policy { using activation_type = float; };
struct O2HalfNorms : O2Policy { using norm_param_type = half; };
template <op K>
struct ComputeHalf : O0Policy {
  template <op J>
  using compute_type = typename ComputeOverride<K, half>::template type<J>;
};
struct O0Dynamic : O0Policy { static constexpr scaling loss_scaling = scaling::dynamic; };

// conv -> batchnorm -> relu -> avg-pool -> flatten -> Linear; keeps its intermediate tensors for inspection.
template <class P, class B>
struct Probe {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> conv;
  nn::BatchNorm2d<P, B> bn;
  nn::AvgPool2d<P, B> pool;
  nn::Flatten<P, B> flat;
  nn::Linear<P, B> fc;
  Var<T> normed, activated, pooled;
  explicit Probe(nn::Builder<P, B> b)
      : conv(b.child("conv"), {.in_channels = 1, .out_channels = 3, .kernel = 3, .padding = 1}),
        bn(b.child("bn"), {.features = 3}),
        pool(b.child("pool"), {.kernel = 2}),
        flat(b.child("flat"), {}),
        fc(b.child("fc"), {.in_features = 12, .out_features = 3}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{4, 4, 1}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    normed = bn(g, conv(g, x));
    activated = nn::relu(g, normed);
    pooled = pool(g, activated);
    return fc(g, flat(g, pooled));
  }
};

struct Run {
  float first = 0, last = 0, last_loss_value = 0;
  std::size_t memory[static_cast<int>(memory_kind::count)] = {};
  bool normed_half = true, activated_half = true, pooled_half = true;
};

template <class T>
bool all_half(Context<host>& ctx, Var<T> v) {
  for (const T x : download(ctx, Span<const T>(v.span())))
    if (round_to<half>(cast<float>(x)) != cast<float>(x)) return false;
  return true;
}

template <Policy P>
Run train() {
  Context<host> ctx;
  nn::Model<P, host, Probe<P, host>> model(ctx, {.max_batch = 6, .seed = 3});
  optim::Adam<P, host> opt(model.parameters(), {.lr = 0.02f});
  const auto x = random_values<float>(6 * 16, 9);
  std::vector<std::int32_t> y{0, 1, 2, 2, 1, 0};
  Run r;
  for (int it = 0; it < 40; ++it) {
    auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{6, 4, 4, 1}));
    auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>{y.data(), y.size()});
    opt.zero_grad();
    {
      auto s = scale_loss(loss, opt);
      s.backward();
    }
    opt.step();
    const float v = loss.item();
    (it == 0 ? r.first : r.last) = v;
    if (it == 0) {
      auto& net = model.net();
      r.normed_half = all_half(ctx, net.normed);
      r.activated_half = all_half(ctx, net.activated);
      r.pooled_half = all_half(ctx, net.pooled);
      r.last_loss_value = v;
    }
  }
  for (int k = 0; k < static_cast<int>(memory_kind::count); ++k) r.memory[k] = ctx.memory().peak(static_cast<memory_kind>(k));
  return r;
}

std::size_t mem(const Run& r, memory_kind k) { return r.memory[static_cast<int>(k)]; }

void trains(const Run& r) {
  CHECK(std::isfinite(r.last));
  CHECK(r.last < 0.7f * r.first);
}
}  // namespace

TEST_CASE("param_type: weights stored as it says, with an fp32 master because it differs from master_type") {
  static_assert(std::is_same_v<nn::RoleArena<ParamHalf, host, nn::role::weight>::stored_type, half>);
  static_assert(uses_master_weights_v<ParamHalf> && !uses_master_weights_v<O0Policy>);
  const Run base = train<O0Policy>(), r = train<ParamHalf>();
  CHECK(mem(base, memory_kind::master) == 0);
  CHECK(mem(r, memory_kind::master) > 0);
  trains(r);
}

TEST_CASE("master_type: O3 with fp32 masters keeps them") {
  static_assert(nn::RoleArena<O3WithMaster, host, nn::role::weight>::has_master);
  static_assert(!nn::RoleArena<O3Policy, host, nn::role::weight>::has_master);
  const Run base = train<O3Policy>(), r = train<O3WithMaster>();
  CHECK(mem(base, memory_kind::master) == 0);
  CHECK(mem(r, memory_kind::master) > 0);
  trains(r);
}

TEST_CASE("grad_type: O2 with fp32 gradients doubles the weight gradients' memory") {
  static_assert(std::is_same_v<nn::RoleArena<O2Fp32Grads, host, nn::role::weight>::grad_type, float>);
  const Run base = train<O2Policy>(), r = train<O2Fp32Grads>();
  CHECK(mem(r, memory_kind::grads) > mem(base, memory_kind::grads));
  trains(r);
}

TEST_CASE("activation_type: O1 with fp32 activations writes fp32 between layers, GEMMs still in fp16") {
  static_assert(std::is_same_v<nn::Linear<O1Fp32Activations, host>::T, float>);
  static_assert(std::is_same_v<nn::Linear<O1Fp32Activations, host>::G, half>);
  const Run base = train<O1Policy>(), r = train<O1Fp32Activations>();
  CHECK(mem(r, memory_kind::activations) > mem(base, memory_kind::activations));
  trains(r);
}

TEST_CASE("norm_param_type: O2 with fp16 norm parameters stores them as fp16, with masters") {
  static_assert(std::is_same_v<nn::RoleArena<O2HalfNorms, host, nn::role::norm>::stored_type, half>);
  static_assert(nn::RoleArena<O2HalfNorms, host, nn::role::norm>::has_master);
  static_assert(!nn::RoleArena<O2Policy, host, nn::role::norm>::has_master);
  const Run base = train<O2Policy>(), r = train<O2HalfNorms>();
  CHECK(mem(r, memory_kind::master) > mem(base, memory_kind::master));
  trains(r);
}

TEST_CASE("compute_type<gemm> and compute_type<conv> pick each layer's GEMM type separately") {
  using G = ComputeHalf<op::gemm>;
  using C = ComputeHalf<op::conv>;
  static_assert(std::is_same_v<nn::Linear<G, host>::G, half> && std::is_same_v<nn::Conv2d<G, host>::G, float>);
  static_assert(std::is_same_v<nn::Conv2d<C, host>::G, half> && std::is_same_v<nn::Linear<C, host>::G, float>);
  static_assert(nn::RoleArena<G, host, nn::role::weight>::caches_gemm && nn::RoleArena<C, host, nn::role::weight>::caches_conv);
  const Run base = train<O0Policy>(), g = train<G>(), c = train<C>();
  CHECK(mem(g, memory_kind::weights) > mem(base, memory_kind::weights));  // the fp16 cast cache
  CHECK(mem(c, memory_kind::weights) > mem(base, memory_kind::weights));
  trains(g);
  trains(c);
}

TEST_CASE("compute_type<pointwise>, <norm> and <reduction> round what those ops write") {
  const Run base = train<O0Policy>();
  CHECK_FALSE(base.normed_half);
  CHECK_FALSE(base.activated_half);
  CHECK_FALSE(base.pooled_half);
  const Run norm = train<ComputeHalf<op::norm>>();
  CHECK(norm.normed_half);
  trains(norm);
  const Run pointwise = train<ComputeHalf<op::pointwise>>();
  CHECK(pointwise.activated_half);
  CHECK_FALSE(pointwise.normed_half);
  trains(pointwise);
  const Run reduction = train<ComputeHalf<op::reduction>>();
  CHECK(reduction.pooled_half);
  CHECK_FALSE(reduction.activated_half);
  trains(reduction);
}

TEST_CASE("compute_type<loss> and <softmax> round the loss and the softmax inside it") {
  const Run base = train<O0Policy>();
  const Run loss = train<ComputeHalf<op::loss>>();
  CHECK(loss.last_loss_value != base.last_loss_value);  // same weights, each row's loss rounded to fp16
  CHECK(loss.last_loss_value == doctest::Approx(base.last_loss_value).epsilon(1e-2));
  const Run softmax = train<ComputeHalf<op::softmax>>();
  CHECK(softmax.last_loss_value != base.last_loss_value);  // same weights, a rounded softmax
  CHECK(softmax.last_loss_value == doctest::Approx(base.last_loss_value).epsilon(1e-2));
  trains(loss);
  trains(softmax);
}

TEST_CASE("loss_scaling: a dynamic O0 scales by 2^16 with no other change") {
  static_assert(default_scaler_t<O0Dynamic, host>::mode == scaling::dynamic);
  Context<host> ctx;
  nn::Model<O0Dynamic, host, Probe<O0Dynamic, host>> model(ctx, {.max_batch = 6, .seed = 3});
  optim::SGD<O0Dynamic, host> opt(model.parameters(), {.lr = 0.01f});
  CHECK(opt.scaler().stats().scale == 65536.0f);
  trains(train<O0Dynamic>());
}
