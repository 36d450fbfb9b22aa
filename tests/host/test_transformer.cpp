// The transformer pieces beyond their gradients (test_layers checks those
// against FP64): the causal mask proven bit for bit, the batched GEMM against
// FP64, and fp16 training through an overflow with AdamW, warm-up + cosine
// and clipping, as char_lm trains.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "amp/transformer.hpp"
#include "support/gemm_cases.hpp"
#include "support/model_values.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
constexpr std::int64_t kTime = 12, kVocab = 13;

template <class P, class B>
struct Gpt {
  using T = typename P::activation_type;
  nn::Embedding<P, B> emb;
  nn::TransformerBlock<P, B> b0, b1;
  nn::LayerNorm<P, B> ln;
  explicit Gpt(nn::Builder<P, B> b, float dropout = 0.0f)
      : emb(b.child("emb"), {.vocab = kVocab, .features = 16, .max_positions = kTime}),
        b0(b.child("h.0"), {.features = 16, .heads = 4, .attention_dropout = dropout, .residual_dropout = dropout}),
        b1(b.child("h.1"), {.features = 16, .heads = 4, .attention_dropout = dropout, .residual_dropout = dropout}),
        ln(b.child("ln_f"), {.features = 16}) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{kTime})}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) { return emb.logits(g, ln(g, b1(g, b0(g, emb(g, ids))))); }
};

std::vector<std::int32_t> token_ids(std::int64_t rows, std::uint32_t seed) {
  const auto r = random_values<float>(static_cast<std::size_t>(rows * kTime), seed, 0.0f, 1.0f);
  std::vector<std::int32_t> ids(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) ids[i] = static_cast<std::int32_t>(r[i] * kVocab) % kVocab;
  return ids;
}
}  // namespace

TEST_CASE_TEMPLATE("causal attention: changing a token leaves every earlier position's logits bit-identical", P, O0Policy,
                   O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy) {
  Context<host> ctx;
  nn::Model<P, host, Gpt<P, host>> model(ctx, {.max_batch = 2, .seed = 3});
  using T = typename P::activation_type;
  auto logits = [&](const std::vector<std::int32_t>& ids) {
    auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{2, kTime}));
    std::vector<std::uint32_t> bits;
    for (const T v : download(ctx, Span<const T>(out.value().span()))) {
      std::uint32_t b = 0;
      std::memcpy(&b, &v, sizeof v);
      bits.push_back(b);
    }
    return bits;
  };
  const auto ids = token_ids(2, 5);
  const auto base = logits(ids);
  for (const std::int64_t changed : {std::int64_t{0}, std::int64_t{5}, kTime - 1}) {
    CAPTURE(changed);
    auto other = ids;
    other[changed] = (other[changed] + 1) % kVocab;        // row 0
    other[kTime + changed] = (other[kTime + changed] + 3) % kVocab;  // row 1
    const auto now = logits(other);
    for (std::int64_t row = 0; row < 2; ++row) {
      const auto at = [&](const auto& v, std::int64_t t) {
        return std::vector<std::uint32_t>(v.begin() + (row * kTime + t) * kVocab, v.begin() + (row * kTime + t + 1) * kVocab);
      };
      for (std::int64_t t = 0; t < changed; ++t) REQUIRE(at(now, t) == at(base, t));
      CHECK(at(now, changed) != at(base, changed));
    }
  }
}

TEST_CASE_TEMPLATE("gemm_batched: every product of the batch against FP64", Types, GemmFp32, GemmFp16, GemmFp16ToFp32,
                   GemmBf16, GemmBf16ToFp32) {
  using In = typename Types::input;
  using Out = typename Types::output;
  Context<host> ctx;
  constexpr std::int64_t count = 5, m = 7, n = 6, k = 9;
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      // Operands with a leading dimension wider than a row and a gap between products.
      const std::int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
      const std::int64_t lda = ac + 3, ldb = bc + 2, sa = ar * lda + 5, sb = br * ldb + 1, sc = m * n + 4;
      const auto a = random_values<In>(static_cast<std::size_t>(count * sa), 31);
      const auto b = random_values<In>(static_cast<std::size_t>(count * sb), 32);
      auto c = random_values<Out>(static_cast<std::size_t>(count * sc), 33);
      const auto c0 = to_double(c);
      gemm_batched(ctx, Matrix<const In>(a.data(), ar, ac, lda), ta ? transpose::yes : transpose::no,
                   Matrix<const In>(b.data(), br, bc, ldb), tb ? transpose::yes : transpose::no, Matrix<Out>(c.data(), m, n, n),
                   GemmBatch{count, sa, sb, sc}, 0.5f, 0.25f);
      const auto ad = to_double(a), bd = to_double(b), cd = to_double(c);
      for (std::int64_t i = 0; i < count; ++i) {
        std::vector<double> ai, bi, ci(static_cast<std::size_t>(m * n));
        for (std::int64_t r = 0; r < ar; ++r)
          for (std::int64_t q = 0; q < ac; ++q) ai.push_back(ad[i * sa + r * lda + q]);
        for (std::int64_t r = 0; r < br; ++r)
          for (std::int64_t q = 0; q < bc; ++q) bi.push_back(bd[i * sb + r * ldb + q]);
        for (std::int64_t q = 0; q < m * n; ++q) ci[q] = c0[i * sc + q];
        reference_gemm(ai, ta, bi, tb, ci, m, n, k, 0.5, 0.25);
        for (std::int64_t q = 0; q < m * n; ++q)
          REQUIRE(cd[i * sc + q] == doctest::Approx(ci[q]).epsilon(gemm_rtol<Out>(k)).scale(1.0));
        for (std::int64_t q = m * n; q < sc && i + 1 < count; ++q) REQUIRE(cd[i * sc + q] == c0[i * sc + q]);  // gaps kept
      }
    }
}

TEST_CASE_TEMPLATE("fp16 transformer training goes through an injected overflow: skipped, backed off, still learning", P,
                   O1Policy, O2Policy) {
  Context<host> ctx;
  nn::Model<P, host, Gpt<P, host>> model(ctx, {.max_batch = 8, .seed = 4}, 0.1f);
  const float lr = 1e-2f;
  optim::AdamW<P, host> opt(model.parameters(), {.lr = lr, .weight_decay = 0.1f},
                            {.max_grad_norm = 1.0f,
                             .groups = {{.select = optim::select::no_decay, .lr = {}, .weight_decay = 0.0f}}});
  opt.set_schedule(optim::LinearWarmup<optim::CosineLR>{5, {lr, 60, lr / 10}});
  // A learnable sequence: each token is the previous plus one.
  std::vector<std::int32_t> ids(8 * kTime), next(8 * kTime);
  for (std::int64_t r = 0; r < 8; ++r)
    for (std::int64_t t = 0; t < kTime; ++t) {
      ids[r * kTime + t] = static_cast<std::int32_t>((r + t) % kVocab);
      next[r * kTime + t] = static_cast<std::int32_t>((r + t + 1) % kVocab);
    }
  float first = 0, last = 0;
  std::vector<float> before_skip;
  for (int step = 0; step < 65; ++step) {
    if (step == 30) opt.scaler().update(std::ldexp(1.0f, 24));  // the injected overflow: fp16 gradients become inf
    auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{8, kTime}));
    auto loss = nn::cross_entropy(ctx, out, Span<const std::int32_t>(next.data(), next.size()));
    opt.zero_grad();
    scale_loss(loss, opt).backward();
    if (step == 30) before_skip = model.parameters().get_values(0);
    opt.step();
    if (step == 30) CHECK(model.parameters().get_values(0) == before_skip);  // skipped, bit for bit
    (step == 0 ? first : last) = loss.item();
  }
  const auto stats = opt.scaler().stats();
  MESSAGE(policy_name<P>(), ": loss ", first, " -> ", last, ", ", stats.skipped, " skipped, final scale ", stats.scale);
  CHECK(stats.skipped >= 1);
  CHECK(stats.scale < std::ldexp(1.0f, 24));
  CHECK(std::isfinite(last));
  CHECK(last < 0.5f * first);
  CHECK(opt.steps() == 65);
}

TEST_CASE("a token id outside the vocabulary is an error naming the id, its position and the range") {
  Context<host> ctx;
  nn::Model<O0Policy, host, Gpt<O0Policy, host>> model(ctx, {.max_batch = 1, .seed = 1});
  auto ids = token_ids(1, 3);
  ids[5] = kVocab;  // one past the end
  CHECK_THROWS_WITH_AS(model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{1, kTime})),
                       doctest::Contains("token id 13 at position 5 is outside [0, 13)"), Error);
  ids[5] = -1;
  CHECK_THROWS_WITH_AS(model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{1, kTime})),
                       doctest::Contains("token id -1 at position 5 is outside [0, 13)"), Error);
}

TEST_CASE("group_by_key: rows sorted by key, stable, with negative and repeated keys") {
  Context<host> ctx;
  const std::vector<std::int32_t> keys = {7, -3, 7, 0, 50256, -3, 7, 2, 0, 50256, 1};
  const std::size_t n = keys.size();
  Buffer<std::int32_t, host> in(ctx, n, memory_kind::data), rows(ctx, n, memory_kind::workspace),
      uniq(ctx, n, memory_kind::workspace), offsets(ctx, n + 1, memory_kind::workspace), count(ctx, 1, memory_kind::workspace);
  Buffer<std::byte, host> temp(ctx, group_by_key_bytes(ctx, n), memory_kind::workspace);
  upload(ctx, in.span(), keys);
  group_by_key(ctx, in.data(), n, KeyGroups{rows.data(), uniq.data(), offsets.data(), count.data()}, temp.data());
  REQUIRE(download_one(ctx, count.data()) == 6);
  CHECK(download(ctx, rows.span()) == std::vector<std::int32_t>{1, 5, 3, 8, 10, 7, 0, 2, 6, 4, 9});
  const auto u = download(ctx, uniq.span()), o = download(ctx, offsets.span());
  CHECK(std::vector<std::int32_t>(u.begin(), u.begin() + 6) == std::vector<std::int32_t>{-3, 0, 1, 2, 7, 50256});
  CHECK(std::vector<std::int32_t>(o.begin(), o.begin() + 7) == std::vector<std::int32_t>{0, 2, 4, 5, 6, 9, 11});
}

namespace {
constexpr std::int64_t kGpt2Vocab = 50257, kEmbedFeatures = 48, kEmbedTime = 40;
template <class P, class B>
struct EmbeddingOnly {
  using T = typename P::activation_type;
  nn::Embedding<P, B> emb;
  explicit EmbeddingOnly(nn::Builder<P, B> b)
      : emb(b.child("emb"), {.vocab = kGpt2Vocab, .features = kEmbedFeatures, .max_positions = kEmbedTime}) {}
  std::vector<nn::Input> default_inputs() const { return {nn::indices(Shape{kEmbedTime})}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<std::int32_t> ids) { return emb(g, ids); }
};
}  // namespace

TEST_CASE_TEMPLATE("embedding gradient at GPT-2's vocabulary: per-id sums against FP64, memory of the batch's tokens",
                   P, O0Policy, O2Policy, O2BF16Policy) {
  constexpr std::int64_t batch = 6, rows = batch * kEmbedTime, F = kEmbedFeatures;
  Context<host> ctx;
  nn::Model<P, host, EmbeddingOnly<P, host>> model(ctx, {.max_batch = batch, .seed = 2});
  // The old gradient kept a vocab x features fp32 sum (9.6 MB here); grouping needs a few ints per token.
  CHECK(ctx.memory().peak(memory_kind::activations) + ctx.memory().peak(memory_kind::workspace) <
        static_cast<std::size_t>(kGpt2Vocab * F * 4 / 16));
  // Ids repeat (a few common ones, the table's ends) and are spread over the vocabulary.
  std::vector<std::int32_t> ids(rows);
  for (std::int64_t r = 0; r < rows; ++r)
    ids[r] = static_cast<std::int32_t>(r % 5 == 0 ? 0 : r % 7 == 0 ? kGpt2Vocab - 1 : r % 3 == 0 ? 1234 : (r * 7919) % kGpt2Vocab);
  const auto target = random_values<float>(static_cast<std::size_t>(rows * F), 8);
  const Params p = consumed_values(model.parameters());
  model.parameters().zero_grad();
  auto out = model.forward(ctx, TensorView<const std::int32_t>(ids.data(), Shape{batch, kEmbedTime}));
  auto loss = nn::mse_loss(ctx, out, matrix<const float>(target.data(), rows, F));
  loss.backward();
  const Params grads = gradients(model.parameters());
  // dL/dy = 2 (y - target) / (rows x F), summed per id and per position in FP64.
  const auto& table = p.at("emb.weight");
  const auto& positions = p.at("emb.positions");
  std::vector<double> want_table(table.size(), 0.0), want_positions(positions.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < F; ++c) {
      const double y = table[ids[r] * F + c] + positions[(r % kEmbedTime) * F + c];
      const double dy = 2.0 * (y - target[r * F + c]) / static_cast<double>(rows * F);
      want_table[ids[r] * F + c] += dy;
      want_positions[(r % kEmbedTime) * F + c] += dy;
    }
  const double tol = gradient_tolerance<P>();
  const auto largest = [](const std::vector<double>& v) {
    double m = 0;
    for (const double x : v) m = std::max(m, std::abs(x));
    return m;
  };
  CHECK(worst_error_ratio(grads.at("emb.weight"), want_table, tol, tol * largest(want_table)) <= 1.0);
  CHECK(worst_error_ratio(grads.at("emb.positions"), want_positions, tol, tol * largest(want_positions)) <= 1.0);
}
