#pragma once
// GPT-2 (learned positions, pre-LN blocks, GELU tanh, the head tied to the
// token table) with the parameter names of transformers' GPT2LMHeadModel:
//   transformer.wte.weight [vocab, width]      transformer.wpe.weight [positions, width]
//   transformer.h.N.ln_1 / ln_2 .weight .bias  transformer.h.N.attn.c_attn (q, k, v fused) / c_proj
//   transformer.h.N.mlp.c_fc / c_proj          transformer.ln_f, and lm_head.weight = wte in their files.
// amp keeps Linear weights as [out, in]; transformers' Conv1D keeps [in, out]:
// hf_transposed() and hf_aliases() say how a file differs, for
// io::TensorLayout. forward_cached() continues sequences from a KVCache: a new
// token costs one position, not the whole context (nn/generate.hpp).
#include <string>
#include <utility>
#include <vector>

#include "amp/backend/buffer.hpp"
#include "amp/nn/embedding.hpp"
#include "amp/nn/norm.hpp"
#include "amp/nn/checkpoint.hpp"
#include "amp/nn/transformer.hpp"

namespace amp::nn {

// transformers' GPT2Config names; GPT-2 small's values.
struct GPT2Config {
  std::int64_t vocab_size = 50257, n_positions = 1024, n_layer = 12, n_head = 12, n_embd = 768;
  float dropout = 0.0f;  // attention probabilities and residual branches (their attn_pdrop, resid_pdrop)
  attention_kernel attention = attention_kernel::fused;
  bool checkpoint_blocks = false;  // keep only each block's input; recompute its forward in backward (nn/checkpoint.hpp)
};

// Keys and values of every layer for `batch` sequences of up to n_positions,
// in the attention's GEMM type; length() positions are filled.
template <Policy P, Backend B>
class KVCache {
 public:
  using G = typename TransformerBlock<P, B>::cache_type;
  KVCache(Context<B>& ctx, const GPT2Config& c, std::int64_t batch)
      : capacity_(c.n_positions), batch_(batch), layer_size_(static_cast<std::size_t>(batch * c.n_positions * c.n_embd)),
        keys_(ctx, layer_size_ * static_cast<std::size_t>(c.n_layer), memory_kind::activations),
        values_(ctx, layer_size_ * static_cast<std::size_t>(c.n_layer), memory_kind::activations) {}

  KVCacheView<G> layer(std::int64_t i) const {
    const std::size_t at = static_cast<std::size_t>(i) * layer_size_;
    return {keys_.data() + at, values_.data() + at, capacity_};
  }
  std::int64_t length() const { return length_; }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t batch() const { return batch_; }
  void advance(std::int64_t n) { length_ += n; }
  void reset() { length_ = 0; }

 private:
  std::int64_t capacity_, batch_, length_ = 0;
  std::size_t layer_size_;
  Buffer<G, B> keys_, values_;
};

template <class P, class B>
struct GPT2 {
  static_assert(Policy<P> && Backend<B>);
  using T = typename P::activation_type;

  GPT2(Builder<P, B> b, const GPT2Config& c)
      : config(check(c, b.prefix())),
        wte(b.child("transformer.wte"), b.child("transformer.wpe"),
            {.vocab = c.vocab_size, .features = c.n_embd, .max_positions = c.n_positions}),
        h(blocks(b, c)),
        ln_f(b.child("transformer.ln_f"), {.features = c.n_embd}) {}

  std::vector<Input> default_inputs() const { return {indices(Shape{config.n_positions})}; }

  // ids [batch, time] -> logits [batch, time, vocab_size].
  Var<T> forward(Graph<P, B>& g, Var<std::int32_t> ids) const {
    Var<T> x = wte(g, ids);
    if (config.dropout > 0.0f) x = dropout(g, x, config.dropout);  // their embd_pdrop
    for (const auto& block : h) x = config.checkpoint_blocks ? checkpoint(g, block, x) : block(g, x);
    return wte.logits(g, ln_f(g, x));
  }

  // ids [batch, n] continue the cache's sequences at position cache.length();
  // their keys and values join the cache. Evaluation mode.
  Var<T> forward_cached(Graph<P, B>& g, Var<std::int32_t> ids, KVCache<P, B>& cache) const {
    AMP_REQUIRE(ids.shape.rank() == 2 && ids.shape[0] <= cache.batch() &&
                    cache.length() + ids.shape[1] <= cache.capacity(),
                "GPT2::forward_cached: ids ", ids.shape.str(), " after ", cache.length(), " cached positions do not fit ",
                cache.batch(), " sequences of ", cache.capacity());
    const std::int64_t start = cache.length();
    Var<T> x = wte(g, ids, start);
    for (std::size_t i = 0; i < h.size(); ++i) x = h[i](g, x, cache.layer(static_cast<std::int64_t>(i)), start);
    cache.advance(ids.shape[1]);
    return wte.logits(g, ln_f(g, x));
  }

  // transformers' Conv1D weights, stored [in, out] in their files.
  std::vector<std::string> hf_transposed() const {
    std::vector<std::string> names;
    for (std::int64_t i = 0; i < config.n_layer; ++i)
      for (const char* layer : {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"})
        names.push_back("transformer.h." + std::to_string(i) + "." + layer + ".weight");
    return names;
  }
  // Names a file repeats a parameter under: the tied head.
  static std::vector<std::pair<std::string, std::string>> hf_aliases() {
    return {{"lm_head.weight", "transformer.wte.weight"}};
  }

  GPT2Config config;
  Embedding<P, B> wte;  // with wpe, the position table
  std::vector<TransformerBlock<P, B>> h;
  LayerNorm<P, B> ln_f;

 private:
  static GPT2Config check(const GPT2Config& c, const std::string& name) {
    AMP_REQUIRE(c.vocab_size > 0 && c.n_positions > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd % c.n_head == 0 &&
                    c.n_embd > 0,
                "GPT2 '", name, "': need positive vocab_size, n_positions, n_layer, n_head and n_embd a multiple of "
                "n_head (got ", c.vocab_size, ", ", c.n_positions, ", ", c.n_layer, ", ", c.n_head, ", ", c.n_embd, ")");
    return c;
  }
  static std::vector<TransformerBlock<P, B>> blocks(Builder<P, B> b, const GPT2Config& c) {
    std::vector<TransformerBlock<P, B>> out;
    for (std::int64_t i = 0; i < c.n_layer; ++i)
      out.emplace_back(b.child("transformer.h." + std::to_string(i)),
                       typename TransformerBlock<P, B>::Config{.features = c.n_embd, .heads = c.n_head,
                                                               .attention_dropout = c.dropout,
                                                               .residual_dropout = c.dropout, .attention = c.attention});
    return out;
  }
};

}  // namespace amp::nn
