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
//
// This file is the program around the training: flags, corpus, tables, files.
// The training of each level is train.hpp's, compiled per level and backend.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include <amp/data/tokens.hpp>
#include <amp/io/archive.hpp>
#include <amp/io/file.hpp>
#include <amp/version.hpp>

#include "03_char_lm/job.hpp"
#include "common/args.hpp"
#include "common/distributed.hpp"
#include "common/json.hpp"
#include "common/levels.hpp"
#include "common/loop_table.hpp"
#include "common/numerics.hpp"
#include "common/run.hpp"

namespace {

using namespace char_lm;
using examples::dist;

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
      .field("attention", results.empty() ? "" : results.front().attention_ran).field("loss", s.fused_loss ? "fused" : "plain")
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

std::string to_numerics_csv(const std::vector<LevelResult>& results) {
  std::vector<examples::LevelNumerics> levels;
  for (const auto& r : results) levels.push_back({r.level, r.numerics});
  return examples::numerics_csv(levels);
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
      .flag("train-tokens", "", "train on an llm.c token file (uint16 ids; scripts/make_token_files.py writes one) instead of --data",
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
      .flag("resume", "", "continue training (or --generate) from a checkpoint of --save, exactly; --opt-level and "
            "the model's shape (--context, --layers, --heads, --width) default to the checkpoint's", "FILE")
      .flag("export", "", "after training, write the weights as safetensors that transformers' GPT2LMHeadModel "
            "loads", "FILE")
      .flag("import", "", "start from weights in transformers' GPT2LMHeadModel layout (safetensors)", "FILE")
      .flag("json", "", "write the summary as JSON to FILE", "FILE")
      .flag("csv", "", "write every step (level, interval, step, loss, loss scale, skipped) to FILE", "FILE")
      .flag("numerics", "0", "every N steps, each tensor's zeros, subnormals, overflow, underflow and amax (and FP8 "
            "ranges) into --csv's FILE_numerics.csv, and skipped steps named by tensor; 0: off", "N")
      .toggle("graph", false, "capture the training step once and replay it per batch (a CUDA graph on the GPU)")
      .toggle("distributed", false, "one rank of an MPI job (mpirun -np N ...); --batch-size is per rank");
  if (!args.parse(argc, argv)) return 0;
  examples::watch_interrupts();  // before any thread starts (see run.hpp)
  if (args.on("distributed")) dist.start(argc, argv, "char_lm");
  // --resume: the saving run's level and model shape, where this run does not give them. A shape given
  // otherwise is refused (check_extras); another level converts the checkpoint (amp/io/checkpoint.hpp).
  amp::io::Archive saved;  // read once: the level checks its records too (train.hpp, check_extras)
  if (!args.str("resume").empty()) {
    saved = amp::io::Archive::read(args.str("resume"));
    if (const std::string policy = amp::io::checkpoint_meta(saved, "policy"); !policy.empty())
      args.default_to("opt-level", policy);
    if (const auto* model = saved.find("extra.char_lm.model"); model && model->numel() == 5) {
      const auto v = model->values<std::int64_t>();  // vocab (from the data), context, layers, heads, width
      for (int i = 1; const char* flag : {"context", "layers", "heads", "width"})
        args.default_to(flag, std::to_string(v[i++]));
    }
  }
  Settings s;
  s.resumed = &saved;
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
  s.model.fused_attention = attention == "fused";
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
  s.numerics = static_cast<int>(args.integer("numerics", 0, 1 << 30));
  AMP_REQUIRE(!s.numerics || !args.str("csv").empty(), "--numerics writes its report beside --csv FILE: give --csv too");
  AMP_REQUIRE(!s.numerics || !s.zero, "--numerics reads whole gradients: not with --zero 1");
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
    if (s.numerics) outputs.add("--numerics", examples::numerics_path(args.str("csv")));
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
                    if (flag == "--numerics") return to_numerics_csv(results);
                    return flag == "--json" ? to_json(s, device, details, corpus, results, complete) : to_csv(s, results);
                  },
                  !complete);
  };
  for (const auto& level : levels) {
    examples::with_policy(level, [&]<amp::Policy P>() {
      LevelResult r = examples::with_backend(gpu, [&]<amp::Backend B>() { return Level<P, B>::run({s, corpus}); });
      device = r.device, details = r.device_details;
      if (r.finished && s.generate > 0) return;
      if (r.finished) {
        if (!r.sample.empty() && dist.leader()) std::printf("  %s sample: %s\n", r.level.c_str(), r.sample.c_str());
        results.push_back(std::move(r));
      }
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
