// A precision per layer, at compile time: a Linear under amp::KeepFp32<P> in a
// model of policy P computes as O0 on fp32 weights of the fp32 role (no
// master, also under O3), between casts to and from P's activations; the
// optimizer, checkpoints, memory accounting and ZeRO-1's partition treat that
// role. A Linear under amp::NoFp8<P> in an O2-fp8 model runs its GEMMs in bf16.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/amp.hpp"
#include "amp/io/checkpoint.hpp"
#include "support/files.hpp"

using namespace amp;
using amp::host;
using nn::Var;

namespace {

constexpr std::int64_t N = 4, In = 6, Hidden = 5, Out = 3;

// body (the model's policy) -> head (KeepFp32<P>, or P itself to compare with).
template <class P, class B, bool KeepHead = true>
struct HeadNet {
  using T = typename P::activation_type;
  using HeadPolicy = std::conditional_t<KeepHead, KeepFp32<P>, P>;
  nn::Linear<P, B> body;
  nn::Linear<HeadPolicy, B> head;
  Var<T> hidden;  // the head's input, as the model's activations

  explicit HeadNet(nn::Builder<P, B> b)
      : body(b.child("body"), {.in_features = In, .out_features = Hidden, .act = activation::relu}),
        head(b.child("head"), {.in_features = Hidden, .out_features = Out}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{In}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    hidden = body(g, x);
    return head(g, hidden);
  }
};

// The head alone, under O0: the reference the kept head must match bit for bit.
template <class P, class B>
struct HeadOnly {
  nn::Linear<P, B> head;
  explicit HeadOnly(nn::Builder<P, B> b) : head(b.child("head"), {.in_features = Hidden, .out_features = Out}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{Hidden}}}; }
  Var<float> forward(nn::Graph<P, B>& g, Var<float> x) { return head(g, x); }
};

std::vector<float> ramp(std::size_t n, float scale, float phase) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.7f * static_cast<float>(i) + phase);
  return v;
}

template <class U>
std::vector<float> as_floats(Context<host>& ctx, const U* data, std::size_t n) {
  const auto raw = download(ctx, Span<const U>(data, n));
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = cast<float>(raw[i]);
  return out;
}

template <class Store>
int index_of(const Store& store, const std::string& name) {
  for (std::size_t i = 0; i < store.table().size(); ++i)
    if (store.table()[i].name == name) return static_cast<int>(i);
  FAIL("no parameter ", name);
  return -1;
}

// A model's bytes of one memory kind, built in a context of its own.
template <class P, bool KeepHead>
std::size_t model_bytes(memory_kind kind) {
  Context<host> ctx;
  nn::Model<P, host, HeadNet<P, host, KeepHead>> model(ctx, {.max_batch = N});
  return ctx.memory().current(kind);
}

}  // namespace

TEST_CASE_TEMPLATE("a head kept in fp32: its role, O0's arithmetic, the optimizer, checkpoints and memory", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy, O2FP8Policy) {
  using T = typename P::activation_type;
  using Head = KeepFp32<P>;
  // Stored as the model stores weights when that is fp32 (O0, O1), else in the fp32 role.
  constexpr nn::role R = nn::weight_role_v<Head>;
  static_assert(R == (std::is_same_v<typename P::param_type, float> ? nn::role::weight : nn::role::fp32));
  static_assert(std::is_same_v<typename nn::RoleArena<P, host, R>::stored_type, float> &&
                std::is_same_v<typename nn::RoleArena<P, host, R>::grad_type, float> &&
                !nn::RoleArena<P, host, nn::role::fp32>::has_master);
  static_assert(std::is_same_v<model_policy_t<Head>, P> && !uses_fp8_v<Head>);
  CAPTURE(policy_name<Head>());

  Context<host> ctx;
  nn::Model<P, host, HeadNet<P, host>> model(ctx, {.max_batch = N, .seed = 3});
  auto& store = model.parameters();
  const int w = index_of(store, "head.weight"), b = index_of(store, "head.bias");
  CHECK(store.table()[static_cast<std::size_t>(w)].kind == R);
  CHECK(store.table()[static_cast<std::size_t>(b)].kind == R);
  CHECK(store.template arena<nn::role::fp32>().count() == (R == nn::role::fp32 ? 2 * 128u : 0u));  // padded blocks
  CHECK(optim::select::fp32_weights(store.table()[static_cast<std::size_t>(w)]) == (R == nn::role::fp32));

  const std::vector<float> x = ramp(N * In, 1.5f, 0.3f), target = ramp(N * Out, 0.5f, 1.1f);
  optim::StepOptions step_options;  // a scale of 2^8: the body's fp16 gradients do not overflow at the first step
  if constexpr (P::loss_scaling == scaling::dynamic) step_options.scaler = ScalerConfig{.init_scale = 256.0f};
  optim::SGD<P, host> opt(store, {.lr = 0.25f}, step_options);
  auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{N, In}));
  const std::vector<float> h = as_floats(ctx, model.net().hidden.data, N * Hidden);
  const std::vector<float> y = as_floats(ctx, out.var.data, N * Out);

  SUBCASE("the forward is O0's on the same fp32 weights and input, rounded once to the model's activations") {
    Context<host> ref_ctx;
    nn::Model<O0Policy, host, HeadOnly<O0Policy, host>> ref(ref_ctx, {.max_batch = N});
    ref.parameters().set_values(0, store.get_values(w));
    ref.parameters().set_values(1, store.get_values(b));
    auto y0 = ref.forward(ref_ctx, TensorView<const float>(h.data(), Shape{N, Hidden}));
    const std::vector<float> expected = as_floats(ref_ctx, y0.var.data, N * Out);
    for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == cast<float>(cast<T>(expected[i])));  // the same GEMM: exact
  }

  SUBCASE("the weight gradient is dy^T h in fp32; SGD updates the weights in place: w - lr g / scale") {
    auto loss = nn::mse_loss(ctx, out, TensorView<const float>(target.data(), Shape{N, Out}));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    const std::vector<float> dy = as_floats(ctx, model.graph().grad(out.var), N * Out);  // scaled, as the head saw it
    const auto& arena = store.template arena<R>();
    const nn::ParamInfo& pw = store.table()[static_cast<std::size_t>(w)];
    const nn::ParamInfo& pb = store.table()[static_cast<std::size_t>(b)];
    const std::vector<float> gw = as_floats(ctx, arena.grads().data + pw.offset, pw.count);
    const std::vector<float> gb = as_floats(ctx, arena.grads().data + pb.offset, pb.count);
    // fp32 sums of N = 4 products against FP64: within 8 units of 2^-24 of the sum of |terms|.
    for (std::int64_t j = 0; j < Out; ++j) {
      double bias = 0, bias_abs = 0;
      for (std::int64_t i = 0; i < N; ++i) bias += dy[i * Out + j], bias_abs += std::fabs(dy[i * Out + j]);
      CHECK(std::fabs(gb[j] - bias) <= 8 * 0x1p-24 * bias_abs + 1e-30);
      for (std::int64_t k = 0; k < Hidden; ++k) {
        double sum = 0, abs = 0;
        for (std::int64_t i = 0; i < N; ++i) {
          const double t = static_cast<double>(dy[i * Out + j]) * h[i * Hidden + k];
          sum += t, abs += std::fabs(t);
        }
        CHECK(std::fabs(gw[j * Hidden + k] - sum) <= 8 * 0x1p-24 * abs + 1e-30);
      }
    }
    const std::vector<float> before = store.get_values(w);
    const float scale = opt.scaler().state().scale;
    opt.step();
    CHECK(opt.applied_steps() == 1);
    const std::vector<float> after = store.get_values(w);
    for (std::size_t k = 0; k < after.size(); ++k) {
      const float expected = before[k] - 0.25f * (gw[k] * (1.0f / scale));  // the scale is a power of two
      CHECK(after[k] == doctest::Approx(expected).epsilon(0x1p-23));  // one fp32 rounding (a GPU's FMA may differ)
    }
  }

  SUBCASE("a checkpoint holds its fp32 values and no master, and restores them bit for bit") {
    auto loss = nn::mse_loss(ctx, out, TensorView<const float>(target.data(), Shape{N, Out}));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
    const std::string path = test::temp_path("layer_precision.ckpt");
    io::save(path, model, opt);
    const io::Archive a = io::Archive::read(path);
    CHECK(a.find("param.head.weight")->type == io::dtype::fp32);
    CHECK((a.find("master.head.weight") != nullptr) == (uses_master_weights_v<P> && R == nn::role::weight));
    nn::Model<P, host, HeadNet<P, host>> other(ctx, {.max_batch = N, .seed = 11});
    optim::SGD<P, host> other_opt(other.parameters(), {.lr = 0.25f}, step_options);
    io::load(path, other, other_opt);
    std::filesystem::remove(path);
    for (std::size_t i = 0; i < store.table().size(); ++i)
      CHECK(other.parameters().get_values(static_cast<int>(i)) == store.get_values(static_cast<int>(i)));
    const auto& mine = store.template arena<R>();
    const auto& theirs = other.parameters().template arena<R>();
    CHECK(download(ctx, Span<const float>(theirs.values())) == download(ctx, Span<const float>(mine.values())));
  }

  SUBCASE("memory: fp32 values and gradients for the head, and no master for it") {
    // The same net with the head in P: 256 padded elements move between roles.
    const auto diff = [](memory_kind k) {
      return static_cast<long>(model_bytes<P, true>(k)) - static_cast<long>(model_bytes<P, false>(k));
    };
    const long widened = R == nn::role::fp32 ? 256 * static_cast<long>(4 - sizeof(typename P::param_type)) : 0;
    CHECK(diff(memory_kind::weights) == widened);
    CHECK(diff(memory_kind::grads) == widened);
    CHECK(diff(memory_kind::master) == (R == nn::role::fp32 && uses_master_weights_v<P> ? -256 * 4 : 0));
  }
}

namespace {
template <class P, class B>
using Fp32Linear = nn::Linear<KeepFp32<P>, B>;
}  // namespace

TEST_CASE("Sequential takes a layer kept in fp32 as an alias template; a model without one has an empty fp32 role") {
  Context<host> ctx;
  const nn::ModelOptions options{.max_batch = 2, .inputs = {{Shape{4}}}};
  nn::Sequential<O2Policy, host, nn::Linear, Fp32Linear> seq(ctx, options, {.in_features = 4, .out_features = 3},
                                                             {.in_features = 3, .out_features = 2});
  CHECK(seq.parameters().table()[2].name == "1.weight");
  CHECK(seq.parameters().table()[2].kind == nn::role::fp32);
  const std::vector<float> x(8, 0.5f);
  CHECK(seq.forward(ctx, TensorView<const float>(x.data(), Shape{2, 4})).cols() == 2);

  Context<host> plain_ctx;
  nn::Sequential<O2Policy, host, nn::Linear, nn::Linear> plain(plain_ctx, options, {.in_features = 4, .out_features = 3},
                                                               {.in_features = 3, .out_features = 2});
  CHECK(plain.parameters().arena<nn::role::fp32>().count() == 0);
  CHECK(plain.parameters().count() == 4 * 128);
}

namespace {
// Four Linears of O2-fp8: l1 and l4 stay out of FP8 (the policy keeps the
// first and the last), l2 by its own policy (NoFp8), l3 runs in FP8 (or the
// other way round: Kept = 3).
template <class P, class B, int Kept = 2>
struct Fp8Net {
  using T = typename P::activation_type;
  static constexpr std::int64_t F = 16;
  nn::Linear<P, B> l1;
  nn::Linear<std::conditional_t<Kept == 2, NoFp8<P>, P>, B> l2;
  nn::Linear<std::conditional_t<Kept == 3, NoFp8<P>, P>, B> l3;
  nn::Linear<P, B> l4;
  Var<T> h1, h2, h3;

  explicit Fp8Net(nn::Builder<P, B> b)
      : l1(b.child("l1"), {.in_features = F, .out_features = F, .act = activation::relu}),
        l2(b.child("l2"), {.in_features = F, .out_features = F}),
        l3(b.child("l3"), {.in_features = F, .out_features = F}),
        l4(b.child("l4"), {.in_features = F, .out_features = 4}) {}
  std::vector<nn::Input> default_inputs() const { return {{Shape{F}}}; }
  Var<T> forward(nn::Graph<P, B>& g, Var<T> x) {
    h1 = l1(g, x);
    h2 = l2(g, h1);
    h3 = l3(g, h2);
    return l4(g, h3);
  }
};

// The largest |y - ref| / bound over a Linear's outputs, ref its GEMM in FP64
// on the stored bf16 values of x, W and b, bound = 2^-8 |ref| (one bf16
// rounding of the fp32 result) + 2^-20 sum |terms| (its fp32 accumulation).
template <class Store, class L>
double worst_against_bf16(Context<host>& ctx, Store& store, const L& layer, Var<bfloat16> x, Var<bfloat16> y) {
  const std::int64_t rows = x.rows(), in = layer.in_features(), out = layer.out_features();
  const auto xs = as_floats(ctx, x.data, x.size()), ys = as_floats(ctx, y.data, y.size());
  const auto ws = as_floats(ctx, store.values(layer.weight()).data, static_cast<std::size_t>(in * out));
  const auto bs = as_floats(ctx, store.values(layer.bias()).data, static_cast<std::size_t>(out));
  double worst = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      double ref = bs[j], abs = std::fabs(bs[j]);
      for (std::int64_t k = 0; k < in; ++k) {
        const double t = static_cast<double>(xs[i * in + k]) * ws[j * in + k];
        ref += t, abs += std::fabs(t);
      }
      const double bound = 0x1p-8 * std::fabs(ref) + 0x1p-20 * abs + 1e-30;
      worst = std::max(worst, std::fabs(ys[i * out + j] - ref) / bound);
    }
  return worst;
}
}  // namespace

TEST_CASE("O2-fp8 with a middle Linear under NoFp8: its GEMMs run in bf16, and the FP8 state has no slot for it") {
  using P = O2FP8Policy;
  static_assert(!uses_fp8_v<NoFp8<P>> && std::is_same_v<model_policy_t<NoFp8<P>>, P>);
  static_assert(nn::weight_role_v<NoFp8<P>> == nn::role::weight);  // bf16 weights with fp32 masters, as the model's
  Context<host> ctx;
  nn::Model<P, host, Fp8Net<P, host>> model(ctx, {.max_batch = 8, .seed = 5});
  auto& store = model.parameters();
  const auto& layers = store.fp8().layers();
  REQUIRE(layers.size() == 3);
  CHECK(layers[0].name == "l1");
  CHECK(layers[1].name == "l3");
  CHECK(layers[2].name == "l4");
  CHECK(!store.fp8().enabled(0));  // the first layer
  CHECK(store.fp8().enabled(1));   // l3 alone runs in FP8
  CHECK(!store.fp8().enabled(2));  // the last layer

  optim::AdamW<P, host> opt(store, {.lr = 1e-3f});
  const std::vector<float> x = ramp(8 * 16, 1.0f, 0.1f), target = ramp(8 * 4, 0.3f, 0.9f);
  auto out = model.forward(ctx, TensorView<const float>(x.data(), Shape{8, 16}));
  const auto& net = model.net();
  CHECK(worst_against_bf16(ctx, store, net.l2, net.h1, net.h2) <= 1.0);
  // The check tells the formats apart: l3's E4M3 operands miss the bf16 bound.
  CHECK(worst_against_bf16(ctx, store, net.l3, net.h2, net.h3) > 1.0);
  auto loss = nn::mse_loss(ctx, out, TensorView<const float>(target.data(), Shape{8, 4}));
  opt.zero_grad();
  amp::scale_loss(loss, opt).backward();
  opt.step();
  CHECK(opt.applied_steps() == 1);
}

TEST_CASE_TEMPLATE("ZeRO-1 partitions the fp32 role as the others; it keeps no master, also under O3", P, O2Policy,
                   O3Policy) {
  Context<host> ctx(1);
  for (int ranks : {2, 3})
    for (int rank = 0; rank < ranks; ++rank) {
      CAPTURE(ranks);
      CAPTURE(rank);
      nn::ParameterStore<P, host> store(ctx);
      store.template declare<nn::role::weight>("w", {1000}, nn::Init::constant(1.0f));
      store.template declare<nn::role::fp32>("head.weight", {700}, nn::Init::constant(0.5f));
      store.template declare<nn::role::fp32>("head.bias", {7}, nn::Init::constant(0.25f));
      store.template declare<nn::role::norm>("g", {64}, nn::Init::constant(1.0f));
      store.allocate({rank, ranks});
      store.initialize(1);
      const auto& a = store.template arena<nn::role::fp32>();
      const auto& bounds = store.template shard_bounds<nn::role::fp32>();
      REQUIRE(bounds.size() == static_cast<std::size_t>(ranks) + 1);
      CHECK(bounds.back() == a.count());
      CHECK(a.shard_begin() == bounds[static_cast<std::size_t>(rank)]);
      CHECK(a.shard_count() < a.count());
      CHECK(a.master().size == 0);
      for (const auto& p : store.table()) {
        std::size_t covered = 0;
        for (int r = 0; r < ranks; ++r) covered += store.part(p, r).size();
        CHECK(covered == p.count);
      }
      CHECK(store.get_values(1) == std::vector<float>(700, 0.5f));  // its own master: the values, whole on every rank
    }
}

TEST_CASE("a checkpoint's FP8 state is restored into the same FP8 layers only (NoFp8 moved: it starts afresh)") {
  using P = O2FP8Policy;
  Context<host> ctx;
  const std::vector<float> x = ramp(8 * 16, 1.0f, 0.1f), target = ramp(8 * 4, 0.3f, 0.9f);
  nn::Model<P, host, Fp8Net<P, host, 2>> model(ctx, {.max_batch = 8, .seed = 5});
  optim::AdamW<P, host> opt(model.parameters(), {.lr = 1e-3f});
  for (int i = 0; i < 2; ++i) {
    auto loss = nn::mse_loss(ctx, model.forward(ctx, TensorView<const float>(x.data(), Shape{8, 16})),
                             TensorView<const float>(target.data(), Shape{8, 4}));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
  }
  const auto scales = download(ctx, Span<const float>(model.parameters().fp8().scale_values()));
  REQUIRE(std::any_of(scales.begin(), scales.end(), [](float v) { return v != 1.0f; }));
  const std::string path = test::temp_path("layer_precision_fp8.ckpt");
  io::save(path, model, opt);

  nn::Model<P, host, Fp8Net<P, host, 2>> same(ctx, {.max_batch = 8, .seed = 9});
  optim::AdamW<P, host> same_opt(same.parameters(), {.lr = 1e-3f});
  io::load(path, same, same_opt);
  CHECK(download(ctx, Span<const float>(same.parameters().fp8().scale_values())) == scales);

  nn::Model<P, host, Fp8Net<P, host, 3>> moved(ctx, {.max_batch = 8, .seed = 9});  // l2 in FP8, l3 out
  optim::AdamW<P, host> moved_opt(moved.parameters(), {.lr = 1e-3f});
  REQUIRE(moved.parameters().fp8().operands() == model.parameters().fp8().operands());
  io::load(path, moved, moved_opt);
  const auto fresh = download(ctx, Span<const float>(moved.parameters().fp8().scale_values()));
  CHECK(std::all_of(fresh.begin(), fresh.end(), [](float v) { return v == 1.0f; }));
  CHECK(moved.parameters().get_values(0) == model.parameters().get_values(0));  // the weights are restored
  std::filesystem::remove(path);
}
