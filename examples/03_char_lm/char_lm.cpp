// 03_char_lm: GPT-2 (nn/gpt2.hpp: token and position embeddings, pre-LN
// blocks of causal self-attention and a GELU MLP, the head tied to the
// embedding, its parameters named as transformers' GPT2LMHeadModel) on real
// English text, the Debian fortunes files as characters, or on llm.c token
// files, at each opt level: validation loss in nats per token and perplexity,
// tokens/s, peak memory by category, skipped steps and the final loss scale; a
// sample of generated text; JSON and a per-step CSV that scripts/plot.py
// draws. One level also saves and resumes checkpoints (exactly), exports and
// imports weights in the Hugging Face layout, and generates from a trained
// model with a key/value cache.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>

#include <amp/amp.hpp>
#include <amp/data/tokens.hpp>
#include <amp/io/checkpoint.hpp>
#include <amp/io/safetensors.hpp>

#include "common/args.hpp"
#include "common/distributed.hpp"
#include "common/json.hpp"
#include "common/fp8.hpp"
#include "common/levels.hpp"
#include "common/record.hpp"
#include "common/run.hpp"

namespace {

namespace nn = amp::nn;
using Clock = std::chrono::steady_clock;
using examples::StepRecord;

examples::Distributed dist;  // --distributed: this rank of the MPI job

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
      else out += "<" + std::to_string(id) + ">";
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

void measure_entropy(Corpus& c) {
  std::vector<double> count(static_cast<std::size_t>(c.vocab), 0.0);
  for (const auto id : c.val) count[static_cast<std::size_t>(id)] += 1;
  for (const double n : count)
    if (n > 0) c.unigram_entropy -= n / c.val.size() * std::log(n / c.val.size());
}

// llm.c token files (amp/data/tokens.hpp): one trains, the other validates.
Corpus read_token_files(const std::string& train, const std::string& val, std::int64_t vocab) {
  Corpus c;
  c.files = {train, val};
  c.vocab = vocab;
  c.train = amp::data::read_tokens(train, vocab);
  c.val = amp::data::read_tokens(val, vocab);
  measure_entropy(c);
  return c;
}

Corpus read_corpus(const std::string& dir) {
  namespace fs = std::filesystem;
  AMP_REQUIRE(fs::is_directory(dir), "corpus folder '", dir, "' not found (install Debian's fortunes, or point --data "
              "at a folder of text files)");
  Corpus c;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.find('.') == std::string::npos) c.files.push_back(entry.path().string());
  }
  std::sort(c.files.begin(), c.files.end());
  AMP_REQUIRE(!c.files.empty(), "corpus folder '", dir, "' has no text files (files without an extension)");
  std::string text;
  for (const auto& f : c.files) {
    std::ifstream in(f, std::ios::binary);
    AMP_REQUIRE(in, "cannot read corpus file '", f, "'");
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  AMP_REQUIRE(text.size() >= 10000, "corpus folder '", dir, "' holds only ", text.size(), " bytes of text");
  int id_of[256];
  std::fill(std::begin(id_of), std::end(id_of), -1);
  for (const char ch : text) id_of[static_cast<unsigned char>(ch)] = 0;
  for (int b = 0; b < 256; ++b)
    if (id_of[b] == 0) id_of[b] = static_cast<int>(c.chars.size()), c.chars.push_back(static_cast<unsigned char>(b));
  const std::size_t split = text.size() * 9 / 10;
  for (std::size_t i = 0; i < text.size(); ++i)
    (i < split ? c.train : c.val).push_back(id_of[static_cast<unsigned char>(text[i])]);
  c.vocab = static_cast<std::int64_t>(c.chars.size());
  measure_entropy(c);
  return c;
}

struct Settings {
  nn::GPT2Config model{};
  std::int64_t batch = 32, steps = 0, warmup = 0, eval_interval = 0, eval_batches = 0, sample = 0;
  float lr = 0, min_lr = 0, weight_decay = 0, clip = 0;
  std::uint64_t seed = 1;
  int threads = 0;
  std::string data;
  // One level: checkpoints, the Hugging Face layout, generation.
  std::string save, resume, export_to, import_from, prompt;
  std::int64_t save_interval = 0, generate = 0;
  nn::Sampling sampling{};
  bool tty = false, graph = false;
  bool fused_loss = true;  // the logits' memory takes their gradient (nn/fused_cross_entropy.hpp)
  bool zero = false;       // --zero 1: ZeRO stage 1 under --distributed
  std::string attention_ran;  // the kernel the device ran: fused falls back to materialized where it has none
};

// The start of training window i: splitmix64 of (seed, i), so any program can replay the order.
std::int64_t window_start(std::uint64_t seed, std::int64_t i, std::int64_t limit) {
  return static_cast<std::int64_t>(amp::nn::detail::mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)) %
                                   static_cast<std::uint64_t>(limit));
}

// Batch `step` of windows: inputs and next-character targets.
void fill_batch(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t step, bool training,
                std::int32_t* ids, std::int32_t* targets) {
  const std::int64_t t = s.model.n_positions, limit = static_cast<std::int64_t>(text.size()) - t - 1;
  for (std::int64_t r = 0; r < s.batch; ++r) {
    // Training: random windows (rank k of N takes rows k B .. k B + B - 1 of a global batch of N B, so N
    // ranks see one process's batch of N B); validation: --eval-batches global batches of evenly spaced
    // windows, the same for every level, each rank evaluating all of them (N batches of B each).
    const std::int64_t start = training ? window_start(s.seed, (step * dist.ranks + dist.rank) * s.batch + r, limit)
                                        : (step * s.batch + r) * (limit / (s.eval_batches * s.batch * dist.ranks));
    for (std::int64_t k = 0; k < t; ++k) {
      ids[r * t + k] = text[static_cast<std::size_t>(start + k)];
      targets[r * t + k] = text[static_cast<std::size_t>(start + k + 1)];
    }
  }
}

struct Evaluation {
  std::int64_t step;
  double val_loss, seconds;  // seconds: training time of the interval
};

struct LevelResult {
  std::string level;
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
  std::vector<StepRecord> steps;
  std::string sample;
  examples::Fp8Summary fp8;  // FP8 levels: layers and final scales
};

template <class Model, amp::Backend B>
double validation_loss(amp::Context<B>& ctx, Model& model, const Settings& s, const Corpus& c,
                       amp::Buffer<std::int32_t, B>& ids, amp::Buffer<std::int32_t, B>& targets) {
  model.eval();
  std::vector<std::int32_t> hi(ids.size()), ht(targets.size());
  double total = 0;
  const std::int64_t batches = s.eval_batches * dist.ranks;
  for (std::int64_t b = 0; b < batches; ++b) {
    fill_batch(s, c.val, b, false, hi.data(), ht.data());
    amp::upload(ctx, ids.span(), hi);
    amp::upload(ctx, targets.span(), ht);
    auto out = model.forward(ctx, amp::TensorView<const std::int32_t>(ids.data(), amp::Shape{s.batch, s.model.n_positions}));
    total += nn::cross_entropy(ctx, out, amp::Span<const std::int32_t>(targets.span())).item();
  }
  model.train();
  return total / static_cast<double>(batches);
}

// The prompt's tokens: --prompt, else the validation text's first token.
std::vector<std::int32_t> prompt_ids(const Settings& s, const Corpus& c) {
  return s.prompt.empty() ? std::vector<std::int32_t>{c.val.front()} : c.encode(s.prompt);
}

// n tokens continuing the prompt (nn/generate.hpp), printed as they come when `stream`.
template <class Model>
std::string sample_text(Model& model, const Settings& s, const Corpus& c, std::int64_t n, bool stream) {
  const auto ids = nn::generate(model, prompt_ids(s, c), n, s.sampling, [&](std::int32_t id) {
    if (!stream) return;
    std::fputs(c.decode({id}).c_str(), stdout);
    std::fflush(stdout);
  });
  return c.decode(ids);
}

// What a checkpoint records besides the model and optimizer: the next step,
// the model's shape and the tokenizer, checked when it resumes or generates.
amp::io::Archive checkpoint_extras(const Settings& s, const Corpus& c, std::int64_t next_step) {
  amp::io::Archive a;
  a.put_int64("char_lm.step", {next_step});
  const auto& m = s.model;
  a.put_int64("char_lm.model", {m.vocab_size, m.n_positions, m.n_layer, m.n_head, m.n_embd});
  a.put_int64("char_lm.chars", std::vector<std::int64_t>(c.chars.begin(), c.chars.end()));
  return a;
}
// `a`: the checkpoint file as read, so that a model of another shape is named before any tensor.
std::int64_t check_extras(const amp::io::Archive& a, const Settings& s, const Corpus& c) {
  const auto values = [&](const char* name) {
    const auto* r = a.find(std::string("extra.") + name);
    AMP_REQUIRE(r, "checkpoint '", s.resume, "' has no record '", name, "' (not written by char_lm?)");
    return r->values<std::int64_t>();
  };
  const auto ours = checkpoint_extras(s, c, 0);
  const auto& m = s.model;
  const auto model = values("char_lm.model");
  std::string theirs;
  for (const auto v : model) theirs += (theirs.empty() ? "" : ", ") + std::to_string(v);
  AMP_REQUIRE(model == ours.find("char_lm.model")->values<std::int64_t>(), "checkpoint '", s.resume,
              "' holds another model than vocab ", m.vocab_size, ", --context ", m.n_positions, ", --layers ", m.n_layer,
              ", --heads ", m.n_head, ", --width ", m.n_embd, " (its: vocab, context, layers, heads, width = ",
              theirs, ")");
  AMP_REQUIRE(values("char_lm.chars") == ours.find("char_lm.chars")->values<std::int64_t>(), "checkpoint '", s.resume,
              "' was trained on another vocabulary (other --data, or token files)");
  const auto step = values("char_lm.step");
  AMP_REQUIRE(step.size() == 1 && step[0] >= 0, "checkpoint '", s.resume, "': bad char_lm.step");
  return step[0];
}

template <amp::Policy P, amp::Backend B>
LevelResult run_level(amp::Context<B>& ctx, const Settings& s, const Corpus& c, amp::Collective<B>* comm) {
  LevelResult r;
  r.level = std::string(amp::policy_name<P>());
  // One set of initial weights on every rank, each rank its own dropout masks;
  // --zero 1: each rank keeps the masters and AdamW's moments of its shard.
  const std::uint64_t dropout_seed = s.seed + static_cast<std::uint64_t>(dist.rank) * 0x9E3779B97F4A7C15ull;
  const nn::Shard shard = s.zero ? nn::Shard{dist.rank, dist.ranks} : nn::Shard{};
  nn::Model<P, B, nn::GPT2<P, B>> model(
      ctx, {.max_batch = s.batch, .seed = s.seed, .dropout_seed = dropout_seed, .fused_loss = s.fused_loss, .shard = shard},
      s.model);
  // AdamW as GPT-2 trains: no decay on biases and norms, warm-up then cosine, clipping.
  amp::optim::AdamW<P, B> opt(model.parameters(),
                              {.lr = s.lr, .beta2 = 0.99f, .weight_decay = s.weight_decay, .max_grad_norm = s.clip,
                               .groups = {{.select = amp::optim::select::no_decay, .lr = {}, .weight_decay = 0.0f}}});
  opt.set_schedule(amp::optim::LinearWarmup<amp::optim::CosineLR>{
      s.warmup, {s.lr, std::max<std::int64_t>(1, s.steps - s.warmup), s.min_lr}});
  if (!s.import_from.empty()) amp::io::import_safetensors(s.import_from, model.parameters(), amp::io::hf_layout(model.net()));
  if (!s.resume.empty()) {
    r.first_step = check_extras(amp::io::Archive::read(s.resume), s, c);
    amp::io::load(s.resume, model, opt);
    AMP_REQUIRE(s.generate > 0 || r.first_step < s.steps, "checkpoint '", s.resume, "' is at step ", r.first_step,
                ": nothing left to train for --steps ", s.steps);
  }
#if defined(AMP_EXAMPLE_PARALLEL)
  // Rank 0's weights to every rank; gradients summed over the ranks before each step's check.
  std::optional<amp::parallel::DataParallel<decltype(opt)>> ddp;
  if (comm) ddp.emplace(*comm, opt, amp::parallel::DataParallelOptions{.zero = s.zero ? 1 : 0});
#else
  (void)comm;
#endif
  if (s.generate > 0) {  // no training: the prompt, then the tokens as they come
    std::fputs(c.decode(prompt_ids(s, c)).c_str(), stdout);
    r.sample = sample_text(model, s, c, s.generate, true);
    std::printf("\n");
    r.finished = true;
    return r;
  }
  const std::int64_t first = r.first_step, count = s.steps - first;
  const auto tokens = static_cast<std::size_t>(s.batch * s.model.n_positions);
  amp::Buffer<std::int32_t, B> ids(ctx, tokens, amp::memory_kind::data), targets(ctx, tokens, amp::memory_kind::data);
  amp::Staging<std::int32_t, B> stage_ids(ctx, tokens), stage_targets(ctx, tokens);  // pinned, asynchronous copies
  examples::StepRecords<B> records(ctx, static_cast<std::size_t>(count));
  double train_seconds = 0;
  std::vector<double> intervals;
  examples::LoopCounters loop;
  const amp::TensorView<const std::int32_t> x(ids.data(), amp::Shape{s.batch, s.model.n_positions});
  const amp::Span<const std::int32_t> y(targets.span());
  auto train_step = [&] {
    auto out = model.forward(ctx, x);
    auto loss = s.fused_loss ? nn::fused_cross_entropy(ctx, out, y, opt) : nn::cross_entropy(ctx, out, y);
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
    records.record(ctx, loss, opt);
  };
  std::optional<amp::CapturedStep<B>> graph;  // --graph: every batch has the same shape
  auto start = Clock::now();
  double interval = 0;  // training seconds since the last evaluation
  for (std::int64_t step = first; step < s.steps; ++step) {
    if (examples::interrupted()) {  // between steps: a checkpoint of the steps done, if asked for
      // (Under --zero 1 a save takes every rank, which a signal does not reach at one step: the last periodic one stands.)
      if (!s.save.empty() && step > first && dist.leader() && !s.zero) {
        amp::io::save(s.save, model, opt, checkpoint_extras(s, c, step));
        std::printf("\ninterrupted: saved %s at step %lld (--resume continues from it)\n", s.save.c_str(),
                    static_cast<long long>(step));
      }
      return r;
    }
    loop.step(ctx, [&] {
      fill_batch(s, c.train, step, true, stage_ids.next().data, stage_targets.next().data);
      stage_ids.upload(ids.span(), tokens);
      stage_targets.upload(targets.span(), tokens);
      if (!s.graph) train_step();
      else if (graph) graph->replay();
      else graph.emplace(ctx, train_step);  // this batch's eager step, then the capture
    });
    const bool eval_now = (step + 1) % s.eval_interval == 0 || step + 1 == s.steps;
    const bool save_now = !s.save.empty() && ((step + 1) % s.save_interval == 0 || step + 1 == s.steps);
    const StepRecord* rec = s.tty && dist.leader() && (step % 10 == 0 || eval_now) ? records.newest(ctx) : nullptr;
    if (rec) {
      const double secs = train_seconds + std::chrono::duration<double>(Clock::now() - start).count();
      std::printf("\r  %-7s step %5lld/%-5lld %7.0f tok/s loss %.4f scale %-8g", r.level.c_str(),
                  static_cast<long long>(step + 1), static_cast<long long>(s.steps),
                  static_cast<double>((step + 1 - first) * tokens * dist.ranks) / secs, rec->loss, rec->scale);
      std::fflush(stdout);
    }
    if (eval_now || save_now) {  // the clock stops for evaluations and checkpoints
      ctx.synchronize();
      const double secs = std::chrono::duration<double>(Clock::now() - start).count();
      train_seconds += secs;
      interval += secs;
    }
    if (eval_now) {
      intervals.push_back(interval);
      const double val = validation_loss(ctx, model, s, c, ids, targets);
      r.evaluations.push_back({step + 1, val, interval});
      interval = 0;
      if (dist.leader())
        std::printf("%s  %-7s step %5lld/%-5lld val loss %.4f (ppl %.2f) %7.0f tok/s%s\n", s.tty ? "\r" : "",
                    r.level.c_str(), static_cast<long long>(step + 1), static_cast<long long>(s.steps), val,
                    std::exp(val), static_cast<double>((step + 1 - first) * tokens * dist.ranks) / train_seconds,
                    s.tty ? "          " : "");
      std::fflush(stdout);
    }
    // --zero 1: every rank saves (the shards gather on rank 0, which writes).
    if (save_now && (dist.leader() || s.zero)) amp::io::save(s.save, model, opt, checkpoint_extras(s, c, step + 1));
    if (eval_now || save_now) start = Clock::now();
  }
  r.host_syncs_in_loop = loop.syncs(), r.allocations_in_loop = loop.allocations();
  r.pageable_copies_in_loop = loop.pageable_copies();
  r.launches_per_step = graph ? static_cast<long long>(graph->launches_per_step()) : loop.launches();
  r.graph_nodes = graph ? static_cast<long long>(graph->graph_nodes()) : 0;
  r.step_ms = 1e3 * train_seconds / static_cast<double>(count);
  r.steps = records.download(ctx, static_cast<std::size_t>(count));
  const std::size_t tail = std::min<std::size_t>(r.steps.size(), static_cast<std::size_t>(s.eval_interval));
  for (std::size_t i = r.steps.size() - tail; i < r.steps.size(); ++i) r.train_loss += r.steps[i].loss / tail;
  r.val_loss = r.evaluations.back().val_loss;
  r.tokens_per_second = static_cast<double>(count * dist.ranks) * static_cast<double>(tokens) / train_seconds;
  std::sort(intervals.begin(), intervals.end());
  r.interval_seconds = intervals[intervals.size() / 2];
  r.skipped = r.steps.back().skipped;
  r.final_scale = r.steps.back().scale;
  for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
    r.peak[k] = ctx.memory().peak(static_cast<amp::memory_kind>(k));
  r.peak_total = ctx.memory().peak_total();
  r.fp8 = examples::fp8_summary(model.parameters());
  if (!s.export_to.empty() && (dist.leader() || s.zero))
    amp::io::export_safetensors(s.export_to, model.parameters(), amp::io::dtype::fp32, amp::io::hf_layout(model.net()));
  if (s.sample > 0 && dist.leader()) r.sample = sample_text(model, s, c, s.sample, false);
  r.finished = true;
  return r;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

void print_tables(const std::string& device, const Corpus& c, const std::vector<LevelResult>& results) {
  using amp::memory_kind;
  const char* unit = c.chars.empty() ? "token" : "character";
  std::printf("\nresults on %s (validation: %zu %ss, unigram entropy %.4f nats/%s; 0.6 x = %.4f)\n", device.c_str(),
              c.val.size(), unit, c.unigram_entropy, unit, 0.6 * c.unigram_entropy);
  std::printf("%-8s %8s %8s %10s %10s %10s %7s %11s\n", "level", "val loss", "val ppl", "train loss", "tokens/s",
              "memory MiB", "skipped", "final scale");
  const LevelResult* o0 = nullptr;
  for (const auto& r : results) {
    if (r.level == "O0") o0 = &r;
    std::printf("%-8s %8.4f %8.3f %10.4f %10.0f %10.2f %7lld %11g\n", r.level.c_str(), r.val_loss, std::exp(r.val_loss),
                r.train_loss, r.tokens_per_second, mib(r.peak_total), r.skipped, r.final_scale);
  }
  std::printf("\npeak MiB  weights   master    grads optimizer activations workspace     data\n");
  for (const auto& r : results)
    std::printf("%-8s %8.2f %8.2f %8.2f %9.2f %11.2f %9.2f %8.2f\n", r.level.c_str(),
                mib(r.peak[int(memory_kind::weights)]), mib(r.peak[int(memory_kind::master)]),
                mib(r.peak[int(memory_kind::grads)]), mib(r.peak[int(memory_kind::optimizer)]),
                mib(r.peak[int(memory_kind::activations)]), mib(r.peak[int(memory_kind::workspace)]),
                mib(r.peak[int(memory_kind::data)]));
  if (o0) {
    std::printf("\nrelative to O0: validation loss, speed\n");
    for (const auto& r : results)
      std::printf("  %-8s %+6.2f %%  %.2fx\n", r.level.c_str(), 100 * (r.val_loss / o0->val_loss - 1),
                  r.tokens_per_second / o0->tokens_per_second);
  }
  examples::print_loop_counters(results);
}

std::string to_json(const Settings& s, const std::string& device, const std::string& details, const Corpus& c,
                    const std::vector<LevelResult>& results, bool complete) {
  examples::Json j;
  j.object().field("program", "char_lm").field("amp_version", AMP_VERSION_STRING).field("complete", complete);
  j.field("device", device).field("device_details", details).field("epoch_name", "evaluation interval");
  j.field("world_size", dist.ranks).field("global_batch_size", static_cast<long long>(s.batch * dist.ranks));
  j.key("data_files").array();
  for (const auto& f : c.files) j.value(f);
  j.end();
  j.field("train_characters", static_cast<long long>(c.train.size()))
      .field("val_characters", static_cast<long long>(c.val.size()))
      .field("vocab", static_cast<long long>(c.vocab)).field("tokens", c.chars.empty() ? "token files" : "characters")
      .field("unigram_entropy", c.unigram_entropy);
  j.key("settings").object().field("context", static_cast<long long>(s.model.n_positions))
      .field("layers", static_cast<long long>(s.model.n_layer)).field("heads", static_cast<long long>(s.model.n_head))
      .field("width", static_cast<long long>(s.model.n_embd)).field("dropout", s.model.dropout)
      .field("attention", s.attention_ran).field("loss", s.fused_loss ? "fused" : "plain")
      .field("checkpoint_blocks", s.model.checkpoint_blocks).field("zero", s.zero ? 1LL : 0LL)
      .field("batch_size", static_cast<long long>(s.batch)).field("steps", static_cast<long long>(s.steps))
      .field("lr", s.lr).field("min_lr", s.min_lr).field("warmup", static_cast<long long>(s.warmup))
      .field("weight_decay", s.weight_decay).field("clip", s.clip)
      .field("eval_interval", static_cast<long long>(s.eval_interval))
      .field("eval_batches", static_cast<long long>(s.eval_batches))
      .field("seed", static_cast<unsigned long long>(s.seed)).field("threads", s.threads).field("data", s.data)
      .field("graph", s.graph).end();
  j.key("levels").array();
  for (const auto& r : results) {
    j.object().field("opt_level", r.level).field("val_loss", r.val_loss).field("val_perplexity", std::exp(r.val_loss));
    j.field("train_loss", r.train_loss).field("tokens_per_second", r.tokens_per_second);
    j.field("epoch_seconds", r.interval_seconds).key("peak_bytes").object();
    for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
      j.field(amp::memory_kind_names[k], static_cast<unsigned long long>(r.peak[k]));
    j.field("total", static_cast<unsigned long long>(r.peak_total)).end();
    j.field("skipped_steps", r.skipped).field("final_loss_scale", r.final_scale);
    j.field("host_syncs_in_loop", r.host_syncs_in_loop).field("allocations_in_loop", r.allocations_in_loop);
    j.field("pageable_copies_in_loop", r.pageable_copies_in_loop).field("launches_per_step", r.launches_per_step);
    j.field("graph_nodes", r.graph_nodes).field("step_ms", r.step_ms);
    examples::json_fp8(j, r.fp8);
    j.field("sample", r.sample).key("epochs").array();
    for (std::size_t i = 0; i < r.evaluations.size(); ++i)
      j.object().field("epoch", static_cast<long long>(i + 1)).field("step", static_cast<long long>(r.evaluations[i].step))
          .field("val_loss", r.evaluations[i].val_loss).field("seconds", r.evaluations[i].seconds).end();
    j.end().end();
  }
  j.end().end();
  return j.str() + "\n";
}

// Every step; "epoch" counts evaluation intervals (from 1), as the plot expects.
std::string to_csv(const Settings& s, const std::vector<LevelResult>& results) {
  std::ostringstream c;
  c.precision(9);
  c << "level,epoch,step,loss,loss_scale,skipped\n";
  for (const auto& r : results)
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      const long long skipped = r.steps[i].skipped - (i ? r.steps[i - 1].skipped : 0);
      const auto step = static_cast<long long>(i) + r.first_step;  // from 0
      c << r.level << "," << step / s.eval_interval + 1 << "," << step + 1 << "," << r.steps[i].loss
        << "," << r.steps[i].scale << "," << skipped << "\n";
    }
  return c.str();
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("char_lm", "A character-level GPT on the fortunes files at each opt level.");
  args.flag("data", "/usr/share/games/fortunes", "folder of text files (Debian's fortunes; files without extension)",
            "DIR")
      .flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8, a comma-separated list, or all", "LEVEL")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores)", "N")
      .flag("steps", "650", "training steps per level", "N")
      .flag("batch-size", "32", "sequences per step", "N")
      .flag("train-tokens", "", "train on an llm.c token file (uint16 ids; scripts/tokenize.py writes one) instead of --data",
            "FILE")
      .flag("val-tokens", "", "the token file that validates (with --train-tokens)", "FILE")
      .flag("vocab-size", "256", "with token files: ids are checked to lie in [0, N)", "N")
      .flag("context", "128", "tokens per sequence (GPT-2's n_positions)", "N")
      .flag("layers", "4", "transformer blocks", "N")
      .flag("heads", "4", "attention heads", "N")
      .flag("width", "128", "model width (a multiple of --heads)", "N")
      .flag("dropout", "0", "dropout on attention probabilities and residual branches", "P")
      .flag("attention", "fused", "fused (O(T) memory, where the device has the kernel) | materialized (T x T)", "KERNEL")
      .toggle("checkpoint-blocks", false, "activation checkpointing: keep each block's input only and recompute its "
              "forward in backward (the same gradients, less memory, one more forward)")
      .flag("loss", "fused", "fused (the gradient written over the logits in the loss's pass) | plain", "KIND")
      .flag("zero", "0", "ZeRO stage under --distributed: 1 = each rank keeps the fp32 masters and AdamW moments of "
            "1/ranks of the parameters", "0|1")
      .flag("lr", "0.003", "peak learning rate (AdamW)", "X")
      .flag("min-lr", "0.0003", "learning rate at the end of the cosine decay", "X")
      .flag("warmup", "60", "linear warm-up steps", "N")
      .flag("weight-decay", "0.1", "AdamW weight decay (not on biases and norms)", "X")
      .flag("clip", "1", "clip the gradients' global norm to X (0: off)", "X")
      .flag("eval-interval", "100", "steps between validation losses", "N")
      .flag("eval-batches", "8", "validation batches per evaluation", "N")
      .flag("seed", "1", "seed of the initialisation, the data order and the sample", "N")
      .flag("sample", "240", "print N generated tokens after training (0: none)", "N")
      .flag("prompt", "", "the text a sample or --generate continues (default: the validation text's first token)",
            "TEXT")
      .flag("temperature", "1", "sampling temperature (0: always the most likely token)", "T")
      .flag("top-k", "0", "sample among the K most likely tokens (0: all)", "K")
      .toggle("kv-cache", true, "generate with the key/value cache (no: rerun the whole window per token)")
      .flag("generate", "0", "generate N tokens from --resume or --import without training, and stop", "N")
      .flag("save", "", "save a checkpoint (model, optimizer, scaler, step) to FILE every --save-interval steps and "
            "at the end", "FILE")
      .flag("save-interval", "0", "steps between checkpoints (0: only at the end)", "N")
      .flag("resume", "", "continue training (or --generate) from a checkpoint of --save, exactly", "FILE")
      .flag("export", "", "after training, write the weights as safetensors that transformers' GPT2LMHeadModel "
            "loads", "FILE")
      .flag("import", "", "start from weights in transformers' GPT2LMHeadModel layout (safetensors)", "FILE")
      .flag("json", "", "write the summary as JSON to FILE", "FILE")
      .flag("csv", "", "write every step (level, interval, step, loss, loss scale, skipped) to FILE", "FILE")
      .toggle("graph", false, "capture the training step once and replay it per batch (a CUDA graph on the GPU)")
      .toggle("distributed", false, "one rank of an MPI job (mpirun -np N ...); --batch-size is per rank");
  if (!args.parse(argc, argv)) return 0;
  examples::watch_interrupts();  // before any thread starts (see run.hpp)
  if (args.on("distributed")) dist.start(argc, argv, "char_lm");
  Settings s;
  s.model.n_positions = args.integer("context", 2, 4096);
  s.model.n_layer = args.integer("layers", 1, 256);
  s.model.n_head = args.integer("heads", 1, 256);
  s.model.n_embd = args.integer("width", 1, 65536);
  AMP_REQUIRE(s.model.n_embd % s.model.n_head == 0, "--width (", s.model.n_embd, ") must be a multiple of --heads (",
              s.model.n_head, ")");
  s.model.dropout = static_cast<float>(args.real("dropout", 0.0, 0.9));
  const std::string attention = args.str("attention");
  AMP_REQUIRE(attention == "fused" || attention == "materialized", "--attention must be fused or materialized, not '",
              attention, "'");
  s.model.attention = attention == "fused" ? nn::attention_kernel::fused : nn::attention_kernel::materialized;
  s.model.checkpoint_blocks = args.on("checkpoint-blocks");
  s.zero = args.integer("zero", 0, 1) == 1;
  AMP_REQUIRE(!s.zero || args.on("distributed"), "--zero 1 shards over the ranks of --distributed yes");
  const std::string loss = args.str("loss");
  AMP_REQUIRE(loss == "fused" || loss == "plain", "--loss must be fused or plain, not '", loss, "'");
  s.fused_loss = loss == "fused";
  s.steps = args.integer("steps", 1, 10'000'000);
  s.batch = args.integer("batch-size", 1, 1 << 16);
  s.lr = static_cast<float>(args.real("lr", 0.0, 1.0, true));
  s.min_lr = static_cast<float>(args.real("min-lr", 0.0, 1.0));
  s.warmup = args.integer("warmup", 0, 10'000'000);
  s.weight_decay = static_cast<float>(args.real("weight-decay", 0.0, 10.0));
  s.clip = static_cast<float>(args.real("clip", 0.0, 1e6));
  s.eval_interval = args.integer("eval-interval", 1, 10'000'000);
  s.eval_batches = args.integer("eval-batches", 1, 100000);
  s.seed = static_cast<std::uint64_t>(args.integer("seed", 0, std::numeric_limits<long long>::max()));
  s.sample = args.integer("sample", 0, 1'000'000);
  s.prompt = args.str("prompt");
  s.sampling = {.temperature = static_cast<float>(args.real("temperature", 0.0, 100.0)),
                .top_k = args.integer("top-k", 0, 1 << 30), .seed = s.seed, .cache = args.on("kv-cache")};
  s.generate = args.integer("generate", 0, 1'000'000);
  s.save = args.str("save"), s.resume = args.str("resume");
  s.export_to = args.str("export"), s.import_from = args.str("import");
  s.save_interval = args.integer("save-interval", 0, 10'000'000);
  s.threads = dist.threads(static_cast<int>(args.integer("threads", 0, 4096)));  // distributed: the cores, shared out
  s.data = args.str("data");
  s.tty = isatty(fileno(stdout)) != 0;
  s.graph = args.on("graph");
  const auto levels = examples::parse_levels(args.str("opt-level"));
  const bool gpu = examples::use_gpu(args.str("device"));
  // Checkpoints, weights files and generation belong to one model: one level.
  for (const char* flag : {"save", "resume", "export", "import", "generate"})
    AMP_REQUIRE(levels.size() == 1 || args.str(flag).empty() || args.str(flag) == "0", "--", flag,
                " works on one level: give --opt-level one level (for example O2-bf16), not '", args.str("opt-level"),
                "'");
  AMP_REQUIRE(s.generate == 0 || !s.resume.empty() || !s.import_from.empty(),
              "--generate samples from a trained model: give --resume CHECKPOINT or --import FILE");
  AMP_REQUIRE(s.generate == 0 || dist.ranks == 1, "--generate runs in one process, not under --distributed");
  AMP_REQUIRE(s.save_interval == 0 || !s.save.empty(), "--save-interval needs --save FILE");
  if (s.save_interval == 0) s.save_interval = s.steps;
  examples::Outputs outputs;
  if (dist.leader()) {  // rank 0 writes them
    outputs.add("--json", args.str("json"));
    outputs.add("--csv", args.str("csv"));
  }
  if (!s.save.empty()) amp::io::check_writable(s.save, "--save");
  if (!s.export_to.empty()) amp::io::check_writable(s.export_to, "--export");

  const std::string train_tokens = args.str("train-tokens"), val_tokens = args.str("val-tokens");
  AMP_REQUIRE(train_tokens.empty() == val_tokens.empty(), "--train-tokens and --val-tokens come together");
  const Corpus corpus = train_tokens.empty() ? read_corpus(s.data)
                                             : read_token_files(train_tokens, val_tokens, args.integer("vocab-size", 1, 65536));
  s.model.vocab_size = corpus.vocab;
  if (!s.prompt.empty()) corpus.encode(s.prompt);  // a bad --prompt is refused now, not after training
  const char* unit = corpus.chars.empty() ? "tokens" : "characters";
  for (const auto* part : {&corpus.train, &corpus.val})
    AMP_REQUIRE(static_cast<std::int64_t>(part->size()) > (part == &corpus.val ? s.eval_batches * s.batch * dist.ranks : 1) +
                                                              s.model.n_positions + 1,
                "the ", part == &corpus.val ? "validation" : "training", " text (", part->size(), " ", unit,
                ") is too short for ", part == &corpus.val ? "--eval-batches " + std::to_string(s.eval_batches) + " x " : "",
                "--batch-size ", s.batch, " windows of --context ", s.model.n_positions);
  if (s.generate == 0 && dist.leader())
    std::printf("char_lm: %zu files, %zu train / %zu validation %s, vocab %lld; %lld layers x %lld heads, width "
              "%lld, context %lld, batch %lld, %lld steps%s\n",
              corpus.files.size(), corpus.train.size(), corpus.val.size(), unit,
              static_cast<long long>(s.model.vocab_size), static_cast<long long>(s.model.n_layer),
              static_cast<long long>(s.model.n_head), static_cast<long long>(s.model.n_embd),
              static_cast<long long>(s.model.n_positions), static_cast<long long>(s.batch),
              static_cast<long long>(s.steps),
              dist.ranks > 1 ? (", " + std::to_string(dist.ranks) + " ranks x batch " + std::to_string(s.batch) +
                                " = global batch " + std::to_string(dist.ranks * s.batch) + ", " +
                                std::to_string(std::max(s.threads, 1)) + " threads per rank" +
                                (s.zero ? ", ZeRO-1" : ""))
                                   .c_str()
                             : "");

  std::string device, details;
  std::vector<LevelResult> results;
  auto write_outputs = [&](bool complete) {
    outputs.write([&](const std::string& flag) {
                    return flag == "--json" ? to_json(s, device, details, corpus, results, complete) : to_csv(s, results);
                  },
                  !complete);
  };
  for (const auto& level : levels) {
    examples::with_policy(level, [&]<amp::Policy P>() {
      examples::with_context(gpu, s.threads, [&]<amp::Backend B>(amp::Context<B>& ctx) {
        device = examples::device_label(ctx);
        details = examples::device_details(ctx);
        using Attention = nn::CausalSelfAttention<P, B>;
        constexpr bool library = amp::fused_attention<B>::value &&
                                 amp::fused_attention<B>::template runs<typename Attention::G, typename Attention::T>;
        s.attention_ran = s.model.attention == nn::attention_kernel::fused && library ? "fused" : "materialized";
        LevelResult r =
            dist.with_collective(ctx, [&](amp::Collective<B>* comm) { return run_level<P>(ctx, s, corpus, comm); });
        if (r.finished && s.generate > 0) return;
        if (r.finished) {
          if (!r.sample.empty() && dist.leader()) std::printf("  %s sample: %s\n", r.level.c_str(), r.sample.c_str());
          results.push_back(std::move(r));
        }
      });
    });
    if (examples::interrupted()) break;
    if (&level != &levels.back()) write_outputs(false);
  }
  if (s.generate > 0) return 0;
  if (!results.empty() && dist.leader())
    print_tables(device + (dist.ranks > 1 ? ", rank 0 of " + std::to_string(dist.ranks) : ""), corpus, results);
  if (examples::interrupted()) {
    if (!results.empty()) write_outputs(false);
    std::printf("interrupted: kept the %zu finished level(s)\n", results.size());
    examples::exit_by_signal();
  }
  write_outputs(true);
  return 0;
} catch (const std::exception& e) {
  if (dist.ranks > 1) std::fprintf(stderr, "char_lm (rank %d of %d): %s\n", dist.rank, dist.ranks, e.what());
  else std::fprintf(stderr, "char_lm: %s\n", e.what());
  dist.abort_job();  // the other ranks stop too, instead of waiting for this one
  return 2;
}
