#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "amp/amp.hpp"
#include "support/policies.hpp"
#include "support/reference.hpp"
#include "support/reference_mlp.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {

constexpr std::int64_t kIn = 6, kHidden = 5, kOut = 4, kRows = 7;

template <Policy P, template <class, class> class Act>
using Mlp = nn::Sequential<P, host, nn::Linear, Act, nn::Linear>;

// The model's parameters as FP64 (the master copy where there is one).
template <class Model>
std::vector<double> parameters_of(Context<host>& ctx, Model& model) {
  auto& params = model.parameters();
  if constexpr (std::remove_reference_t<decltype(params)>::has_master)
    return to_double(download(ctx, Span<const float>(params.master())));
  else
    return to_double(download(ctx, Span<const typename Model::policy::param_type>(params.weights())));
}

template <class Model>
RefMlp reference_of(Model& model, act a) {
  auto& l1 = model.layers().head;
  auto& l2 = model.layers().tail.tail.head;
  return {kIn, kHidden, kOut, a, l1.weight_slot().offset, l1.bias_slot().offset, l2.weight_slot().offset,
          l2.bias_slot().offset};
}

// Forward against the FP64 reference, backward against FP64 finite differences.
template <Policy P, template <class, class> class Act>
void check_mlp(act a, loss_kind kind) {
  CAPTURE(policy_name<P>());
  CAPTURE(static_cast<int>(a));
  CAPTURE(static_cast<int>(kind));
  Context<host> ctx;
  Mlp<P, Act> model(ctx, {.max_batch = 8, .seed = 3}, {.in_features = kIn, .out_features = kHidden}, {},
                    {.in_features = kHidden, .out_features = kOut});
  // Inputs exact in every storage type, so the reference sees what the model sees.
  const auto x = random_values<amp::bfloat16>(kRows * kIn, 11, -2.0f, 2.0f);
  std::vector<float> xf(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xf[i] = cast<float>(x[i]);
  auto target = random_values<float>(kRows * kOut, 12, kind == loss_kind::bce ? 0.0f : -1.0f, 1.0f);
  std::vector<std::int32_t> labels(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) labels[r] = static_cast<std::int32_t>((r * 3) % kOut);

  auto out = model.forward(ctx, matrix<const float>(xf.data(), kRows, kIn));
  const auto tm = matrix<const float>(target.data(), kRows, kOut);
  auto loss = kind == loss_kind::mse ? nn::mse_loss(ctx, out, tm)
              : kind == loss_kind::bce ? nn::bce_with_logits(ctx, out, tm)
                                       : nn::cross_entropy(ctx, out, Span<const std::int32_t>{labels.data(), labels.size()});
  fill(ctx, model.parameters().grads(), cast<typename P::grad_type>(0.0f));
  loss.backward();

  const RefMlp ref = reference_of(model, a);
  const std::vector<double> p = parameters_of(ctx, model);
  const std::vector<double> xd = to_double(xf), td = to_double(target);
  const double rtol = policy_rtol<P>();

  // Forward values and the loss value.
  const auto y_ref = ref.forward(p, xd, kRows);
  const auto y_got = to_double(download(ctx, Span<const typename P::activation_type>(out.value.span())));
  double y_scale = 0;
  for (double v : y_ref) y_scale = std::max(y_scale, std::abs(v));
  CHECK(worst_error_ratio(y_got, y_ref, 0.0, rtol * y_scale) <= 1.0);
  const double l_ref = RefMlp::loss(kind, y_ref, td, labels, kRows, kOut);
  CHECK(loss.item() == doctest::Approx(l_ref).epsilon(rtol));

  // Every parameter's gradient against a central difference of the FP64 loss.
  auto f = [&](const std::vector<double>& q) { return RefMlp::loss(kind, ref.forward(q, xd, kRows), td, labels, kRows, kOut); };
  const auto g_got = to_double(download(ctx, Span<const typename P::grad_type>(model.parameters().grads())));
  std::vector<double> fd(p.size(), 0.0);
  double g_scale = 0;
  for (const std::size_t base : {ref.w1, ref.b1, ref.w2, ref.b2}) {
    const std::size_t n = base == ref.w1 ? kIn * kHidden : base == ref.b1 ? kHidden : base == ref.w2 ? kHidden * kOut : kOut;
    for (std::size_t i = base; i < base + n; ++i) {
      fd[i] = central_difference(f, p, i, 1e-5);
      g_scale = std::max(g_scale, std::abs(fd[i]));
    }
  }
  REQUIRE(g_scale > 0);
  CHECK(worst_error_ratio(g_got, fd, rtol, rtol * g_scale) <= 1.0);
}

template <Policy P>
void check_all() {
  check_mlp<P, nn::ReLU>(act::relu, loss_kind::mse);
  check_mlp<P, nn::GELU>(act::gelu, loss_kind::cross_entropy);
  check_mlp<P, nn::Tanh>(act::tanh, loss_kind::bce);
  check_mlp<P, nn::Sigmoid>(act::sigmoid, loss_kind::cross_entropy);
  check_mlp<P, nn::ReLU>(act::relu, loss_kind::bce);
}

}  // namespace

TEST_CASE_TEMPLATE("layers and losses: forward vs FP64, gradients vs FP64 finite differences", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  check_all<P>();
}

TEST_CASE("Linear without bias, and bad shapes are refused with the shapes named") {
  Context<host> ctx;
  nn::Sequential<O0Policy, host, nn::Linear> model(ctx, {.max_batch = 4, .seed = 1},
                                                   {.in_features = 3, .out_features = 2, .bias = false});
  CHECK(model.parameters().count() == 128);  // one padded block: no bias block
  std::vector<float> x{1, 2, 3, 4, 5, 6};
  auto y = model.forward(ctx, matrix<const float>(x.data(), 2, 3));
  const auto w = download(ctx, Span<const float>(model.parameters().weights()));
  const auto got = download(ctx, Span<const float>(y.value.span()));
  CHECK(got[0] == doctest::Approx(w[0] * 1 + w[1] * 2 + w[2] * 3));
  CHECK(got[3] == doctest::Approx(w[3] * 4 + w[4] * 5 + w[5] * 6));

  CHECK_THROWS_WITH_AS(model.forward(ctx, matrix<const float>(x.data(), 3, 2)),
                       doctest::Contains("input [3x2] (ld 2) does not fit a model of 3 input features"), Error);
  std::vector<float> big(15);
  CHECK_THROWS_WITH_AS(model.forward(ctx, matrix<const float>(big.data(), 5, 3)), doctest::Contains("max_batch 4"),
                       Error);
  std::vector<float> t(6);
  CHECK_THROWS_WITH_AS(nn::mse_loss(ctx, y, matrix<const float>(t.data(), 3, 2)),
                       doctest::Contains("prediction [2x2] and target [3x2] differ"), Error);
  std::vector<std::int32_t> labels{0, 2};
  CHECK_THROWS_WITH_AS(nn::cross_entropy(ctx, y, Span<const std::int32_t>{labels.data(), 2}),
                       doctest::Contains("label 2 at row 1 is outside [0, 2)"), Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(ctx, y, Span<const std::int32_t>{labels.data(), 1}),
                       doctest::Contains("1 labels for a prediction of 2 rows"), Error);
  CHECK_THROWS_WITH_AS((nn::Sequential<O0Policy, host, nn::Linear, nn::Linear>(
                           ctx, {}, {.in_features = 3, .out_features = 2}, {.in_features = 4, .out_features = 1})),
                       doctest::Contains("Linear(4 -> 1): the previous layer gives 2 features"), Error);
}

TEST_CASE("initialisation is deterministic, bounded and independent of the thread count") {
  Context<host> one(1), two(2);
  auto make = [](Context<host>& ctx) {
    return std::make_unique<nn::Sequential<O2Policy, host, nn::Linear>>(
        ctx, nn::SequentialOptions{.max_batch = 2, .seed = 9}, nn::Linear<O2Policy, host>::Config{.in_features = 300, .out_features = 200});
  };
  auto a = make(one);
  auto b = make(two);
  const auto ma = download(one, Span<const float>(a->parameters().master()));
  const auto mb = download(two, Span<const float>(b->parameters().master()));
  CHECK(ma == mb);
  const float bound = std::sqrt(6.0f / 300.0f);
  double mean = 0, sq = 0;
  for (std::size_t i = 0; i < 60000; ++i) {
    REQUIRE(std::abs(ma[i]) <= bound);
    mean += ma[i];
    sq += ma[i] * ma[i];
  }
  mean /= 60000;
  CHECK(std::abs(mean) < 0.01 * bound);
  CHECK(sq / 60000 == doctest::Approx(bound * bound / 3).epsilon(0.02));  // variance of U(-b, b)
  // The fp16 weights are the rounded master.
  const auto w = download(one, Span<const half>(a->parameters().weights()));
  for (std::size_t i = 0; i < ma.size(); ++i) REQUIRE(detail::bits(w[i]) == detail::bits(cast<half>(ma[i])));
}

namespace {
// The spacing of T's values at |x| (one unit in the last place).
template <class T>
double ulp_of(double x) {
  const double a = std::max(std::abs(x), static_cast<double>(cast<float>(limits<T>::min_normal())));
  return std::ldexp(1.0, std::ilogb(a) - (limits<T>::digits - 1));
}
}  // namespace

TEST_CASE_TEMPLATE("Linear rounds its output once: within half an ulp of the exact x W^T + b", P, O0Policy, O1Policy,
                   O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  using T = typename P::activation_type;
  using G = typename P::template compute_type<op::gemm>;
  constexpr std::int64_t rows = 16, in = 64, out = 48;
  Context<host> ctx;
  nn::Sequential<P, host, nn::Linear> model(ctx, {.max_batch = rows, .seed = 2}, {.in_features = in, .out_features = out});
  // Inputs exact in every storage type.
  const auto x = random_values<amp::bfloat16>(rows * in, 41, -2.0f, 2.0f);
  std::vector<float> xf(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xf[i] = cast<float>(x[i]);
  const auto y = download(ctx, Span<const T>(model.forward(ctx, matrix<const float>(xf.data(), rows, in)).value.span()));
  // What the GEMM multiplies: the weights and bias as compute_type<gemm> (O1: the cast cache).
  auto& layer = model.layers().head;
  const auto w = download(ctx, model.parameters().gemm_weights(layer.weight_slot()));
  const auto b = download(ctx, model.parameters().gemm_weights(layer.bias_slot()));
  int over = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < out; ++j) {
      double exact = cast<float>(b[j]), magnitude = std::abs(exact);
      for (std::int64_t i = 0; i < in; ++i) {
        const double p = static_cast<double>(xf[r * in + i]) * cast<float>(w[j * in + i]);
        exact += p, magnitude += std::abs(p);
      }
      const double accumulation = 2.0 * in * unit_roundoff<float> * magnitude;  // fp32 sums, before the rounding
      const double err = std::abs(cast<float>(y[r * out + j]) - exact);
      if (err > 0.5 * ulp_of<T>(exact) + accumulation) ++over;
    }
  static_assert(std::is_same_v<T, G> || std::is_same_v<T, float>);
  CHECK(over == 0);
}
