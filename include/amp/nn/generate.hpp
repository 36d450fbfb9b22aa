#pragma once
// Sampling text from a language model (GPT2, or any net with its config,
// forward and forward_cached): temperature, top-k, a seeded generator, and a
// key/value cache so that each new token runs one position. The model sees at
// most n_positions tokens: when the sequence outgrows them, the window restarts
// at its last n_positions / 2 tokens (the cache refilled from them), the same
// with and without the cache, so both give the same tokens.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/model/model.hpp"
#include "amp/nn/gpt2.hpp"
#include "amp/nn/ops.hpp"

namespace amp::nn {

struct Sampling {
  float temperature = 1.0f;  // 0: always the most likely token
  std::int64_t top_k = 0;    // > 0: sample among the k most likely
  std::uint64_t seed = 0;
  bool cache = true;  // false: rerun the whole window for each token (the reference)
};

// One token drawn from softmax(logits / temperature) over the top k; `draw`
// counts the draws (the generator is splitmix64 of seed and draw).
inline std::int32_t sample_token(const std::vector<float>& logits, const Sampling& s, std::uint64_t& draw) {
  AMP_REQUIRE(!logits.empty() && s.temperature >= 0.0f && s.top_k >= 0, "sample_token: need logits, temperature >= 0 "
              "and top_k >= 0");
  const auto best = std::max_element(logits.begin(), logits.end());
  AMP_REQUIRE(std::isfinite(*best), "sample_token: the logits are not finite (the model's weights hold inf or NaN?)");
  if (s.temperature == 0.0f) return static_cast<std::int32_t>(best - logits.begin());
  float floor = -INFINITY;  // logits below it are out of the top k
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < logits.size()) {
    std::vector<float> sorted(logits);
    std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(), std::greater<float>());
    floor = sorted[static_cast<std::size_t>(s.top_k - 1)];
  }
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (std::size_t k = 0; k < p.size(); ++k)
    if (logits[k] >= floor) sum += (p[k] = std::exp((static_cast<double>(logits[k]) - *best) / s.temperature));
  const auto bits = mix64(s.seed * 0x9e3779b97f4a7c15ull + draw++);
  double u = static_cast<double>(bits >> 11) * 0x1.0p-53 * sum;
  std::size_t pick = 0;
  while (pick + 1 < p.size() && (p[pick] == 0.0 || (u -= p[pick]) >= 0.0)) ++pick;
  while (p[pick] == 0.0) --pick;  // u ran past the last kept token by rounding
  return static_cast<std::int32_t>(pick);
}

// n tokens continuing `prompt` (one sequence); on_token sees each as it comes.
template <class P, class B, class Net>
std::vector<std::int32_t> generate(Model<P, B, Net>& model, const std::vector<std::int32_t>& prompt, std::int64_t n,
                                   const Sampling& s, const std::function<void(std::int32_t)>& on_token = {}) {
  using T = typename P::activation_type;
  const GPT2Config& c = model.net().config;
  AMP_REQUIRE(!prompt.empty() && n >= 0, "generate: need a prompt of at least one token and n >= 0");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    AMP_REQUIRE(prompt[i] >= 0 && prompt[i] < c.vocab_size, "generate: prompt token ", prompt[i], " at position ", i,
                " is outside the vocabulary [0, ", c.vocab_size, ")");
  auto& ctx = model.context();
  struct Restore {  // the mode the model had, also when a step throws
    Model<P, B, Net>& m;
    bool training;
    ~Restore() { m.train(training); }
  } restore{model, model.training()};
  model.eval();
  std::optional<KVCache<P, B>> cache;
  if (s.cache) cache.emplace(ctx, c, 1);
  const auto limit = static_cast<std::size_t>(c.n_positions);
  Buffer<std::int32_t, B> ids(ctx, limit, memory_kind::data);
  std::vector<std::int32_t> seq(prompt), out;
  std::size_t window = 0;
  std::uint64_t draw = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (seq.size() - window > limit) {
      window = seq.size() - std::max<std::size_t>(1, limit / 2);
      if (cache) cache->reset();
    }
    // The whole window (no cache, or an empty one), else the newest token alone.
    const std::size_t from = cache && cache->length() > 0 ? seq.size() - 1 : window;
    const auto count = static_cast<std::int64_t>(seq.size() - from);
    upload(ctx, Span<std::int32_t>(ids.data(), static_cast<std::size_t>(count)), seq.data() + from,
           static_cast<std::size_t>(count));
    auto logits = model.infer(ctx, TensorView<const std::int32_t>(ids.data(), Shape{1, count}),
                              [&](Graph<P, B>& g, Net& net, Var<std::int32_t> x) {
                                return cache ? net.forward_cached(g, x, *cache) : net.forward(g, x);
                              });
    const auto last = download(ctx, Span<const T>(logits.value().data + (count - 1) * c.vocab_size,
                                                  static_cast<std::size_t>(c.vocab_size)));
    std::vector<float> l(last.size());
    for (std::size_t k = 0; k < l.size(); ++k) l[k] = cast<float>(last[k]);
    const std::int32_t token = sample_token(l, s, draw);
    seq.push_back(token);
    out.push_back(token);
    if (on_token) on_token(token);
  }
  return out;
}

}  // namespace amp::nn
