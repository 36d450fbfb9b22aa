// GPT2 beyond its blocks' gradients (test_layers checks those against FP64):
// the key/value cache against the full forward, generation with and without
// it, sampling, its weights in transformers' layout (Conv1D transposes, the
// tied head), and llm.c token files. tests/interop/check_gpt2.py compares
// logits and AdamW steps with transformers itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "amp/transformer.hpp"
#include "amp/data/tokens.hpp"
#include "amp/io/safetensors.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
const nn::GPT2Config kConfig{.vocab_size = 29, .n_positions = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};

template <class P>
using Gpt2 = nn::Model<P, host, nn::GPT2<P, host>>;

std::vector<std::int32_t> random_ids(std::size_t n, std::uint32_t seed) {
  std::vector<std::int32_t> ids;
  for (const float u : random_values<float>(n, seed, 0.0f, 1.0f))
    ids.push_back(std::min<std::int32_t>(static_cast<std::int32_t>(u * kConfig.vocab_size), kConfig.vocab_size - 1));
  return ids;
}

// The logits of ids [batch, n] (row-major) through the full forward or the cache.
template <class P>
std::vector<float> logits(Gpt2<P>& model, const std::vector<std::int32_t>& ids, std::int64_t batch,
                          nn::KVCache<P, host>* cache = nullptr) {
  const std::int64_t n = static_cast<std::int64_t>(ids.size()) / batch;
  auto out = model.infer(model.context(), TensorView<const std::int32_t>(ids.data(), Shape{batch, n}),
                         [&](auto& g, auto& net, nn::Var<std::int32_t> x) {
                           return cache ? net.forward_cached(g, x, *cache) : net.forward(g, x);
                         });
  std::vector<float> v;
  for (std::size_t i = 0; i < static_cast<std::size_t>(out.rows() * out.cols()); ++i)
    v.push_back(cast<float>(out.value().data[i]));
  return v;
}
}  // namespace

TEST_CASE_TEMPLATE("GPT2: the key/value cache gives the full forward's logits, a prefill then one position at a time", P,
                   O0Policy, O2Policy, O2BF16Policy) {
  Context<host> ctx;
  Gpt2<P> model(ctx, {.max_batch = 2, .seed = 5}, kConfig);
  model.eval();
  constexpr std::int64_t batch = 2, time = 12, prefill = 5;
  const auto ids = random_ids(batch * time, 3);
  const auto full = logits(model, ids, batch);
  double largest = 0;
  for (const float v : full) largest = std::max(largest, std::abs(static_cast<double>(v)));
  // fp32: rounding alone; fp16/bf16: the cache's materialised softmax against the fused kernel, a few roundings.
  using T = typename P::activation_type;
  const double tol = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, half> ? 4e-3 : 3e-2;
  nn::KVCache<P, host> cache(ctx, kConfig, batch);
  double worst_of_all = 0;
  for (std::int64_t start = 0; start < time;) {
    const std::int64_t n = start == 0 ? prefill : 1;
    std::vector<std::int32_t> chunk;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = start; t < start + n; ++t) chunk.push_back(ids[static_cast<std::size_t>(b * time + t)]);
    const auto got = logits(model, chunk, batch, &cache);
    double worst = 0;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t v = 0; v < kConfig.vocab_size; ++v)
          worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<std::size_t>((b * n + t) * kConfig.vocab_size + v)]) -
                                           full[static_cast<std::size_t>((b * time + start + t) * kConfig.vocab_size + v)]));
    CAPTURE(start);
    CAPTURE(worst);
    CHECK(worst <= tol * largest);
    worst_of_all = std::max(worst_of_all, worst / largest);
    start += n;
  }
  MESSAGE(policy_name<P>(), ": cached logits within ", worst_of_all, " of the largest (tolerance ", tol, ")");
  CHECK(cache.length() == time);
  const std::string error = error_of([&] { logits(model, random_ids(2 * 5, 4), batch, &cache); });
  CHECK(error.find("after 12 cached positions do not fit 2 sequences of 16") != std::string::npos);
  model.train();
  CHECK(error_of([&] { logits(model, ids, batch); }).find("evaluation mode only") != std::string::npos);
}

TEST_CASE_TEMPLATE("GPT2 generation: with and without the cache, the same tokens, past the context", P, O0Policy,
                   O2BF16Policy) {
  Context<host> ctx;
  Gpt2<P> model(ctx, {.max_batch = 1, .seed = 7}, kConfig);
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5};
  for (const nn::Sampling s : {nn::Sampling{.temperature = 0.0f}, nn::Sampling{.temperature = 0.8f, .top_k = 5, .seed = 2},
                               nn::Sampling{.temperature = 1.5f, .seed = 3}}) {
    nn::Sampling uncached = s;
    uncached.cache = false;
    std::vector<std::int32_t> seen;
    // 40 tokens after 5: the window (16 positions) restarts at its last 8 three times.
    const auto cached = nn::generate(model, prompt, 40, s, [&](std::int32_t t) { seen.push_back(t); });
    CAPTURE(s.temperature);
    CHECK(cached == nn::generate(model, prompt, 40, uncached));
    CHECK(seen == cached);
    CHECK(cached.size() == 40);
    CHECK(std::all_of(cached.begin(), cached.end(), [](auto t) { return t >= 0 && t < kConfig.vocab_size; }));
  }
  CHECK(model.training());  // generation leaves the mode as it found it
  CHECK(nn::generate(model, prompt, 30, {.seed = 1}) != nn::generate(model, prompt, 30, {.seed = 2}));
  CHECK(error_of([&] { nn::generate(model, {3, 29}, 1, {}); })
            .find("prompt token 29 at position 1 is outside the vocabulary [0, 29)") != std::string::npos);
  CHECK(error_of([&] { nn::generate(model, {}, 1, {}); }).find("a prompt of at least one token") != std::string::npos);
}

TEST_CASE("sample_token: temperature 0 and top-k 1 take the most likely; draws follow softmax(l / T) over the top k") {
  const std::vector<float> l{1.0f, 2.0f, 0.5f, 1.5f};
  std::uint64_t draw = 0;
  CHECK(nn::sample_token(l, {.temperature = 0.0f}, draw) == 1);
  CHECK(nn::sample_token(l, {.temperature = 3.0f, .top_k = 1}, draw) == 1);
  const nn::Sampling s{.temperature = 0.5f, .top_k = 3, .seed = 9};
  std::vector<double> p{std::exp(1.0 / 0.5), std::exp(2.0 / 0.5), 0.0, std::exp(1.5 / 0.5)}, count(4, 0.0);
  const double sum = p[0] + p[1] + p[3];
  constexpr int draws = 40000;
  for (int i = 0; i < draws; ++i) count[static_cast<std::size_t>(nn::sample_token(l, s, draw))] += 1;
  for (std::size_t k = 0; k < 4; ++k) {
    CAPTURE(k);
    CHECK(std::abs(count[k] / draws - p[k] / sum) < 0.01);  // 4 standard deviations at most
  }
  CHECK(count[2] == 0);  // outside the top 3
  CHECK(error_of([&] { nn::sample_token({NAN, NAN}, {}, draw); }).find("not finite") != std::string::npos);
  CHECK(error_of([&] { nn::sample_token(l, {.temperature = -1.0f}, draw); }).find("temperature >= 0") != std::string::npos);
}

TEST_CASE("GPT2 weights in transformers' layout: Conv1D weights transposed (square ones too), the tied head repeated") {
  Context<host> ctx;
  Gpt2<O0Policy> a(ctx, {.max_batch = 1, .seed = 1}, kConfig), b(ctx, {.max_batch = 1, .seed = 2}, kConfig);
  const io::TensorLayout hf = io::hf_layout(a.net());
  CHECK(hf.transposed.size() == 8);  // c_attn, c_proj (square), c_fc, mlp.c_proj per block
  const std::string path = temp_path("gpt2.safetensors");
  io::export_safetensors(path, a.parameters(), io::dtype::fp32, hf);
  const std::string file = read_bytes(path);
  CHECK(file.find("\"transformer.h.0.attn.c_attn.weight\": {\"dtype\": \"F32\", \"shape\": [16, 48]") != std::string::npos);
  CHECK(file.find("\"lm_head.weight\": {\"dtype\": \"F32\", \"shape\": [29, 16]") != std::string::npos);
  io::import_safetensors(path, b.parameters(), hf);
  const auto& table = a.parameters().table();
  int proj = -1;
  for (std::size_t i = 0; i < table.size(); ++i) {
    CAPTURE(table[i].name);
    CHECK(a.parameters().get_values(static_cast<int>(i)) == b.parameters().get_values(static_cast<int>(i)));
    if (table[i].name == "transformer.h.1.attn.c_proj.weight") proj = static_cast<int>(i);
  }
  // Read as if not transposed, the square c_proj arrives transposed: the layout, not the shape, decides.
  io::TensorLayout untransposed = hf;
  std::erase(untransposed.transposed, "transformer.h.1.attn.c_proj.weight");
  io::import_safetensors(path, b.parameters(), untransposed);
  const auto w = a.parameters().get_values(proj), got = b.parameters().get_values(proj);
  bool transposed = true;
  for (std::size_t r = 0; r < 16; ++r)
    for (std::size_t c = 0; c < 16; ++c) transposed = transposed && got[r * 16 + c] == w[c * 16 + r];
  CHECK(transposed);
  CHECK(got != w);
  // Without the layout: the Conv1D shape named; a head that is not the embedding refused.
  CHECK(error_of([&] { io::import_safetensors(path, b.parameters()); })
            .find("tensor 'transformer.h.0.attn.c_attn.weight' has shape [16x48], the model [48x16]") != std::string::npos);
  std::string changed = file;
  std::uint64_t header = 0;
  std::memcpy(&header, changed.data(), 8);
  const auto at = changed.find("\"data_offsets\": [", changed.find("\"lm_head.weight\"")) + 17;
  changed[8 + header + std::stoull(changed.substr(at)) + 3] ^= 0x40;  // the sign and exponent of its first value
  write_bytes(path, changed);
  CHECK(error_of([&] { io::import_safetensors(path, b.parameters(), hf); })
            .find("tensor 'lm_head.weight' differs from 'transformer.wte.weight', which the model ties it to") !=
        std::string::npos);
  std::remove(path.c_str());
}

TEST_CASE("llm.c token files: written and read back; each fault refused with the file and what was wrong") {
  const std::string path = temp_path("tokens.bin");
  std::vector<std::int32_t> ids{0, 299, 17, 250, 65535, 3};
  data::write_tokens(path, ids);
  const std::string file = read_bytes(path);
  REQUIRE(file.size() == 1024 + 2 * ids.size());
  std::int32_t header[3];
  std::memcpy(header, file.data(), sizeof header);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 6);
  CHECK(data::read_tokens(path, 65536) == ids);
  const auto error = [&](const std::string& bytes, std::int64_t vocab) {
    write_bytes(path, bytes);
    return error_of([&] { data::read_tokens(path, vocab); });
  };
  CHECK(error(file, 300).find("id 65535 at position 4 is outside the vocabulary [0, 300)") != std::string::npos);
  std::string other = file;
  other[0] = 1;
  CHECK(error(other, 65536).find("not llm.c's magic 20240520") != std::string::npos);
  other = file;
  other[4] = 2;
  CHECK(error(other, 65536).find("has version 2; amp reads version 1 (uint16 ids), not 2 (uint32 ids)") != std::string::npos);
  CHECK(error(file.substr(0, file.size() - 1), 65536).find("the header counts 6 ids, the file holds 5.5") !=
        std::string::npos);
  CHECK(error(file.substr(0, 100), 65536).find("has 100 bytes, less than its 1024-byte header") != std::string::npos);
  CHECK(error(file, 70000).find("does not fit uint16 ids") != std::string::npos);
  std::remove(path.c_str());
  CHECK(error_of([&] { data::read_tokens(path, 256); }).find("cannot open token file") != std::string::npos);
  CHECK(error_of([&] { data::write_tokens(path, {1, 70000}); }).find("id 70000 at position 1 is not a uint16") !=
        std::string::npos);
  CHECK(read_bytes(path).empty());  // nothing written
}
