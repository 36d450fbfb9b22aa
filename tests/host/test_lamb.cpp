// LAMB against Apex FusedLAMB's step computed here in FP64: per-tensor trust
// ratios over tensors larger than a chunk, groups, every option, O2 with a
// skipped overflow.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "amp/amp.hpp"

using namespace amp;

namespace {
// Three tensors: 'big' spans two chunks; 'bias' is selected by a group without weight decay.
const std::vector<std::int64_t> sizes{static_cast<std::int64_t>(optim::tensor_chunk) + 4464, 5, 3};
const char* names[] = {"big", "bias", "last"};

template <Policy P>
struct Params {
  std::unique_ptr<nn::ParameterStore<P, host>> store;
  std::vector<nn::Param<nn::role::weight>> p;
  explicit Params(Context<host>& ctx) : store(std::make_unique<nn::ParameterStore<P, host>>(ctx)) {
    for (std::size_t t = 0; t < sizes.size(); ++t)
      p.push_back(store->template declare<nn::role::weight>(names[t], {sizes[t]}, nn::Init::constant(0.0f)));
    store->allocate();
  }
};

double value(std::size_t t, std::size_t i, int seed) {  // deterministic, varied magnitudes per tensor
  return std::sin(0.37 * static_cast<double>(i + 1) + seed + 1.7 * t) * (t + 1) * (t == 1 ? 0.01 : 0.5);
}

// Apex FusedLAMB (multi_tensor_lamb.cu) in FP64.
struct Reference {
  optim::LambOptions o;
  std::vector<std::vector<double>> w, m, v;
  std::vector<double> wd;  // per tensor
  int t = 0;
  void step(const std::vector<std::vector<double>>& g) {
    ++t;
    double sumsq = 0;
    for (const auto& x : g)
      for (double e : x) sumsq += e * e;
    const double norm = std::sqrt(sumsq);
    const double clip = o.max_grad_norm > 0 && norm > o.max_grad_norm ? norm / o.max_grad_norm : 1.0;
    const double bc1 = o.bias_correction ? 1 - std::pow(double(o.beta1), t) : 1.0;
    const double bc2 = o.bias_correction ? 1 - std::pow(double(o.beta2), t) : 1.0;
    for (std::size_t k = 0; k < w.size(); ++k) {
      std::vector<double> u(w[k].size());
      double wn = 0, un = 0;
      for (std::size_t i = 0; i < u.size(); ++i) {
        double gi = g[k][i] / clip;
        if (!o.adam_w_mode) gi += wd[k] * w[k][i];
        m[k][i] = o.beta1 * m[k][i] + (o.grad_averaging ? 1 - o.beta1 : 1.0) * gi;
        v[k][i] = o.beta2 * v[k][i] + (1 - o.beta2) * gi * gi;
        u[i] = (m[k][i] / bc1) / (std::sqrt(v[k][i] / bc2) + o.eps) + (o.adam_w_mode ? wd[k] * w[k][i] : 0.0);
        wn += w[k][i] * w[k][i], un += u[i] * u[i];
      }
      wn = std::sqrt(wn), un = std::sqrt(un);
      const double ratio = (o.use_nvlamb || wd[k] != 0) && wn != 0 && un != 0 ? wn / un : 1.0;
      for (std::size_t i = 0; i < u.size(); ++i) w[k][i] -= o.lr * ratio * u[i];
    }
  }
};

template <Policy P>
void set_grads(Context<host>& ctx, Params<P>& ps, const std::vector<std::vector<double>>& g, float scale) {
  using G = typename P::grad_type;
  for (std::size_t k = 0; k < g.size(); ++k) {
    std::vector<G> stored(g[k].size());
    for (std::size_t i = 0; i < stored.size(); ++i) stored[i] = cast<G>(static_cast<float>(g[k][i] * scale));
    upload(ctx, ps.store->grads(ps.p[k]), stored);
  }
}

template <Policy P>
std::vector<std::vector<double>> grads_as_stored(int step) {
  using G = typename P::grad_type;
  std::vector<std::vector<double>> g(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::int64_t i = 0; i < sizes[k]; ++i)
      g[k].push_back(cast<float>(cast<G>(static_cast<float>(value(k, static_cast<std::size_t>(i), 10 + step) * 0.2))));
  return g;
}
}  // namespace

TEST_CASE("LAMB matches Apex FusedLAMB's steps in FP64: trust ratios per tensor, groups, every option") {
  struct Case {
    const char* what;
    optim::LambOptions o;
  };
  const Case cases[] = {
      {"defaults (AdamW mode, bias correction, grad averaging, global norm 1)", {.lr = 0.01f}},
      {"L2 mode, no bias correction, no grad averaging, nvlamb, no pre-normalisation",
       {.lr = 0.02f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-4f, .weight_decay = 0.1f, .bias_correction = false,
        .grad_averaging = false, .adam_w_mode = false, .use_nvlamb = true, .max_grad_norm = 0.0f}},
      {"no weight decay: no trust ratio (Apex), a large global norm bound",
       {.lr = 0.005f, .weight_decay = 0.0f, .max_grad_norm = 1e6f}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    Context<host> ctx;
    Params<O0Policy> ps(ctx);
    const optim::LambOptions o = c.o;
    Reference ref{o, {}, {}, {}, {}};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> init;
      for (std::int64_t i = 0; i < sizes[k]; ++i) init.push_back(static_cast<float>(value(k, static_cast<std::size_t>(i), 0)));
      ps.store->set_values(ps.p[k].index, init);
      ref.w.emplace_back(init.begin(), init.end());
      ref.m.emplace_back(init.size(), 0.0), ref.v.emplace_back(init.size(), 0.0);
      ref.wd.push_back(k == 1 ? 0.0 : o.weight_decay);
    }
    optim::LAMB<O0Policy, host> lamb(*ps.store, o, {.groups = {{optim::select::prefix("bias"), std::nullopt, 0.0f}}});
    for (int step = 0; step < 4; ++step) {
      const auto g = grads_as_stored<O0Policy>(step);
      set_grads(ctx, ps, g, 1.0f);
      lamb.step();
      ref.step(g);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        CAPTURE(names[k]);
        const auto got = ps.store->get_values(ps.p[k].index);
        double worst = 0, largest = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::abs(got[i] - ref.w[k][i])), largest = std::max(largest, std::abs(ref.w[k][i]));
        CAPTURE(step);
        CHECK(worst <= 2e-6 * largest + 1e-4 * o.lr);  // fp32 sums of 65536 squares: ~1e-5 of a step
      }
    }
    CHECK(lamb.applied_steps() == 4);
  }
}

TEST_CASE("LAMB: the trust ratio sets each tensor's step size to lr x |w| whatever its gradient's scale") {
  // One step from m = v = 0 with bias correction: u = g / (|g| + eps) elementwise (sign, for |g| >> eps), so a
  // tensor moves by lr |w| / |u| |u| = lr |w| in norm, gradient scaled by 1000 or not.
  for (const float gscale : {1.0f, 1000.0f}) {
    CAPTURE(gscale);
    Context<host> ctx;
    Params<O0Policy> ps(ctx);
    std::vector<double> before(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> init;
      for (std::int64_t i = 0; i < sizes[k]; ++i) init.push_back(static_cast<float>(value(k, static_cast<std::size_t>(i), 0)));
      ps.store->set_values(ps.p[k].index, init);
      for (float x : init) before[k] += double(x) * x;
    }
    optim::LAMB<O0Policy, host> lamb(*ps.store, {.lr = 0.1f, .weight_decay = 1e-9f, .max_grad_norm = 0.0f});
    auto g = grads_as_stored<O0Policy>(0);
    for (auto& x : g)
      for (double& e : x) e *= gscale;
    set_grads(ctx, ps, g, 1.0f);
    const auto w0 = std::vector<std::vector<float>>{ps.store->get_values(0), ps.store->get_values(1), ps.store->get_values(2)};
    lamb.step();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto w1 = ps.store->get_values(static_cast<int>(k));
      double moved = 0;
      for (std::size_t i = 0; i < w1.size(); ++i) moved += double(w1[i] - w0[k][i]) * (w1[i] - w0[k][i]);
      CAPTURE(names[k]);
      CHECK(std::sqrt(moved) == doctest::Approx(0.1 * std::sqrt(before[k])).epsilon(1e-4));  // |w| and |u| are fp32 sums
    }
  }
}

TEST_CASE_TEMPLATE("LAMB under a loss scaler: an overflow skips the step bit for bit; then the step is unscaled", P,
                   O2Policy, O2BF16Policy) {
  Context<host> ctx;
  Params<P> ps(ctx);
  Reference ref{{.lr = 0.01f}, {}, {}, {}, {}};
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    std::vector<float> init;
    for (std::int64_t i = 0; i < sizes[k]; ++i)
      init.push_back(cast<float>(cast<typename P::param_type>(static_cast<float>(value(k, static_cast<std::size_t>(i), 0)))));
    ps.store->set_values(ps.p[k].index, init);
    ref.w.emplace_back(init.begin(), init.end());
    ref.m.emplace_back(init.size(), 0.0), ref.v.emplace_back(init.size(), 0.0), ref.wd.push_back(0.01);
  }
  optim::LAMB<P, host> lamb(*ps.store, ref.o);
  const float scale = lamb.scaler().state().scale;
  // An overflow: the step is skipped, nothing changes.
  auto bad = grads_as_stored<P>(0);
  bad[0][70000 - 5] = std::numeric_limits<double>::infinity();
  set_grads(ctx, ps, bad, scale);
  const auto before = ps.store->get_values(0);
  lamb.step();
  CHECK(lamb.applied_steps() == 0);
  CHECK(ps.store->get_values(0) == before);
  CHECK(lamb.template state_buffer<nn::role::weight>(0).size == ps.store->template arena<nn::role::weight>().count());
  CHECK(download(ctx, Span<const float>(lamb.template state_buffer<nn::role::weight>(1)))[3] == 0.0f);
  // Two good steps: the masters follow the FP64 step of the gradients as stored (scaled, rounded, unscaled).
  for (int step = 0; step < 2; ++step) {
    const float s = lamb.scaler().state().scale;
    lamb.zero_grad();
    auto g = grads_as_stored<P>(step);
    set_grads(ctx, ps, g, s);
    using G = typename P::grad_type;
    for (std::size_t k = 0; k < g.size(); ++k)
      for (double& e : g[k]) e = cast<float>(cast<G>(static_cast<float>(e * s))) / s;
    lamb.step();
    ref.step(g);
  }
  CHECK(lamb.applied_steps() == 2);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    CAPTURE(names[k]);
    const auto got = ps.store->get_values(ps.p[k].index);  // the fp32 masters
    double worst = 0, largest = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - ref.w[k][i])), largest = std::max(largest, std::abs(ref.w[k][i]));
    CHECK(worst <= 2e-6 * largest + 1e-4 * ref.o.lr);
  }
}

TEST_CASE("LAMB options are validated") {
  Context<host> ctx;
  Params<O0Policy> ps(ctx);
  using Lamb = optim::LAMB<O0Policy, host>;
  CHECK_THROWS_WITH_AS(Lamb(*ps.store, {.beta1 = 1.0f}), doctest::Contains("LAMB: betas must lie in [0, 1), got 1"), Error);
  CHECK_THROWS_WITH_AS(Lamb(*ps.store, {.eps = 0.0f}), doctest::Contains("LAMB: need eps > 0"), Error);
  CHECK_THROWS_WITH_AS(Lamb(*ps.store, {.weight_decay = -1.0f}), doctest::Contains("weight_decay >= 0, got 1e-06, -1"),
                       Error);
}
