// 00_seed_linear: the Apex seed program in C++. A Linear layer (1024 -> 512)
// fits random data with MSE and SGD (lr 1e-3) for 500 iterations, once per opt
// level. It checks itself: every level must end finite and close to O0.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <sstream>

#include <amp/amp.hpp>
#include <amp/io/atomic_file.hpp>

#include "common/args.hpp"
#include "common/levels.hpp"

namespace {

constexpr std::int64_t N = 64, D_in = 1024, D_out = 512;

struct LevelResult {
  std::string level;
  float initial_loss = 0, final_loss = 0, final_scale = 0;
  long long skipped = 0;
  double seconds = 0;
};

template <amp::Policy P, amp::Backend B>
LevelResult train(amp::Context<B>& ctx, const std::vector<float>& x_host, const std::vector<float>& y_host,
                  int iterations) {
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
  ctx.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it) {
    auto y_pred = model.forward(ctx, xm);
    auto loss = amp::nn::mse_loss(ctx, y_pred, ym);
    if (it == 0) r.initial_loss = loss.item();
    opt.zero_grad();
    {
      auto scaled = amp::scale_loss(loss, opt);
      scaled.backward();
    }
    opt.step();
  }
  ctx.synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

std::string to_json(const std::string& device, const std::vector<LevelResult>& rows) {
  std::ostringstream out;
  out.precision(9);
  out << "{\"device\": \"" << device << "\", \"levels\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    out << (i ? ", " : "") << "{\"opt_level\": \"" << r.level << "\", \"initial_loss\": " << r.initial_loss
        << ", \"final_loss\": " << r.final_loss << ", \"skipped_steps\": " << r.skipped
        << ", \"final_loss_scale\": " << r.final_scale << ", \"seconds\": " << r.seconds << "}";
  }
  out << "]}\n";
  return out.str();
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("seed_linear", "The Apex seed: Linear 1024->512, MSE, SGD lr 1e-3, per opt level.");
  args.flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|all")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)")
      .flag("iterations", "500", "training iterations per level")
      .flag("json", "", "write the results as JSON to this file");
  if (!args.parse(argc, argv)) return 0;
  auto levels = examples::parse_levels(args.str("opt-level"));
  const int iterations = static_cast<int>(args.integer("iterations"));
  AMP_REQUIRE(iterations > 0, "--iterations must be positive");
  if (std::find(levels.begin(), levels.end(), "O0") == levels.end()) levels.insert(levels.begin(), "O0");

  // The seed's data: x, y ~ N(0, 1), the same for every level and device.
  std::mt19937 gen(0);
  std::normal_distribution<float> normal;
  std::vector<float> x(N * D_in), y(N * D_out);
  for (auto& v : x) v = normal(gen);
  for (auto& v : y) v = normal(gen);

  std::vector<LevelResult> rows;
  std::vector<double> tolerances;
  std::string device;
  auto run_all = [&]<amp::Backend B>(amp::Context<B>& ctx) {
    device = examples::device_label(ctx);
    for (const auto& level : levels)
      examples::with_policy(level, [&]<amp::Policy P>() {
        rows.push_back(train<P>(ctx, x, y, iterations));
        tolerances.push_back(tolerance<P>());
      });
  };
  examples::with_context(examples::use_gpu(args.str("device")), run_all);

  std::printf("seed_linear on %s: N=%lld, D_in=%lld, D_out=%lld, %d iterations\n", device.c_str(),
              static_cast<long long>(N), static_cast<long long>(D_in), static_cast<long long>(D_out), iterations);
  std::printf("%-8s %13s %13s %9s %12s %9s %s\n", "level", "initial loss", "final loss", "skipped", "final scale",
              "time [s]", "vs O0");
  bool ok = true;
  const double reference = rows.front().final_loss;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double rel = std::abs(r.final_loss - reference) / reference;
    const bool good = std::isfinite(r.final_loss) && r.final_loss < r.initial_loss && rel <= tolerances[i];
    ok = ok && good;
    std::printf("%-8s %13.6f %13.6f %9lld %12g %9.3f %+.2e %s\n", r.level.c_str(), r.initial_loss, r.final_loss,
                r.skipped, r.final_scale, r.seconds, rel, good ? "ok" : ("FAILED, tolerance " + std::to_string(tolerances[i])).c_str());
  }
  if (!args.str("json").empty()) {
    amp::io::write_file_atomically(args.str("json"), to_json(device, rows));
    std::printf("wrote %s\n", args.str("json").c_str());
  }
  if (!ok) std::printf("seed_linear: a level strayed from O0 beyond its precision\n");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "seed_linear: %s\n", e.what());
  return 2;
}
