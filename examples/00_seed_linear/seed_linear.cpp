// 00_seed_linear: the Apex seed program in C++. A Linear layer (1024 -> 512)
// fits random data with MSE and SGD (lr 1e-3) for 500 iterations, once per opt
// level. It checks itself: every level must end finite and close to O0.
// --graph captures the step once and replays it (one CUDA graph per step on
// the GPU): a step this small is launch-bound there, which a graph removes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#include <amp/amp.hpp>

#include "common/args.hpp"
#include "common/device.hpp"
#include "common/json.hpp"
#include "common/loop_table.hpp"
#include "common/record.hpp"
#include "common/run.hpp"

namespace {

constexpr std::int64_t N = 64, D_in = 1024, D_out = 512;

struct LevelResult {
  std::string level;
  float initial_loss = 0, final_loss = 0, final_scale = 0;
  long long skipped = 0;
  double seconds = 0, step_ms = 0;
  // After the first step: what the loop did on the host (zeros: it can be one CUDA graph).
  long long host_syncs_in_loop = 0, allocations_in_loop = 0, pageable_copies_in_loop = 0, launches_per_step = 0;
  long long graph_nodes = 0;
};

template <amp::Policy P, amp::Backend B>
LevelResult train(amp::Context<B>& ctx, const std::vector<float>& x_host, const std::vector<float>& y_host,
                  int iterations, bool use_graph) {
  amp::Buffer<float, B> x(ctx, x_host.size(), amp::memory_kind::activations);
  amp::Buffer<float, B> y(ctx, y_host.size(), amp::memory_kind::activations);
  amp::upload(ctx, x.span(), x_host);
  amp::upload(ctx, y.span(), y_host);
  const auto xm = amp::matrix<const float>(x.data(), N, D_in);
  const auto ym = amp::matrix<const float>(y.data(), N, D_out);

  amp::nn::Sequential<P, B, amp::nn::Linear> model(ctx, {.max_batch = N, .seed = 1},
                                                    {.in_features = D_in, .out_features = D_out});
  amp::optim::SGD<P, B> opt(model.parameters(), {.lr = 1e-3f});

  LevelResult r;
  r.level = std::string(amp::policy_name<P>());
  r.initial_loss = amp::nn::mse_loss(ctx, model.forward(ctx, xm), ym).item();
  auto step = [&] {
    auto y_pred = model.forward(ctx, xm);
    auto loss = amp::nn::mse_loss(ctx, y_pred, ym);
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  };
  examples::LoopCounters loop;
  std::optional<amp::CapturedStep<B>> graph;
  ctx.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it)
    loop.step(ctx, [&] {
      if (!use_graph) step();
      else if (graph) graph->replay();
      else graph.emplace(ctx, step);  // the first step eagerly, then the capture
    });
  ctx.synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.step_ms = 1e3 * r.seconds / iterations;
  r.host_syncs_in_loop = loop.syncs(), r.allocations_in_loop = loop.allocations();
  r.pageable_copies_in_loop = loop.pageable_copies();
  r.launches_per_step = graph ? static_cast<long long>(graph->launches_per_step()) : loop.launches();
  r.graph_nodes = graph ? static_cast<long long>(graph->graph_nodes()) : 0;
  r.final_loss = amp::nn::mse_loss(ctx, model.forward(ctx, xm), ym).item();
  const auto stats = opt.scaler().stats();
  r.skipped = stats.skipped;
  r.final_scale = stats.scale;
  return r;
}

// How far a level may stray from O0's final loss: a few units of its storage
// precision, relative (fp16 keeps 11 bits, bf16 8). Without master weights
// (O3), steps smaller than half an fp16 ulp of a weight are lost: that level
// must only stay finite and descend, which is what its precision explains.
template <amp::Policy P>
double tolerance() {
  if constexpr (amp::is_reduced_precision_v<typename P::param_type> && !amp::uses_master_weights_v<P>)
    return std::numeric_limits<double>::infinity();
  return 16.0 * amp::unit_roundoff<typename P::param_type> + 16.0 * amp::unit_roundoff<typename P::activation_type>;
}

std::string to_json(const std::string& device, int iterations, bool graph, const std::vector<LevelResult>& rows) {
  examples::Json j;
  j.object().field("program", "seed_linear").field("amp_version", AMP_VERSION_STRING).field("device", device);
  j.key("settings").object().field("batch", static_cast<long long>(N)).field("in_features", static_cast<long long>(D_in));
  j.field("out_features", static_cast<long long>(D_out)).field("lr", 1e-3).field("iterations", iterations);
  j.field("graph", graph).end();
  j.key("levels").array();
  for (const auto& r : rows)
    j.object().field("opt_level", r.level).field("initial_loss", r.initial_loss).field("final_loss", r.final_loss)
        .field("skipped_steps", r.skipped).field("final_loss_scale", r.final_scale).field("seconds", r.seconds)
        .field("step_ms", r.step_ms).field("host_syncs_in_loop", r.host_syncs_in_loop)
        .field("allocations_in_loop", r.allocations_in_loop).field("pageable_copies_in_loop", r.pageable_copies_in_loop)
        .field("launches_per_step", r.launches_per_step).field("graph_nodes", r.graph_nodes).end();
  j.end().end();
  return j.str() + "\n";
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("seed_linear", "The Apex seed: Linear 1024->512, MSE, SGD lr 1e-3, per opt level.");
  args.flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8|all (O0 always runs: it is the reference)", "LEVEL")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores; see README)", "N")
      .flag("iterations", "500", "training iterations per level", "N")
      .flag("json", "", "write the results as JSON to FILE", "FILE")
      .toggle("graph", false, "capture the training step once and replay it (a CUDA graph on the GPU)");
  if (!args.parse(argc, argv)) return 0;
  auto levels = examples::parse_levels(args.str("opt-level"));
  const int iterations = static_cast<int>(args.integer("iterations", 1, 10000000));
  const int threads = static_cast<int>(args.integer("threads", 0, 4096));
  if (std::find(levels.begin(), levels.end(), "O0") == levels.end()) levels.insert(levels.begin(), "O0");
  const bool gpu = examples::use_gpu(args.str("device")), use_graph = args.on("graph");
  examples::Outputs outputs;
  outputs.add("--json", args.str("json"));

  // The seed's data: x, y ~ N(0, 1), the same for every level and device.
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(N * D_in), y(N * D_out);
  for (auto& v : x) v = normal(gen);
  for (auto& v : y) v = normal(gen);

  std::vector<LevelResult> rows;
  std::string device;
  bool ok = true;
  double reference = 0;
  examples::with_context(gpu, threads, [&]<amp::Backend B>(amp::Context<B>& ctx) {
    device = examples::device_label(ctx);
    std::printf("seed_linear on %s: N=%lld, D_in=%lld, D_out=%lld, %d iterations\n", device.c_str(),
                static_cast<long long>(N), static_cast<long long>(D_in), static_cast<long long>(D_out), iterations);
    std::printf("%-8s %12s %12s %7s %11s %9s %9s\n", "level", "initial loss", "final loss", "skipped",
                "final scale", "ms/step", "vs O0");
    std::fflush(stdout);
    for (const auto& level : levels)
      examples::with_policy(level, [&]<amp::Policy P>() {
        const LevelResult r = train<P>(ctx, x, y, iterations, use_graph);
        if (rows.empty()) reference = r.final_loss;
        const double rel = std::abs(r.final_loss - reference) / reference;
        const bool quiet = r.host_syncs_in_loop == 0 && r.allocations_in_loop == 0 && r.pageable_copies_in_loop == 0;
        const bool good = std::isfinite(r.final_loss) && r.final_loss < r.initial_loss && rel <= tolerance<P>() && quiet;
        ok = ok && good;
        std::printf("%-8s %12.6f %12.6f %7lld %11g %9.4f %+9.2e %s\n", r.level.c_str(), r.initial_loss,
                    r.final_loss, r.skipped, r.final_scale, r.step_ms, rel, good ? "ok" : "FAILED");
        if (!good)
          std::printf("  %s: allowed relative difference to O0: %g; after the first step %lld host syncs, %lld "
                      "allocations, %lld pageable copies (all must be 0)\n",
                      r.level.c_str(), tolerance<P>(), r.host_syncs_in_loop, r.allocations_in_loop,
                      r.pageable_copies_in_loop);
        std::fflush(stdout);
        rows.push_back(r);
      });
    examples::print_loop_counters(rows);
  });
  outputs.write([&](const std::string&) { return to_json(device, iterations, use_graph, rows); });
  if (!ok) std::printf("seed_linear: a level strayed from O0 beyond its precision, or did host work in the loop\n");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "seed_linear: %s\n", e.what());
  return 2;
}
