// The classifier loss at GPT-2's vocabulary (50257): cross_entropy against
// fused_cross_entropy on a language model's last layers (embedding, LayerNorm,
// the tied projection), AdamW steps. Per run: the planned activation memory,
// the peak of all memory and the median step time. Runs are interleaved: each
// round runs every case once. One CSV row per run on stdout after "csv:".
// Built and run by bench/fused_loss.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <amp/amp.hpp>

namespace {
namespace nn = amp::nn;
constexpr std::int64_t kVocab = 50257;

struct Shape {
  std::int64_t batch, time, features;
};

template <class P, class B>
struct Head {
  using T = typename P::activation_type;
  nn::Embedding<P, B> emb;
  nn::LayerNorm<P, B> ln;
  std::int64_t time;
  Head(nn::Builder<P, B> b, const Shape& s)
      : emb(b.child("wte"), {.vocab = kVocab, .features = s.features, .max_positions = s.time}),
        ln(b.child("ln_f"), {.features = s.features}), time(s.time) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(amp::Shape{time})}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) { return emb.logits(g, ln(g, emb(g, ids))); }
};

struct Run {
  std::size_t planned, peak;
  double step_ms, loss;
};

template <amp::Policy P>
Run measure(const Shape& s, bool fused, int steps) {
  amp::Context<amp::host> ctx;
  nn::Model<P, amp::host, Head<P, amp::host>> model(ctx, {.max_batch = s.batch, .seed = 1, .fused_loss = fused}, s);
  amp::optim::AdamW<P, amp::host> opt(model.parameters(), {.lr = 1e-3f});
  const auto rows = static_cast<std::size_t>(s.batch * s.time);
  std::vector<std::int32_t> ids(rows), next(rows);
  for (std::size_t i = 0; i < rows; ++i)
    ids[i] = static_cast<std::int32_t>((i * 7919) % kVocab), next[i] = static_cast<std::int32_t>((i * 7919 + 1) % kVocab);
  const amp::TensorView<const std::int32_t> x(ids.data(), amp::Shape{s.batch, s.time});
  const amp::Span<const std::int32_t> y(next.data(), rows);
  std::vector<double> ms;
  double loss = 0;
  for (int i = 0; i <= steps; ++i) {  // the first step warms up
    const auto start = std::chrono::steady_clock::now();
    auto out = model.forward(ctx, x);
    auto l = fused ? nn::fused_cross_entropy(ctx, out, y, opt) : nn::cross_entropy(ctx, out, y);
    opt.zero_grad();
    amp::scale_loss(l, opt).backward();
    opt.step();
    loss = l.item();
    if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return {model.graph().arena_bytes(), ctx.memory().peak_total(), ms[ms.size() / 2], loss};
}
}  // namespace

int main(int argc, char** argv) {
  const Shape s{argc > 1 ? std::atoll(argv[1]) : 8, argc > 2 ? std::atoll(argv[2]) : 64,
                argc > 3 ? std::atoll(argv[3]) : 128};
  const int steps = argc > 4 ? std::atoi(argv[4]) : 3, rounds = argc > 5 ? std::atoi(argv[5]) : 3;
  if (s.batch < 1 || s.time < 1 || s.features < 1 || steps < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: fused_loss [batch time features steps rounds], all positive\n");
    return 2;
  }
  std::printf("vocab %lld, %lld x %lld tokens, %lld features, %d timed steps per run, %d rounds\n",
              static_cast<long long>(kVocab), static_cast<long long>(s.batch), static_cast<long long>(s.time),
              static_cast<long long>(s.features), steps, rounds);
  std::vector<std::string> csv{"round,level,loss,planned_bytes,peak_bytes,step_ms,loss_value"};
  for (int round = 1; round <= rounds; ++round)
    for (const bool fused : {false, true}) {
      auto record = [&](const char* level, const Run& r) {
        std::fprintf(stderr, "  round %d/%d: %-8s %-6s planned %7.1f MiB, peak %7.1f MiB, %8.1f ms/step, loss %.4f\n",
                     round, rounds, level, fused ? "fused" : "plain", r.planned / 1048576.0, r.peak / 1048576.0,
                     r.step_ms, r.loss);
        csv.push_back(std::to_string(round) + "," + level + "," + (fused ? "fused" : "plain") + "," +
                      std::to_string(r.planned) + "," + std::to_string(r.peak) + "," + std::to_string(r.step_ms) + "," +
                      std::to_string(r.loss));
      };
      record("O0", measure<amp::O0Policy>(s, fused, steps));
      record("O2-bf16", measure<amp::O2BF16Policy>(s, fused, steps));
    }
  std::printf("csv:\n");
  for (const auto& line : csv) std::printf("%s\n", line.c_str());
}
