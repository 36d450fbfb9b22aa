#pragma once
// What char_lm's main and its levels share: the corpus, the run's settings and
// what one level's training returns. Level<P, B>::run is defined in train.hpp
// and compiled once per level and backend, each in its own translation unit
// (examples/CMakeLists.txt); char_lm.cpp sees only this header.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <amp/backend/backend.hpp>
#include <amp/io/archive.hpp>
#include <amp/model/numerics.hpp>
#include <amp/policy.hpp>

#include "common/fp8.hpp"
#include "common/step_figures.hpp"

namespace char_lm {

// The corpus: the fortunes files in name order, concatenated (the first 90%
// trains, the rest validates), as characters; or two llm.c token files.
struct Corpus {
  std::vector<std::string> files;
  std::vector<std::int32_t> train, val;  // token ids
  std::vector<unsigned char> chars;      // characters: id -> byte; token files: none (ids below 256 are bytes)
  std::int64_t vocab = 0;
  double unigram_entropy = 0;            // of the validation text, nats per token

  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string out;
    for (const auto id : ids) {
      if (!chars.empty()) out += static_cast<char>(chars[static_cast<std::size_t>(id)]);
      else if (id < 256) out += static_cast<char>(id);
      else out.append("<").append(std::to_string(id)).append(">");  // not "<" + s: GCC 12 -Wrestrict
    }
    return out;
  }
  std::vector<std::int32_t> encode(const std::string& text) const {
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto byte = static_cast<unsigned char>(text[i]);
      const auto it = std::find(chars.begin(), chars.end(), byte);
      const std::int64_t id = chars.empty() ? byte : it - chars.begin();
      AMP_REQUIRE(id < vocab && (chars.empty() || it != chars.end()), "--prompt: byte ", int(byte), " at position ", i,
                  " is not in the vocabulary", chars.empty() ? " (ids are bytes, --vocab-size " : " of the training text",
                  chars.empty() ? std::to_string(vocab) + ")" : "");
      ids.push_back(static_cast<std::int32_t>(id));
    }
    return ids;
  }
};

// The model's shape, as nn::GPT2Config names it (train.hpp makes one from it).
struct ModelShape {
  std::int64_t vocab_size = 0, n_positions = 0, n_layer = 0, n_head = 0, n_embd = 0;
  float dropout = 0.0f;
  bool fused_attention = true;  // false: materialized
  bool checkpoint_blocks = false;
};

// How samples are drawn, as nn::Sampling names it.
struct SamplingFlags {
  float temperature = 1.0f;
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
  bool cache = true;
};

struct Settings {
  ModelShape model{};
  std::int64_t batch = 32, steps = 0, warmup = 0, eval_interval = 0, eval_batches = 0, sample = 0;
  float lr = 0, min_lr = 0, weight_decay = 0, clip = 0;
  std::uint64_t seed = 1;
  int threads = 0;
  int numerics = 0;  // --numerics N: the numerics report every N steps (0: off)
  std::string data;
  // One level: checkpoints, the Hugging Face layout, generation.
  std::string save, resume, export_to, import_from, prompt;
  const amp::io::Archive* resumed = nullptr;  // --resume's checkpoint as main read it
  std::int64_t save_interval = 0, generate = 0;
  SamplingFlags sampling{};
  bool tty = false, graph = false;
  bool fused_loss = true;  // the logits' memory takes their gradient (nn/fused_cross_entropy.hpp)
  bool zero = false;       // --zero 1: ZeRO stage 1 under --distributed
};

// What a level trains on.
struct Job {
  const Settings& settings;
  const Corpus& corpus;
};

struct Evaluation {
  std::int64_t step;
  double val_loss, seconds;  // seconds: training time of the interval
};

struct LevelResult {
  std::string level, device, device_details;
  std::string attention_ran;  // the kernel the device ran: fused falls back to materialized where it has none
  bool finished = false;
  double val_loss = 0, train_loss = 0, tokens_per_second = 0, interval_seconds = 0;
  std::size_t peak[static_cast<int>(amp::memory_kind::count)] = {};
  std::size_t peak_total = 0;
  long long skipped = 0;
  std::int64_t first_step = 0;  // --resume: the checkpoint's step
  // After the first step: what the loop did on the host (zeros: it can be one CUDA graph).
  long long host_syncs_in_loop = 0, allocations_in_loop = 0, pageable_copies_in_loop = 0, launches_per_step = 0;
  long long graph_nodes = 0;  // --graph: the captured step's nodes
  double step_ms = 0;         // training time per step
  float final_scale = 0;
  std::vector<Evaluation> evaluations;
  std::vector<examples::StepFigures> steps;
  std::string sample;
  examples::Fp8Summary fp8;  // FP8 levels: layers and final scales
  std::vector<amp::nn::NumericsRow> numerics;  // --numerics
};

// One opt level trained (or --generate run) on a fresh context of backend B,
// alone or as one rank of --distributed.
template <amp::Policy P, amp::Backend B>
struct Level {
  static LevelResult run(const Job& job);
};

}  // namespace char_lm
