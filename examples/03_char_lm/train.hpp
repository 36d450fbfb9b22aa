#pragma once
// char_lm's training of one opt level: GPT-2, AdamW with warm-up and cosine
// decay, evaluation, checkpoints, the Hugging Face layout and generation.
// Included by the generated translation unit of each level and backend, which
// instantiates Level<P, B> (examples/CMakeLists.txt).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>

#include <amp/io/checkpoint.hpp>
#include <amp/io/safetensors.hpp>
#include <amp/transformer.hpp>

#include "03_char_lm/job.hpp"
#include "common/context.hpp"
#include "common/distributed.hpp"
#include "common/numerics.hpp"
#include "common/record.hpp"
#include "common/run.hpp"

namespace char_lm {

namespace nn = amp::nn;
using Clock = std::chrono::steady_clock;
using examples::dist;
using examples::StepFigures;

// The model and the sampling as amp names them.
inline nn::GPT2Config gpt2_config(const ModelShape& m) {
  return {.vocab_size = m.vocab_size, .n_positions = m.n_positions, .n_layer = m.n_layer, .n_head = m.n_head,
          .n_embd = m.n_embd, .dropout = m.dropout,
          .attention = m.fused_attention ? nn::attention_kernel::fused : nn::attention_kernel::materialized,
          .checkpoint_blocks = m.checkpoint_blocks};
}
inline nn::Sampling sampling(const SamplingFlags& f) {
  return {.temperature = f.temperature, .top_k = f.top_k, .seed = f.seed, .cache = f.cache};
}

// The start of training window i: splitmix64 of (seed, i), so any program can replay the order.
inline std::int64_t window_start(std::uint64_t seed, std::int64_t i, std::int64_t limit) {
  return static_cast<std::int64_t>(amp::nn::mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)) %
                                   static_cast<std::uint64_t>(limit));
}

// Batch `step` of windows: inputs and next-character targets.
inline void fill_batch(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t step, bool training,
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
inline std::vector<std::int32_t> prompt_ids(const Settings& s, const Corpus& c) {
  return s.prompt.empty() ? std::vector<std::int32_t>{c.val.front()} : c.encode(s.prompt);
}

// n tokens continuing the prompt (nn/generate.hpp), printed as they come when `stream`.
template <class Model>
std::string sample_text(Model& model, const Settings& s, const Corpus& c, std::int64_t n, bool stream) {
  const auto ids = nn::generate(model, prompt_ids(s, c), n, sampling(s.sampling), [&](std::int32_t id) {
    if (!stream) return;
    std::fputs(c.decode({id}).c_str(), stdout);
    std::fflush(stdout);
  });
  return c.decode(ids);
}

// What a checkpoint records besides the model and optimizer: the next step,
// the model's shape and the tokenizer, checked when it resumes or generates.
inline amp::io::Archive checkpoint_extras(const Settings& s, const Corpus& c, std::int64_t next_step) {
  amp::io::Archive a;
  a.put_int64("char_lm.step", {next_step});
  const auto& m = s.model;
  a.put_int64("char_lm.model", {m.vocab_size, m.n_positions, m.n_layer, m.n_head, m.n_embd});
  a.put_int64("char_lm.chars", std::vector<std::int64_t>(c.chars.begin(), c.chars.end()));
  return a;
}
// `a`: the checkpoint file as read, so that a model of another shape is named before any tensor.
inline std::int64_t check_extras(const amp::io::Archive& a, const Settings& s, const Corpus& c) {
  const auto values = [&](const char* name) {
    const auto* r = a.find(std::string("extra.") + name);
    AMP_REQUIRE(r, "checkpoint '", s.resume, "' has no record '", name, "' (not written by char_lm?)");
    return r->values<std::int64_t>();
  };
  const auto ours = checkpoint_extras(s, c, 0);
  const auto model = values("char_lm.model"), this_run = ours.find("char_lm.model")->values<std::int64_t>();
  AMP_REQUIRE(model.size() == this_run.size(), "checkpoint '", s.resume, "': bad char_lm.model");
  // Flags not given were taken from the checkpoint (main): a difference is a flag given otherwise, or other data.
  const char* flags[] = {"vocabulary size", "--context", "--layers", "--heads", "--width"};
  for (std::size_t i = 0; i < model.size(); ++i)
    AMP_REQUIRE(model[i] == this_run[i], "checkpoint '", s.resume, "' was saved with ", flags[i], " ", model[i],
                "; this run has ", flags[i], " ", this_run[i], i == 0 ? " (other --data, or token files)" : "");
  AMP_REQUIRE(values("char_lm.chars") == ours.find("char_lm.chars")->values<std::int64_t>(), "checkpoint '", s.resume,
              "' was trained on another vocabulary (other --data, or token files)");
  const auto step = values("char_lm.step");
  AMP_REQUIRE(step.size() == 1 && step[0] >= 0, "checkpoint '", s.resume, "': bad char_lm.step");
  return step[0];
}

// Ctrl-C between steps: a checkpoint of the steps done, if asked for. (Under
// --zero 1 a save takes every rank, which a signal does not reach at one step:
// the last periodic one stands.)
template <class Model, class Opt>
void save_interrupted(const Settings& s, const Corpus& c, Model& model, Opt& opt, std::int64_t step, std::int64_t first) {
  if (s.save.empty() || step == first || !dist.leader() || s.zero) return;
  amp::io::save(s.save, model, opt, checkpoint_extras(s, c, step));
  std::printf("\ninterrupted: saved %s at step %lld (--resume continues from it)\n", s.save.c_str(),
              static_cast<long long>(step));
}

inline void progress(const Settings& s, const std::string& level, std::int64_t step, double tokens_per_second,
                     const StepFigures& rec) {
  std::printf("\r  %-7s step %5lld/%-5lld %7.0f tok/s loss %.4f scale %-8g", level.c_str(),
              static_cast<long long>(step + 1), static_cast<long long>(s.steps), tokens_per_second, rec.loss, rec.scale);
  std::fflush(stdout);
}

inline void log_evaluation(const Settings& s, const std::string& level, std::int64_t step, double val,
                           double tokens_per_second) {
  if (dist.leader())
    std::printf("%s  %-7s step %5lld/%-5lld val loss %.4f (ppl %.2f) %7.0f tok/s%s\n", s.tty ? "\r" : "", level.c_str(),
                static_cast<long long>(step + 1), static_cast<long long>(s.steps), val, std::exp(val), tokens_per_second,
                s.tty ? "          " : "");
  std::fflush(stdout);
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
      ctx, {.max_batch = s.batch, .seed = s.seed, .dropout_seed = dropout_seed, .fused_loss = s.fused_loss, .shard = shard,
            .numerics_every = s.numerics},
      gpt2_config(s.model));
  // AdamW as GPT-2 trains: no decay on biases and norms, warm-up then cosine, clipping.
  amp::optim::AdamW<P, B> opt(model.parameters(), {.lr = s.lr, .beta2 = 0.99f, .weight_decay = s.weight_decay},
                              {.max_grad_norm = s.clip,
                               .groups = {{.select = amp::optim::select::no_decay, .lr = {}, .weight_decay = 0.0f}}});
  opt.set_schedule(amp::optim::LinearWarmup<amp::optim::CosineLR>{
      s.warmup, {s.lr, std::max<std::int64_t>(1, s.steps - s.warmup), s.min_lr}});
  if (!s.import_from.empty()) amp::io::import_safetensors(s.import_from, model.parameters(), amp::io::hf_layout(model.net()));
  if (!s.resume.empty()) {
    r.first_step = check_extras(*s.resumed, s, c);
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
  auto& report = model.parameters().numerics();
  report.set_step(first);
  auto train_step = [&] {
    auto out = model.forward(ctx, x);
    auto loss = s.fused_loss ? nn::fused_cross_entropy(ctx, out, y, opt) : nn::cross_entropy(ctx, out, y);
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
    records.record(ctx, loss, opt, report.on() ? report.first_nonfinite() : nullptr);
  };
  std::optional<amp::CapturedStep<B>> graph;  // --graph: every batch has the same shape
  auto start = Clock::now();
  double interval = 0;  // training seconds since the last evaluation
  for (std::int64_t step = first; step < s.steps; ++step) {
    if (examples::interrupted()) return save_interrupted(s, c, model, opt, step, first), r;
    // A run that diverges (an amp::Error) still logs its skipped steps, with their tensors.
    examples::SkipLogOnError skip_log(report.on() && dist.leader(), [&] {
      examples::log_skips(r.level, first, records.download(ctx, static_cast<std::size_t>(step - first)), 0,
                          model.parameters().table());
    });
    loop.step(ctx, [&] {
      fill_batch(s, c.train, step, true, stage_ids.next().data, stage_targets.next().data);
      stage_ids.upload(ids.span(), tokens);
      stage_targets.upload(targets.span(), tokens);
      if (!s.graph || report.due()) train_step();  // --numerics: reported steps run eagerly
      else if (graph) graph->replay();
      else graph.emplace(ctx, train_step);  // this batch's eager step, then the capture
    });
    const bool eval_now = (step + 1) % s.eval_interval == 0 || step + 1 == s.steps;
    const bool save_now = !s.save.empty() && ((step + 1) % s.save_interval == 0 || step + 1 == s.steps);
    const StepFigures* rec = s.tty && dist.leader() && (step % 10 == 0 || eval_now) ? records.newest(ctx) : nullptr;
    if (rec) {
      const double secs = train_seconds + std::chrono::duration<double>(Clock::now() - start).count();
      progress(s, r.level, step, static_cast<double>((step + 1 - first) * tokens * dist.ranks) / secs, *rec);
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
      log_evaluation(s, r.level, step, val, static_cast<double>((step + 1 - first) * tokens * dist.ranks) / train_seconds);
      const auto rows = report.take();
      r.numerics.insert(r.numerics.end(), rows.begin(), rows.end());
    }
    // --zero 1: every rank saves (the shards gather on rank 0, which writes).
    if (save_now && (dist.leader() || s.zero)) amp::io::save(s.save, model, opt, checkpoint_extras(s, c, step + 1));
    if (eval_now || save_now) start = Clock::now();
  }
  examples::report_run(r, loop, graph, ctx, model.parameters());
  r.step_ms = 1e3 * train_seconds / static_cast<double>(count);
  r.steps = records.download(ctx, static_cast<std::size_t>(count));
  const std::size_t tail = std::min<std::size_t>(r.steps.size(), static_cast<std::size_t>(s.eval_interval));
  for (std::size_t i = r.steps.size() - tail; i < r.steps.size(); ++i) r.train_loss += r.steps[i].loss / tail;
  r.val_loss = r.evaluations.back().val_loss;
  r.tokens_per_second = static_cast<double>(count * dist.ranks) * static_cast<double>(tokens) / train_seconds;
  std::sort(intervals.begin(), intervals.end());
  r.interval_seconds = intervals[intervals.size() / 2];
  r.skipped = r.steps.back().skipped;
  if (report.on() && dist.leader()) examples::log_skips(r.level, first, r.steps, 0, model.parameters().table());
  r.final_scale = r.steps.back().scale;
  if (!s.export_to.empty() && (dist.leader() || s.zero))
    amp::io::export_safetensors(s.export_to, model.parameters(), amp::io::dtype::fp32, amp::io::hf_layout(model.net()));
  if (s.sample > 0 && dist.leader()) r.sample = sample_text(model, s, c, s.sample, false);
  r.finished = true;
  return r;
}

template <amp::Policy P, amp::Backend B>
LevelResult Level<P, B>::run(const Job& job) {
  const Settings& s = job.settings;
  // A fresh context per level, so that peak memory is that level's own.
  return examples::with_context<B>(s.threads, [&](amp::Context<B>& ctx) {
    LevelResult r = examples::with_collective(
        ctx, [&](amp::Collective<B>* comm) { return run_level<P>(ctx, s, job.corpus, comm); });
    r.device = examples::device_label(ctx);
    r.device_details = examples::device_details(ctx);
    using Attention = nn::CausalSelfAttention<P, B>;
    constexpr bool library = amp::fused_attention<B>::value &&
                             amp::fused_attention<B>::template runs<typename Attention::G, typename Attention::T>;
    r.attention_ran = s.model.fused_attention && library ? "fused" : "materialized";
    return r;
  });
}

}  // namespace char_lm
