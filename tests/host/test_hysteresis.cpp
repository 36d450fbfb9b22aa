// The loss scaler's hysteresis against tables transcribed from the reference
// rules: Apex's csrc/update_scale_hysteresis.cu (the tracker refilled at every
// clean step), Megatron-LM's DynamicGradScaler.update in
// megatron/core/optimizer/grad_scaler.py (refilled only when the scale grows)
// and PyTorch's GradScaler (hysteresis 1). The references let the tracker go
// below 0; amp stops at 0, which makes the same decisions.
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "amp/amp.hpp"
#include "support/param_fixture.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();

// One step of a table: the verdict, then the reference's state after update().
struct Row {
  bool found_inf;
  float scale;
  int tracker;  // the reference's hysteresis tracker
  int growth;   // its growth tracker
};

// The real scaler of an optimizer driven through `rows`, from `from` (a
// fresh one unless given), checked after every step.
void drive(const ScalerConfig& cfg, const std::vector<Row>& rows, std::size_t first = 0, const ScalerState* from = nullptr) {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.0f}, {.scaler = cfg});
  if (from) opt.scaler().set_state(*from);
  long long skipped = from ? from->skipped : 0;
  for (std::size_t i = first; i < rows.size(); ++i) {
    CAPTURE(i);
    f.set_grads({rows[i].found_inf ? kInf : 1.0f});
    opt.step();
    skipped += rows[i].found_inf;
    const ScalerState s = opt.scaler().state();
    CHECK(s.scale == rows[i].scale);
    CHECK(s.hysteresis_left == std::max(rows[i].tracker, 0));
    CHECK(s.growth_tracker == rows[i].growth);
    CHECK(s.skipped == skipped);
  }
}

// The state after the first n rows of a table (what a checkpoint would hold).
ScalerState after(const ScalerConfig& cfg, const std::vector<Row>& rows, std::size_t n) {
  Context<host> ctx;
  ParamFixture<O1Policy, host> f(ctx, {0.0f});
  optim::SGD<O1Policy, host> opt(*f.params, {.lr = 0.0f}, {.scaler = cfg});
  for (std::size_t i = 0; i < n; ++i) {
    f.set_grads({rows[i].found_inf ? kInf : 1.0f});
    opt.step();
  }
  return opt.scaler().state();
}

constexpr ScalerConfig kApex{.init_scale = 1024.0f, .growth_interval = 3, .min_scale = 128.0f, .hysteresis = 3};
constexpr ScalerConfig kMegatron{
    .init_scale = 1024.0f, .growth_interval = 3, .min_scale = 128.0f, .hysteresis = 3, .consecutive_hysteresis = false};

// hysteresis 3, growth_interval 3, x2 / x0.5, from 1024 (tracker 3, growth 0).
const std::vector<Row> kApexTable = {
    {true, 1024, 2, 0},  {true, 1024, 1, 0}, {true, 512, 0, 0},  // two overflows tolerated, the third backs off
    {true, 256, -1, 0},                                           // and every further one
    {false, 256, 3, 1},                                           // a clean step refills the tracker
    {true, 256, 2, 0},   {false, 256, 3, 1}, {false, 256, 3, 2}, {false, 512, 3, 0},  // growth
    {true, 512, 2, 0},   {false, 512, 3, 1}, {true, 512, 2, 0},  {true, 512, 1, 0},
    {false, 512, 3, 1},  {true, 512, 2, 0},
};
// The same verdicts under Megatron's rule (its floor, min_scale 128, as Megatron's).
const std::vector<Row> kMegatronTable = {
    {true, 1024, 2, 0},  {true, 1024, 1, 0}, {true, 512, 0, 0},
    {true, 256, -1, 0},
    {false, 256, -1, 1},                                          // a clean step refills nothing
    {true, 128, -2, 0},  {false, 128, -2, 1}, {false, 128, -2, 2}, {false, 256, 3, 0},  // growth refills
    {true, 256, 2, 0},   {false, 256, 2, 1}, {true, 256, 1, 0},  {true, 128, 0, 0},
    {false, 128, 0, 1},  {true, 128, -1, 0},                      // at the floor
};
}  // namespace

TEST_CASE("hysteresis, Apex's rule (the default): h-1 overflows tolerated, then a backoff at each until a clean step") {
  static_assert(ScalerConfig{}.consecutive_hysteresis);
  drive(kApex, kApexTable);
}

TEST_CASE("hysteresis, Megatron's rule (consecutive_hysteresis = false): the tracker refills only when the scale grows") {
  drive(kMegatron, kMegatronTable);
}

TEST_CASE("hysteresis: a restored state continues the table (the tracker is saved, at 0 too)") {
  for (const std::size_t n : {std::size_t{3}, std::size_t{5}, std::size_t{10}}) {
    CAPTURE(n);
    const ScalerState a = after(kApex, kApexTable, n);
    drive(kApex, kApexTable, n, &a);
    const ScalerState m = after(kMegatron, kMegatronTable, n);
    drive(kMegatron, kMegatronTable, n, &m);
  }
}

TEST_CASE("hysteresis = 1 is PyTorch's GradScaler, under either rule") {
  // torch.amp.GradScaler._amp_update_scale_: x0.5 at every overflow, x2 after 2 clean steps, from 1024.
  struct TorchRow {
    bool found_inf;
    float scale;
    int growth;
  };
  const std::vector<TorchRow> torch = {{true, 512, 0},  {true, 256, 0}, {false, 256, 1}, {false, 512, 0},
                                       {true, 256, 0},  {false, 256, 1}, {true, 128, 0}};
  for (const bool consecutive : {true, false}) {
    CAPTURE(consecutive);
    std::vector<Row> rows;
    int tracker = 1;  // Apex refills at a clean step, Megatron at growth; either way it is 0 after an overflow
    for (const TorchRow& r : torch) {
      if (r.found_inf) tracker = 0;
      else if (consecutive || r.growth == 0) tracker = 1;
      rows.push_back({r.found_inf, r.scale, tracker, r.growth});
    }
    drive({.init_scale = 1024.0f, .growth_interval = 2, .hysteresis = 1, .consecutive_hysteresis = consecutive}, rows);
  }
}

TEST_CASE("growth_factor = 1: the scale never grows (Apex accepts it); below 1 is refused") {
  // Apex's rule, hysteresis 2, growth_interval 2, from 1024.
  drive({.init_scale = 1024.0f, .growth_factor = 1.0f, .growth_interval = 2, .hysteresis = 2},
        {{false, 1024, 2, 1},
         {false, 1024, 2, 0},  // a "growth" by 1
         {false, 1024, 2, 1},
         {false, 1024, 2, 0},
         {true, 1024, 1, 0},
         {true, 512, 0, 0},
         {false, 512, 2, 1},
         {false, 512, 2, 0}});
  Context<host> ctx;
  CHECK(DynamicLossScaler<host>(ctx, {.growth_factor = 1.0f}).config().growth_factor == 1.0f);
  CHECK_THROWS_WITH_AS((DynamicLossScaler<host>(ctx, {.growth_factor = 0.999f})), doctest::Contains("growth_factor >= 1"),
                       Error);
}
