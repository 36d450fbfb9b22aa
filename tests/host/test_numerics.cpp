// The numerics report: counts against tensors built to hold known values, a
// model's rows against what the store and the check hold, the first tensor
// of a skipped step, FP8 operands against their state, and nothing when off.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/amp.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
template <Policy P>
using Net = nn::Sequential<P, host, nn::Linear, nn::LayerNorm, nn::ReLU, nn::Linear, nn::Linear>;

template <Policy P>
Net<P> make_net(Context<host>& ctx, int every) {
  return Net<P>(ctx, {.max_batch = 8, .seed = 3, .numerics_every = every}, {.in_features = 4, .out_features = 16},
                {.features = 16}, {}, {.in_features = 16, .out_features = 16}, {.in_features = 16, .out_features = 3});
}

struct Batch {
  std::vector<float> x = random_values<float>(32, 7);
  std::vector<std::int32_t> labels = {0, 1, 2, 0, 1, 2, 0, 1};
  auto input() const { return matrix<const float>(x.data(), 8, 4); }
  Span<const std::int32_t> targets() const { return {labels.data(), labels.size()}; }
};

template <class N, class O>
void train_step(Context<host>& ctx, N& net, O& opt, const Batch& b) {
  auto loss = nn::cross_entropy(ctx, net.forward(ctx, b.input()), b.targets());
  opt.zero_grad();
  scale_loss(loss, opt).backward();
  opt.step();
}

const nn::NumericsRow* find(const std::vector<nn::NumericsRow>& rows, std::int64_t step, const std::string& tensor,
                            const std::string& kind) {
  for (const auto& r : rows)
    if (r.step == step && r.tensor == tensor && r.kind == kind) return &r;
  return nullptr;
}
}  // namespace

TEST_CASE("a tensor's zeros, subnormals, non-finite values, underflow and amax, counted in its stored type") {
  Context<host> ctx;
  nn::Numerics<host> report;
  report.enable(ctx, 1);
  // 2^-20 is subnormal in fp16 (its smallest normal is 2^-14); 1e-9 rounds to zero there.
  const std::vector<float> source = {0.0f, 1e-9f, std::ldexp(1.0f, -20), 3.0f, -5.0f, 1e6f, 0.25f, -0.0f};
  std::vector<half> stored(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) stored[i] = cast<half>(source[i]);
  REQUIRE(cast<float>(stored[5]) == std::numeric_limits<float>::infinity());
  report.observe(nn::numerics_site::parameter, "w", stored.data(), stored.size(), source.data());
  report.observe(nn::numerics_site::activation, "w", stored.data(), stored.size());  // another kind: its own row
  report.observe(nn::numerics_site::parameter, "w", stored.data(), 4);               // the same site again: w#2
  const auto rows = report.take();
  REQUIRE(rows.size() == 3);
  const nn::NumericsRow& r = rows[0];
  CHECK(r.tensor == "w");
  CHECK(r.kind == "parameter");
  CHECK(r.dtype == "fp16");
  CHECK(r.count == 8);
  CHECK(r.zero == doctest::Approx(3.0 / 8));       // 0, 1e-9 flushed, -0
  CHECK(r.subnormal == doctest::Approx(1.0 / 8));  // 2^-20
  CHECK(r.overflow == doctest::Approx(1.0 / 8));   // 1e6
  CHECK(r.underflow == doctest::Approx(2.0 / 8));  // 1e-9 and 2^-20: not zero in fp32
  CHECK(r.amax == 5.0f);
  CHECK(rows[1].underflow == -1.0);  // no source
  CHECK(rows[2].tensor == "w#2");
  CHECK(rows[2].count == 4);
  CHECK(report.take().empty());  // taken once
}

TEST_CASE_TEMPLATE("a model's report: every N-th step, each parameter, gradient and layer, as the forward used them",
                   P, O0Policy, O1Policy, O2Policy, O2BF16Policy) {
  // O1's GEMMs read the weights' fp16 cast cache: that is what the report shows, rounded from the fp32 values.
  using Seen = std::conditional_t<casts_weights_v<P>, typename P::template compute_type<op::gemm>, typename P::param_type>;
  Context<host> ctx;
  const Batch b;
  auto net = make_net<P>(ctx, 2);
  optim::SGD<P, host> opt(net.parameters(), {.lr = 0.1f});
  const auto& store = net.parameters();
  std::vector<float> values_at_step2;
  for (int step = 0; step < 3; ++step) {
    if (step == 2)
      for (std::size_t i = 0; i < store.table().size(); ++i) {
        const auto v = store.get_values(static_cast<int>(i));
        values_at_step2.push_back(0.0f);
        for (float x : v) values_at_step2.back() = std::max(values_at_step2.back(), std::abs(round_to<Seen>(x)));
      }
    train_step(ctx, net, opt, b);
  }
  const auto rows = net.parameters().numerics().take();
  std::map<std::int64_t, int> per_step;
  for (const auto& r : rows) ++per_step[r.step];
  REQUIRE(per_step.size() == 2);  // steps 0 and 2
  CHECK(per_step.count(0) == 1);
  CHECK(per_step.count(2) == 1);
  CHECK(per_step[0] == per_step[2]);

  float grad_amax = 0;
  for (std::size_t i = 0; i < store.table().size(); ++i) {
    const auto& p = store.table()[i];
    const nn::NumericsRow* w = find(rows, 2, p.name, "parameter");
    const nn::NumericsRow* g = find(rows, 2, p.name, "gradient");
    REQUIRE(w);
    REQUIRE(g);
    CHECK(w->count == p.count);
    if (p.kind == nn::role::weight) {
      CHECK(w->amax == values_at_step2[i]);  // the values the step's forward used, as stored
      CHECK(w->dtype == type_name<Seen>());
      CHECK(g->dtype == type_name<typename P::grad_type>());
    }
    CHECK(w->overflow == 0);
    CHECK(g->overflow == 0);
    // O2 keeps fp32 masters of its fp16 weights, O1 casts fp32 weights: underflow is measured against the fp32 source.
    CHECK((w->underflow >= 0) == (p.kind == nn::role::weight && (uses_master_weights_v<P> || casts_weights_v<P>)));
    CHECK(g->scale == (P::loss_scaling == scaling::dynamic ? 65536.0f : 1.0f));
    grad_amax = std::max(grad_amax, g->amax);
  }
  CHECK(grad_amax == opt.last_stats().maxabs);  // the check's own statistics of step 2
  // Each layer's output and the gradient that reached it.
  for (const char* layer : {"0", "1", "3", "4"}) {
    const nn::NumericsRow* y = find(rows, 0, layer, "activation");
    CAPTURE(layer);
    REQUIRE(y);
    CHECK(y->count == 8 * (std::string(layer) == "4" ? 3 : 16));
    CHECK(y->dtype == type_name<typename P::activation_type>());
    CHECK(y->amax > 0);
    const nn::NumericsRow* dy = find(rows, 0, layer, "activation_grad");
    REQUIRE(dy);
    CHECK(dy->scale == (P::loss_scaling == scaling::dynamic ? 65536.0f : 1.0f));  // it carries the loss scale
  }
}

TEST_CASE("an underflowing master shows in its parameter's row") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O2Policy>(ctx, 1);
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.0f});
  auto v = net.parameters().get_values(0);
  v[0] = 1e-9f, v[1] = 1e-6f;  // fp16: flushed to zero; subnormal
  net.parameters().set_values(0, v);
  train_step(ctx, net, opt, b);
  const auto rows = net.parameters().numerics().take();
  const nn::NumericsRow* w = find(rows, 0, net.parameters().table()[0].name, "parameter");
  REQUIRE(w);
  CHECK(w->underflow * static_cast<double>(w->count) == doctest::Approx(2.0));
  CHECK(w->subnormal * static_cast<double>(w->count) >= 1.0);
}

TEST_CASE("a skipped step names the parameter where backward met the inf/NaN first (the last in the table), on the device") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O2Policy>(ctx, 100);
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f});
  auto& store = net.parameters();
  const std::int32_t* first = store.numerics().first_nonfinite();
  train_step(ctx, net, opt, b);
  CHECK(download_one(ctx, first) == -1);

  // Poison two gradients after the backward, the last element of each: the later is where backward met it first.
  const auto& table = store.table();
  const int late = static_cast<int>(table.size()) - 1, early = 1;
  auto loss = nn::cross_entropy(ctx, net.forward(ctx, b.input()), b.targets());
  opt.zero_grad();
  scale_loss(loss, opt).backward();
  for (const int k : {late, early}) {
    const auto& p = table[static_cast<std::size_t>(k)];
    REQUIRE(p.kind == nn::role::weight);
    auto grads = store.template arena<nn::role::weight>().grads();
    const half inf = cast<half>(std::numeric_limits<float>::infinity());
    upload(ctx, grads.subspan(p.offset + p.count - 1, 1), &inf, 1);
  }
  opt.step();
  CHECK(opt.applied_steps() == 1);  // skipped
  CHECK(download_one(ctx, first) == late);

  train_step(ctx, net, opt, b);  // a clean step clears it
  CHECK(download_one(ctx, first) == -1);
}

TEST_CASE("FP8 operands: this iteration's amax, the scale its casts used, and the range they reach") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O2FP8Policy>(ctx, 1);
  optim::SGD<O2FP8Policy, host> opt(net.parameters(), {.lr = 0.1f});
  train_step(ctx, net, opt, b);
  net.parameters().numerics().take();
  const auto scales = download(ctx, Span<const float>(net.parameters().fp8().scale_values()));
  train_step(ctx, net, opt, b);
  const auto rows = net.parameters().numerics().take();
  const auto& layers = net.parameters().fp8().layers();
  REQUIRE(!layers.empty());
  int fp8_rows = 0;
  for (const auto& r : rows) {
    if (r.kind != "fp8") continue;
    const auto i = static_cast<std::size_t>(fp8_rows++);
    CAPTURE(r.tensor);
    CHECK(r.scale == scales[i]);  // the scale step 1's casts used
    const float max = i % 3 == 2 ? 57344.0f : 448.0f;
    CHECK(r.range == doctest::Approx(r.amax * r.scale / max));
    if (layers[i / 3].enabled) CHECK(r.amax > 0);
  }
  CHECK(fp8_rows == static_cast<int>(3 * layers.size()));
}

TEST_CASE("off, the report records nothing and adds no work to a step") {
  Context<host> ctx;
  const Batch b;
  auto off = make_net<O2Policy>(ctx, 0);
  optim::SGD<O2Policy, host> opt(off.parameters(), {.lr = 0.1f});
  train_step(ctx, off, opt, b);
  const auto launches = ctx.counters().launches;
  train_step(ctx, off, opt, b);
  const auto per_step_off = ctx.counters().launches - launches;
  CHECK(off.parameters().numerics().take().empty());

  Context<host> ctx2;
  auto on = make_net<O2Policy>(ctx2, 1000);
  optim::SGD<O2Policy, host> opt2(on.parameters(), {.lr = 0.1f});
  train_step(ctx2, on, opt2, b);
  const auto launches2 = ctx2.counters().launches;
  train_step(ctx2, on, opt2, b);  // not a report step: the first-non-finite search only (2 launches a role)
  CHECK(ctx2.counters().launches - launches2 == per_step_off + 4);
  CHECK_THROWS_WITH_AS(make_net<O2Policy>(ctx, -1), doctest::Contains("numerics_every must be >= 0"), Error);
}

TEST_CASE("a captured step's replays count as steps; a reported step runs eagerly and is the one recorded") {
  Context<host> ctx;
  const Batch b;
  auto net = make_net<O2Policy>(ctx, 3);
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f});
  auto& report = net.parameters().numerics();
  train_step(ctx, net, opt, b);  // step 0: reported
  CapturedStep<host> step(ctx, [&] { train_step(ctx, net, opt, b); });  // step 1 eagerly, then the recording
  CHECK(report.step() == 2);
  step.replay();  // step 2
  CHECK(report.step() == 3);
  REQUIRE(report.due());
  train_step(ctx, net, opt, b);  // step 3, eagerly: reported
  step.replay();                 // step 4
  CHECK(report.step() == 5);
  std::map<std::int64_t, int> per_step;
  for (const auto& r : report.take()) ++per_step[r.step];
  CHECK(per_step.size() == 2);
  CHECK(per_step.count(0) == 1);
  CHECK(per_step.count(3) == 1);
  CHECK(per_step[0] == per_step[3]);
  CHECK(opt.applied_steps() == 5);
}

TEST_CASE("the report leaves a Linear head's logits to a fused loss, and a reported step is never captured") {
  Context<host> ctx;
  const Batch b;
  using Head = nn::Sequential<O2Policy, host, nn::Linear, nn::ReLU, nn::Linear>;
  Head net(ctx, {.max_batch = 8, .seed = 3, .fused_loss = true, .numerics_every = 2},
           {.in_features = 4, .out_features = 16}, {}, {.in_features = 16, .out_features = 3});
  optim::SGD<O2Policy, host> opt(net.parameters(), {.lr = 0.1f});
  auto fused_step = [&] {
    auto loss = nn::fused_cross_entropy(ctx, net.forward(ctx, b.input()), b.targets(), opt);
    opt.zero_grad();
    scale_loss(loss, opt).backward();
    opt.step();
  };
  fused_step();  // step 0: reported, the head's output observed before the loss writes its gradient over it
  const auto rows = net.parameters().numerics().take();
  const nn::NumericsRow* dy = find(rows, 0, "2", "activation_grad");
  REQUIRE(dy);
  CHECK(dy->amax > 0);
  CHECK(dy->overflow == 0);
  CHECK_THROWS_WITH_AS(CapturedStep<host>(ctx, fused_step), doctest::Contains("is a reported step"), Error);
  CHECK(opt.applied_steps() == 2);  // the warm-up ran (step 1); the capture of step 2 was refused
}

TEST_CASE("the report is refused under ZeRO-1, by name, before anything is built") {
  Context<host> ctx;
  CHECK_THROWS_WITH_AS(Net<O2Policy>(ctx, {.max_batch = 8, .shard = {0, 2}, .numerics_every = 1},
                                     {.in_features = 4, .out_features = 16}, {.features = 16}, {},
                                     {.in_features = 16, .out_features = 16}, {.in_features = 16, .out_features = 3}),
                       doctest::Contains("under ZeRO-1"), Error);
  CHECK(ctx.memory().current_total() == 0);
}
