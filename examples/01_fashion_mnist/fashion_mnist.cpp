// 01_fashion_mnist: the main job. An MLP 784-256-128-10 or a CNN (two
// conv3x3-BN-ReLU-maxpool stages, then 3136-128-10) trained on the real
// Fashion-MNIST at each opt level, with test accuracy, speed and memory by
// category side by side, the parameter table with its storage types, and a JSON
// summary and a per-step CSV that scripts/plot.py draws. Checkpoints at each
// epoch end (--save), exact resume (--resume), and weights to and from PyTorch
// as safetensors (--export, --import). Data parallel over MPI (and NCCL on
// GPUs) with --distributed yes under mpirun: --batch-size is per rank.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <tuple>

#include <amp/amp.hpp>
#include <amp/data/idx.hpp>
#include <amp/data/loader.hpp>
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

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kClasses = 10;

examples::Distributed dist;  // --distributed (common/distributed.hpp)

// The recipes, as torch.nn.Sequential would write them (names match PyTorch's).
template <amp::Policy P, amp::Backend B>
using Mlp = amp::nn::Sequential<P, B, amp::nn::Linear, amp::nn::Linear, amp::nn::Linear>;
template <amp::Policy P, amp::Backend B>
using Cnn = amp::nn::Sequential<P, B, amp::nn::Conv2d, amp::nn::BatchNorm2d, amp::nn::ReLU, amp::nn::MaxPool2d,
                                amp::nn::Conv2d, amp::nn::BatchNorm2d, amp::nn::ReLU, amp::nn::MaxPool2d,
                                amp::nn::Flatten, amp::nn::Linear, amp::nn::Linear>;

template <amp::Policy P, amp::Backend B>
Mlp<P, B> make_mlp(amp::Context<B>& ctx, std::int64_t batch, std::uint64_t seed, amp::nn::Shard shard = {}) {
  using amp::activation;
  return Mlp<P, B>(ctx, {.max_batch = batch, .seed = seed, .shard = shard}, {.in_features = 784, .out_features = 256, .act = activation::relu},
                   {.in_features = 256, .out_features = 128, .act = activation::relu},
                   {.in_features = 128, .out_features = kClasses});
}

// sync: SyncBatchNorm's communicator (nullptr: BatchNorm over this process's batch);
// shard: this rank's ZeRO-1 shard (--zero 1).
template <amp::Policy P, amp::Backend B>
Cnn<P, B> make_cnn(amp::Context<B>& ctx, std::int64_t batch, std::uint64_t seed, amp::Collective<B>* sync = nullptr,
                   amp::nn::Shard shard = {}) {
  using amp::activation;
  constexpr auto torch_init = amp::nn::initializer::torch_default;  // the PyTorch recipe starts as PyTorch does
  return Cnn<P, B>(ctx, {.max_batch = batch, .seed = seed, .inputs = {{amp::Shape{28, 28, 1}}}, .shard = shard},
                   {.in_channels = 1, .out_channels = 32, .kernel = 3, .padding = 1, .init = torch_init},
                   {.features = 32, .sync = sync}, {}, {.kernel = 2},
                   {.in_channels = 32, .out_channels = 64, .kernel = 3, .padding = 1, .init = torch_init},
                   {.features = 64, .sync = sync}, {}, {.kernel = 2}, {},
                   {.in_features = 3136, .out_features = 128, .act = activation::relu, .init = torch_init},
                   {.in_features = 128, .out_features = kClasses, .init = torch_init});
}

struct Settings {
  std::string model = "mlp", optimizer, schedule, data;
  std::string save, resume, export_to, import_from;  // checkpoint and safetensors paths (empty: none)
  float lr = 0, momentum = 0, mean = 0, stddev = 1;  // the training set's pixel statistics
  std::int64_t batch = 0, train_subset = 0;
  int epochs = 0, threads = 0;
  std::uint64_t seed = 0;
  bool tty = false, graph = false;
  bool zero = false;  // --zero 1: ZeRO stage 1 under --distributed
};

struct StepLog {
  int epoch;  // from 1, as on the console
  float loss, scale;
  int skipped;  // this step
};

struct EpochLog {
  int epoch;
  double seconds, train_loss, test_accuracy;
  long long skipped, skipped_total;
  float scale;
};

struct ParamRow {
  std::string name, shape, dtype, master_dtype;  // master_dtype empty: no master copy
};

struct LevelResult {
  std::string level;
  bool finished = false;
  std::vector<ParamRow> parameters;
  double accuracy = 0, epoch_seconds = 0, samples_per_second = 0;
  std::size_t peak[static_cast<int>(amp::memory_kind::count)] = {};
  std::size_t peak_total = 0;
  long long skipped = 0;
  // After the first step: what the loop did on the host (zeros: it can be one CUDA graph).
  long long host_syncs_in_loop = 0, allocations_in_loop = 0, pageable_copies_in_loop = 0, launches_per_step = 0;
  long long graph_nodes = 0;  // --graph: the captured step's nodes
  double step_ms = 0;         // the median epoch's time per step
  float final_scale = 0;
  std::vector<EpochLog> epochs;
  std::vector<StepLog> steps;
  std::vector<std::int32_t> predictions;  // the test set's, after the last epoch
  examples::Fp8Summary fp8;               // FP8 levels: layers and final scales
};

// What a resumed run must agree on with the run that saved (the level may differ: a policy conversion).
std::string resume_key(const Settings& s, std::int64_t train_images) {
  std::ostringstream k;
  k << "model=" << s.model << " optimizer=" << s.optimizer << " lr=" << s.lr << " schedule=" << s.schedule
    << " epochs=" << (s.schedule == "cosine" ? s.epochs : 0) << " momentum=" << s.momentum
    << " batch=" << s.batch << " seed=" << s.seed << " train_images=" << train_images;
  return k.str();
}

// The run's own part of a checkpoint: where it stands and what it has logged.
template <class Loader>
amp::io::Archive run_state(const Settings& s, const LevelResult& r, const Loader& loader) {
  using amp::io::dtype;
  amp::io::Archive a;
  a.put_text("settings", resume_key(s, loader.size()));
  a.put_int64("epoch", std::vector<std::int64_t>{r.epochs.back().epoch, r.skipped});
  const auto state = loader.state();
  a.put_int64("loader.order", state.order);
  a.put_text("loader.rng", state.rng);
  std::vector<double> epochs;
  for (const auto& e : r.epochs)
    epochs.insert(epochs.end(), {double(e.epoch), e.seconds, e.train_loss, e.test_accuracy, double(e.skipped),
                                 double(e.skipped_total), double(e.scale)});
  a.put("log.epochs", dtype::fp64, {epochs.size()}, epochs.data(), epochs.size());
  std::vector<float> loss, scale;
  std::vector<std::int64_t> step_epoch, skipped;
  for (const auto& l : r.steps) loss.push_back(l.loss), scale.push_back(l.scale), step_epoch.push_back(l.epoch),
                                skipped.push_back(l.skipped);
  a.put("log.loss", dtype::fp32, {loss.size()}, loss.data(), loss.size());
  a.put("log.scale", dtype::fp32, {scale.size()}, scale.data(), scale.size());
  a.put_int64("log.epoch", step_epoch);
  a.put_int64("log.skipped", skipped);
  return a;
}

// Restores run_state() into the logs and the loader's order and generator; returns the last finished epoch.
int restore_run(const Settings& s, const amp::io::Archive& a, LevelResult& r, std::int64_t train_images,
                std::vector<std::int64_t>& order, std::string& rng) {
  const auto need = [&](const char* name) -> const amp::io::Record* {
    const amp::io::Record* rec = a.find(name);
    AMP_REQUIRE(rec, "--resume '", s.resume, "' is not a fashion_mnist checkpoint (no ", name, ")");
    return rec;
  };
  const std::string saved = need("settings")->text(), now = resume_key(s, train_images);
  AMP_REQUIRE(saved == now, "--resume '", s.resume, "' was saved with ", saved, "; this run has ", now);
  const auto epoch = need("epoch")->values<std::int64_t>();
  order = need("loader.order")->values<std::int64_t>();
  rng = need("loader.rng")->text();
  const auto epochs = need("log.epochs")->values<double>();
  const auto loss = need("log.loss")->values<float>(), scale = need("log.scale")->values<float>();
  const auto step_epoch = need("log.epoch")->values<std::int64_t>(), skipped = need("log.skipped")->values<std::int64_t>();
  AMP_REQUIRE(epoch.size() == 2 && epochs.size() == 7 * static_cast<std::size_t>(epoch[0]) && scale.size() == loss.size() &&
                  step_epoch.size() == loss.size() && skipped.size() == loss.size(),
              "--resume '", s.resume, "': its logs do not fit together");
  for (std::size_t i = 0; i < epochs.size(); i += 7)
    r.epochs.push_back({int(epochs[i]), epochs[i + 1], epochs[i + 2], epochs[i + 3], (long long)epochs[i + 4],
                        (long long)epochs[i + 5], float(epochs[i + 6])});
  for (std::size_t i = 0; i < loss.size(); ++i) r.steps.push_back({int(step_epoch[i]), loss[i], scale[i], int(skipped[i])});
  r.skipped = epoch[1];
  return static_cast<int>(epoch[0]);
}

using examples::StepRecord;

// Test accuracy: argmax of the logits, on the host, in evaluation mode.
template <class Model, amp::Backend B, class Loader>
double accuracy(amp::Context<B>& ctx, Model& model, Loader& test_data, std::vector<std::int32_t>* predictions = nullptr) {
  model.eval();
  std::int64_t correct = 0;
  if (predictions) predictions->clear();
  for (std::int64_t b = 0; b < test_data.batches(); ++b) {
    const auto batch = test_data.batch(b);
    const auto out = model.forward(ctx, batch.x);
    const auto logits = amp::download(ctx, out.value().span());
    const auto labels = amp::download(ctx, batch.labels);
    for (std::int64_t row = 0; row < out.rows(); ++row) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < kClasses; ++c)
        if (amp::cast<float>(logits[row * kClasses + c]) > amp::cast<float>(logits[row * kClasses + best])) best = c;
      correct += best == labels[static_cast<std::size_t>(row)];
      if (predictions) predictions->push_back(static_cast<std::int32_t>(best));
    }
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test_data.size());
}

void progress(const Settings& s, const std::string& level, int epoch, std::int64_t b, std::int64_t batches,
              double seconds, float loss, float scale) {
  const int filled = static_cast<int>(20 * (b + 1) / batches);
  std::printf("\r  %-7s %2d/%-2d [%s%s] %4lld/%-4lld %7.0f/s loss %.4f scale %-8g", level.c_str(), epoch, s.epochs,
              std::string(filled, '#').c_str(), std::string(20 - filled, '.').c_str(), static_cast<long long>(b + 1),
              static_cast<long long>(batches), (b + 1) * s.batch * dist.ranks / std::max(seconds, 1e-9), loss, scale);
  std::fflush(stdout);
}

// Each parameter with its stored type and its master's, as the policy decides by role.
template <amp::Policy P, amp::Backend B>
std::vector<ParamRow> parameter_rows(const amp::nn::ParameterStore<P, B>& store) {
  using namespace amp::nn;
  std::vector<ParamRow> rows;
  for (const auto& p : store.table()) {
    ParamRow r{p.name, p.shape.str(), "fp32", ""};
    if (p.kind == role::weight) {
      r.dtype = std::string(amp::type_name<typename RoleArena<P, B, role::weight>::stored_type>());
      if (RoleArena<P, B, role::weight>::has_master) r.master_dtype = "fp32";
    } else if (p.kind == role::norm) {
      r.dtype = std::string(amp::type_name<typename RoleArena<P, B, role::norm>::stored_type>());
      if (RoleArena<P, B, role::norm>::has_master) r.master_dtype = "fp32";
    }
    rows.push_back(r);
  }
  return rows;
}

template <amp::Policy P, amp::Backend B, class Opt, class Model>
LevelResult train(amp::Context<B>& ctx, Model& model, const amp::data::LabelledImages& train_set,
                  const amp::data::LabelledImages& test_set, const Settings& s, amp::Collective<B>* comm) {
  namespace nn = amp::nn;
  Opt opt = [&] {
    if constexpr (std::is_same_v<Opt, amp::optim::SGD<P, B>>)
      return Opt(model.parameters(), {.lr = s.lr, .momentum = s.momentum});
    else
      return Opt(model.parameters(), {.lr = s.lr});
  }();
#if defined(AMP_EXAMPLE_PARALLEL)
  // Rank 0's weights to every rank (--zero 1: every rank starts alike); gradients summed over the ranks before
  // each step's check (--zero 1: each rank's shard to it, its masters and moments stepped there, then gathered).
  std::optional<amp::parallel::DataParallel<Opt>> ddp;
  if (comm) ddp.emplace(*comm, opt, amp::parallel::DataParallelOptions{.zero = s.zero ? 1 : 0});
#endif
  const amp::data::Layout layout = s.model == "cnn" ? amp::data::Layout::image : amp::data::Layout::flat;
  // Each rank its shard of every global batch of batch x ranks samples.
  amp::data::Loader<float, B> train_data(ctx, train_set, {.batch_size = s.batch, .seed = s.seed, .mean = s.mean,
                                                          .stddev = s.stddev, .layout = layout, .rank = dist.rank,
                                                          .ranks = dist.ranks});
  amp::data::Loader<float, B> test_data(ctx, test_set, {.batch_size = s.batch, .shuffle = false, .mean = s.mean,
                                                        .stddev = s.stddev, .layout = layout});
  examples::StepRecords<B> records(ctx, static_cast<std::size_t>(train_data.batches()));
  if (s.schedule == "cosine") opt.set_schedule(amp::optim::CosineLR{s.lr, s.epochs * train_data.batches()});

  LevelResult r;
  r.level = std::string(amp::policy_name<P>());
  r.parameters = parameter_rows(model.parameters());
  if (!s.import_from.empty()) amp::io::import_safetensors(s.import_from, model.parameters());
  int done = 0;  // epochs finished before this run (--resume)
  if (!s.resume.empty()) {
    std::vector<std::int64_t> order;
    std::string rng;
    done = restore_run(s, amp::io::load(s.resume, model, opt), r, train_data.size(), order, rng);
    train_data.set_state({order, rng});
    AMP_REQUIRE(done < s.epochs, "--resume '", s.resume, "' has finished ", done, " epochs already; ask for more with --epochs");
    std::printf("  %-7s resumed from %s after epoch %d\n", r.level.c_str(), s.resume.c_str(), done);
  }
  std::vector<double> epoch_times;
  examples::LoopCounters loop;
  // --graph: full batches replay one captured step (the loader refills the same
  // buffers); the last, partial batch has another shape and runs eagerly.
  std::optional<amp::CapturedStep<B>> graph;
  for (int epoch = done + 1; epoch <= s.epochs; ++epoch) {
    ctx.synchronize();
    const auto start = Clock::now();
    train_data.start_epoch();
    records.restart(ctx);
    for (std::int64_t b = 0; b < train_data.batches(); ++b) {
      if (examples::interrupted()) return r;  // not finished: the caller keeps only finished levels
      loop.step(ctx, [&] {
        const auto batch = train_data.batch(b);
        auto step = [&, x = batch.x, labels = batch.labels] {
          auto loss = nn::cross_entropy(ctx, model.forward(ctx, x), labels);
          opt.zero_grad();
          {
            auto scaled = amp::scale_loss(loss, opt);
            scaled.backward();
          }
          opt.step();
          records.record(ctx, loss, opt);
        };
        if (!s.graph || batch.x.shape[0] != s.batch) step();
        else if (graph) graph->replay();
        else graph.emplace(ctx, step);  // this batch's eager step, then the capture
      });
      if (s.tty && dist.leader() && (b % 25 == 0 || b + 1 == train_data.batches()))
        if (const StepRecord* rec = records.newest(ctx))
          progress(s, r.level, epoch, b, train_data.batches(),
                   std::chrono::duration<double>(Clock::now() - start).count(), rec->loss, rec->scale);
    }
    ctx.synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    epoch_times.push_back(secs);
    const auto recs = records.download(ctx, static_cast<std::size_t>(train_data.batches()));
    double loss_sum = 0;
    for (std::size_t i = 0; i < recs.size(); ++i) {
      const long long before = i ? recs[i - 1].skipped : r.skipped;
      r.steps.push_back({epoch, recs[i].loss, recs[i].scale, static_cast<int>(recs[i].skipped - before)});
      loss_sum += recs[i].loss;
    }
    const EpochLog e{epoch, secs, loss_sum / static_cast<double>(recs.size()),
                     accuracy(ctx, model, test_data, &r.predictions), recs.back().skipped - r.skipped,
                     recs.back().skipped, recs.back().scale};
    r.epochs.push_back(e);
    r.skipped = e.skipped_total;
    if (dist.leader())
      std::printf("%s  %-7s %2d/%-2d %6.2f s %7.0f/s loss %.4f acc %.4f skipped %lld (total %lld)%s\n",
                s.tty ? "\r" : "", r.level.c_str(), epoch, s.epochs, secs, train_data.size() / secs, e.train_loss,
                e.test_accuracy, e.skipped, e.skipped_total, s.tty ? "   " : "");
    std::fflush(stdout);
    if (!s.save.empty() && (dist.leader() || s.zero)) amp::io::save(s.save, model, opt, run_state(s, r, train_data));
  }
  if (!s.export_to.empty() && (dist.leader() || s.zero)) amp::io::export_safetensors(s.export_to, model.parameters());
  r.host_syncs_in_loop = loop.syncs(), r.allocations_in_loop = loop.allocations();
  r.pageable_copies_in_loop = loop.pageable_copies();
  r.launches_per_step = graph ? static_cast<long long>(graph->launches_per_step()) : loop.launches();
  r.graph_nodes = graph ? static_cast<long long>(graph->graph_nodes()) : 0;
  r.accuracy = r.epochs.back().test_accuracy;
  std::sort(epoch_times.begin(), epoch_times.end());
  r.epoch_seconds = epoch_times[epoch_times.size() / 2];
  r.step_ms = 1e3 * r.epoch_seconds / static_cast<double>(train_data.batches());
  r.samples_per_second = static_cast<double>(train_data.size()) / r.epoch_seconds;
  for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
    r.peak[k] = ctx.memory().peak(static_cast<amp::memory_kind>(k));
  r.peak_total = ctx.memory().peak_total();
  r.final_scale = r.epochs.back().scale;
  r.fp8 = examples::fp8_summary(model.parameters());
  r.finished = true;
  return r;
}

template <amp::Policy P, amp::Backend B, class Model>
LevelResult run_model(amp::Context<B>& ctx, Model& model, const amp::data::LabelledImages& tr,
                      const amp::data::LabelledImages& te, const Settings& s, amp::Collective<B>* comm) {
  if (s.optimizer == "sgd") return train<P, B, amp::optim::SGD<P, B>>(ctx, model, tr, te, s, comm);
  if (s.optimizer == "adam") return train<P, B, amp::optim::Adam<P, B>>(ctx, model, tr, te, s, comm);
  return train<P, B, amp::optim::AdamW<P, B>>(ctx, model, tr, te, s, comm);
}

template <amp::Policy P, amp::Backend B>
LevelResult run_level(amp::Context<B>& ctx, const amp::data::LabelledImages& tr, const amp::data::LabelledImages& te,
                      const Settings& s, amp::Collective<B>* comm) {
  const amp::nn::Shard shard = s.zero ? amp::nn::Shard{dist.rank, dist.ranks} : amp::nn::Shard{};
  if (s.model == "cnn") {
    auto model = make_cnn<P>(ctx, s.batch, s.seed, comm, shard);  // SyncBatchNorm when distributed
    return run_model<P>(ctx, model, tr, te, s, comm);
  }
  auto model = make_mlp<P>(ctx, s.batch, s.seed, shard);
  return run_model<P>(ctx, model, tr, te, s, comm);
}

// The level on this context: alone, or as one rank of the job (MPI on the
// CPU, NCCL bootstrapped over MPI on the GPU).
template <amp::Policy P, amp::Backend B>
LevelResult run_rank(amp::Context<B>& ctx, const amp::data::LabelledImages& tr, const amp::data::LabelledImages& te,
                     const Settings& s) {
  return dist.with_collective(ctx, [&](amp::Collective<B>* comm) { return run_level<P>(ctx, tr, te, s, comm); });
}

std::string data_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::ifstream(candidate).good()) return candidate;
  amp::fail("data set file '", dir, "/", name, "[.gz]' not found (install Debian's dataset-fashion-mnist, "
            "or point --data at a folder with the IDX files)");
}

// The first n samples (n = 0: all).
amp::data::LabelledImages first(amp::data::LabelledImages set, std::int64_t n) {
  if (n == 0 || n >= set.count) return set;
  set.count = n;
  set.pixels.resize(static_cast<std::size_t>(n * set.rows * set.cols));
  set.labels.resize(static_cast<std::size_t>(n));
  return set;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

std::size_t peak(const LevelResult& r, amp::memory_kind k) { return r.peak[static_cast<int>(k)]; }

void print_tables(const std::string& device, const std::vector<LevelResult>& results) {
  using amp::memory_kind;
  std::printf("\nresults on %s\n", device.c_str());
  std::printf("%-8s %8s %9s %10s %11s %8s %12s\n", "level", "test acc", "epoch [s]", "samples/s", "memory MiB",
              "skipped", "final scale");
  for (const auto& r : results)
    std::printf("%-8s %8.4f %9.3f %10.0f %11.2f %8lld %12g\n", r.level.c_str(), r.accuracy, r.epoch_seconds,
                r.samples_per_second, mib(r.peak_total), r.skipped, r.final_scale);
  std::printf("\npeak MiB  weights   master    grads optimizer activations workspace     data\n");
  for (const auto& r : results)
    std::printf("%-8s %8.2f %8.2f %8.2f %9.2f %11.2f %9.2f %8.2f\n", r.level.c_str(), mib(peak(r, memory_kind::weights)),
                mib(peak(r, memory_kind::master)), mib(peak(r, memory_kind::grads)),
                mib(peak(r, memory_kind::optimizer)), mib(peak(r, memory_kind::activations)),
                mib(peak(r, memory_kind::workspace)), mib(peak(r, memory_kind::data)));
  const auto o0 = std::find_if(results.begin(), results.end(), [](const auto& r) { return r.level == "O0"; });
  if (o0 != results.end()) {
    std::printf("\nrelative to O0: weights + activations memory, speed-up, test accuracy\n");
    for (const auto& r : results) {
      const double wa = double(peak(r, memory_kind::weights) + peak(r, memory_kind::activations)) /
                        double(peak(*o0, memory_kind::weights) + peak(*o0, memory_kind::activations));
      std::printf("  %-8s %.3fx memory  %.2fx speed  %+.2f pp\n", r.level.c_str(), wa,
                  o0->epoch_seconds / r.epoch_seconds, 100 * (r.accuracy - o0->accuracy));
    }
  }
  examples::print_loop_counters(results);
}

void print_parameters(const std::vector<LevelResult>& results) {
  for (const auto& r : results) {
    std::printf("\n%s parameters: name, shape, stored type, master copy\n", r.level.c_str());
    for (const auto& p : r.parameters)
      std::printf("  %-20s %-16s %-5s %s\n", p.name.c_str(), p.shape.c_str(), p.dtype.c_str(),
                  p.master_dtype.empty() ? "-" : p.master_dtype.c_str());
    examples::print_fp8(r.level, r.fp8);
  }
}

std::string to_json(const Settings& s, const std::string& device, const std::string& details,
                    std::int64_t train_images, const std::vector<LevelResult>& results, bool complete) {
  examples::Json j;
  j.object().field("program", "fashion_mnist").field("amp_version", AMP_VERSION_STRING).field("complete", complete);
  j.field("world_size", dist.ranks).field("zero", s.zero ? 1 : 0);
  j.field("device", device).field("device_details", details);
  j.key("settings").object().field("model", s.model).field("optimizer", s.optimizer).field("lr", s.lr);
  j.field("schedule", s.schedule).field("momentum", s.optimizer == "sgd" ? s.momentum : 0.0f);
  j.field("batch_size", static_cast<long long>(s.batch));
  j.field("global_batch_size", static_cast<long long>(s.batch * dist.ranks));
  j.field("epochs", s.epochs).field("seed", static_cast<unsigned long long>(s.seed)).field("data", s.data);
  j.field("train_subset", static_cast<long long>(s.train_subset)).field("train_images", static_cast<long long>(train_images));
  j.field("threads", s.threads).field("input_mean", s.mean).field("input_std", s.stddev);
  j.field("resumed_from", s.resume).field("imported", s.import_from).field("graph", s.graph).end();
  j.key("levels").array();
  for (const auto& r : results) {
    j.object().field("opt_level", r.level).field("test_accuracy", r.accuracy).field("epoch_seconds", r.epoch_seconds);
    j.field("samples_per_second", r.samples_per_second).key("peak_bytes").object();
    for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
      j.field(amp::memory_kind_names[k], static_cast<unsigned long long>(r.peak[k]));
    j.field("total", static_cast<unsigned long long>(r.peak_total)).end();
    j.field("skipped_steps", r.skipped).field("final_loss_scale", r.final_scale);
    j.field("host_syncs_in_loop", r.host_syncs_in_loop).field("allocations_in_loop", r.allocations_in_loop);
    j.field("pageable_copies_in_loop", r.pageable_copies_in_loop).field("launches_per_step", r.launches_per_step);
    j.field("graph_nodes", r.graph_nodes).field("step_ms", r.step_ms);
    examples::json_fp8(j, r.fp8);
    j.key("parameters").array();
    for (const auto& p : r.parameters) {
      j.object().field("name", p.name).field("shape", p.shape).field("dtype", p.dtype).key("master_dtype");
      if (p.master_dtype.empty()) j.null();
      else j.value(p.master_dtype);
      j.end();
    }
    j.end().key("epochs").array();
    for (const auto& e : r.epochs)
      j.object().field("epoch", e.epoch).field("seconds", e.seconds).field("train_loss", e.train_loss)
          .field("test_accuracy", e.test_accuracy).field("skipped_steps", e.skipped).field("loss_scale", e.scale).end();
    j.end().end();
  }
  j.end().end();
  return j.str() + "\n";
}

// index,<level>,...: each finished level's predicted class for each test image.
std::string to_predictions(const std::vector<LevelResult>& results) {
  std::ostringstream c;
  c << "index";
  for (const auto& r : results) c << "," << r.level;
  c << "\n";
  for (std::size_t i = 0; !results.empty() && i < results.front().predictions.size(); ++i) {
    c << i;
    for (const auto& r : results) c << "," << r.predictions[i];
    c << "\n";
  }
  return c.str();
}

std::string to_csv(const std::vector<LevelResult>& results) {
  std::ostringstream c;
  c.precision(9);
  c << "level,epoch,step,loss,loss_scale,skipped\n";
  for (const auto& r : results)
    for (std::size_t i = 0; i < r.steps.size(); ++i) {
      const auto& l = r.steps[i];
      c << r.level << "," << l.epoch << "," << i + 1 << "," << l.loss << "," << l.scale << "," << l.skipped << "\n";
    }
  return c.str();
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("fashion_mnist",
                      "An MLP or a CNN on Fashion-MNIST at each opt level: accuracy, speed and memory side by side.");
  args.flag("data", "/usr/share/datasets/fashion-mnist", "folder with the IDX files (gzip or raw; MNIST works too)", "DIR")
      .flag("model", "mlp", "mlp (784-256-128-10) or cnn (2 x conv3x3-BN-ReLU-maxpool, 3136-128-10)", "NAME")
      .flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8, a comma-separated list, or all", "LEVEL")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores; see README)", "N")
      .flag("optimizer", "sgd", "sgd|adam|adamw", "NAME")
      .flag("lr", "0.05", "learning rate", "X")
      .flag("schedule", "constant", "constant, or cosine: anneal the rate per step to 0 over --epochs", "NAME")
      .flag("momentum", "0.9", "SGD momentum", "X")
      .flag("batch-size", "128", "mini-batch size per process (the last partial batch is kept)", "N")
      .flag("epochs", "10", "training epochs", "N")
      .flag("seed", "1", "seed of the initialisation and the shuffling", "N")
      .flag("train-subset", "0", "train on the first N images only (0: all 60000)", "N")
      .flag("json", "", "write the summary (settings, per level and per epoch) as JSON to FILE", "FILE")
      .flag("csv", "", "write every step (level, epoch, step, loss, loss scale, skipped) to FILE", "FILE")
      .flag("predictions", "", "write the test set's predicted classes after training as CSV to FILE", "FILE")
      .flag("save", "", "save a checkpoint to FILE at each epoch end (one --opt-level)", "FILE")
      .flag("resume", "", "resume from a --save checkpoint and train on to --epochs", "FILE")
      .flag("export", "", "write the trained weights as safetensors (PyTorch's names) to FILE", "FILE")
      .flag("import", "", "start from the weights in a safetensors FILE (e.g. from PyTorch)", "FILE")
      .toggle("summary", false, "print each level's parameters with their storage types")
      .toggle("graph", false, "capture the training step once and replay it per batch (a CUDA graph on the GPU)")
      .toggle("distributed", false, "one rank of an MPI job (mpirun -np N ...); --batch-size is per rank")
      .flag("zero", "0", "ZeRO stage under --distributed: 1 = each rank keeps the fp32 masters and optimizer state of "
            "1/ranks of the parameters", "0|1");
  if (!args.parse(argc, argv)) return 0;
  examples::watch_interrupts();  // before any thread starts (see run.hpp)
  if (args.on("distributed")) dist.start(argc, argv, "fashion_mnist");
  Settings s;
  s.model = args.str("model");
  AMP_REQUIRE(s.model == "mlp" || s.model == "cnn", "--model must be mlp or cnn, got '", s.model, "'");
  const bool summary = args.on("summary");
  s.optimizer = args.str("optimizer");
  AMP_REQUIRE(s.optimizer == "sgd" || s.optimizer == "adam" || s.optimizer == "adamw", "--optimizer must be sgd, adam "
              "or adamw, got '", s.optimizer, "'");
  s.lr = static_cast<float>(args.real("lr", 0.0, 10.0, true));
  s.schedule = args.str("schedule");
  AMP_REQUIRE(s.schedule == "constant" || s.schedule == "cosine", "--schedule must be constant or cosine, got '",
              s.schedule, "'");
  s.momentum = static_cast<float>(args.real("momentum", 0.0, 1.0));
  s.batch = args.integer("batch-size", 1, 1 << 20);
  s.epochs = static_cast<int>(args.integer("epochs", 1, 100000));
  s.seed = static_cast<std::uint64_t>(args.integer("seed", 0, std::numeric_limits<long long>::max()));
  s.train_subset = args.integer("train-subset", 0, std::numeric_limits<std::int32_t>::max());
  s.threads = static_cast<int>(args.integer("threads", 0, 4096));
  s.threads = dist.threads(s.threads);  // distributed: the cores, shared out
  s.data = args.str("data");
  s.tty = isatty(fileno(stdout)) != 0;
  s.graph = args.on("graph");
  s.zero = args.integer("zero", 0, 1) == 1;
  AMP_REQUIRE(!s.zero || args.on("distributed"), "--zero 1 shards over the ranks of --distributed yes");
  const auto levels = examples::parse_levels(args.str("opt-level"));
  s.save = args.str("save"), s.resume = args.str("resume"), s.export_to = args.str("export");
  s.import_from = args.str("import");
  for (const char* flag : {"save", "resume", "export", "import"})
    AMP_REQUIRE(args.str(flag).empty() || levels.size() == 1, "--", flag, " needs a single --opt-level, not '",
                args.str("opt-level"), "'");
  AMP_REQUIRE(s.resume.empty() || s.import_from.empty(), "--resume and --import both set the weights: choose one");
  for (const auto& [flag, path] : {std::pair{"--resume", s.resume}, std::pair{"--import", s.import_from}})
    AMP_REQUIRE(path.empty() || std::ifstream(path).good(), flag, " '", path, "' cannot be read");
  for (const auto& [flag, path] : {std::pair{"--save", s.save}, std::pair{"--export", s.export_to}})
    if (!path.empty()) amp::io::check_writable(path, flag);
  const bool gpu = examples::use_gpu(args.str("device"));
  examples::Outputs outputs;  // refused now, not after hours of training; rank 0 writes them
  for (const char* flag : {"json", "csv", "predictions"})
    if (dist.leader()) outputs.add(std::string("--") + flag, args.str(flag));

  const auto train_set = first(amp::data::read_idx_pair(data_file(s.data, "train-images-idx3-ubyte"),
                                                        data_file(s.data, "train-labels-idx1-ubyte"), kClasses),
                               s.train_subset);
  const auto test_set = amp::data::read_idx_pair(data_file(s.data, "t10k-images-idx3-ubyte"),
                                                 data_file(s.data, "t10k-labels-idx1-ubyte"), kClasses);
  AMP_REQUIRE(train_set.rows == 28 && train_set.cols == 28, "the training images are ", train_set.rows, "x",
              train_set.cols, ", expected 28x28");
  AMP_REQUIRE(test_set.rows == 28 && test_set.cols == 28, "the test images are ", test_set.rows, "x", test_set.cols,
              ", expected 28x28 like the training images");
  std::tie(s.mean, s.stddev) = amp::data::pixel_statistics(train_set);

  std::string device, details;
  std::vector<LevelResult> results;
  if (dist.leader())
    std::printf("fashion_mnist: %s, %lld train / %lld test, %s lr %g, batch %lld, %d epochs%s\n", s.model.c_str(),
                static_cast<long long>(train_set.count), static_cast<long long>(test_set.count), s.optimizer.c_str(),
                s.lr, static_cast<long long>(s.batch), s.epochs,
                dist.ranks > 1 ? (", " + std::to_string(dist.ranks) + " ranks x batch " + std::to_string(s.batch) +
                                  " = global batch " + std::to_string(dist.ranks * s.batch) + ", " +
                                  std::to_string(std::max(s.threads, 1)) + " threads per rank")
                                     .c_str()
                               : "");
  if (dist.leader() && s.schedule == "cosine")
    std::printf("  learning rate: cosine from %g to 0 over the %d epochs, per step\n", s.lr, s.epochs);
  auto write_outputs = [&](bool complete) {
    outputs.write([&](const std::string& flag) {
                    if (flag == "--json") return to_json(s, device, details, train_set.count, results, complete);
                    return flag == "--csv" ? to_csv(results) : to_predictions(results);
                  },
                  /*quiet=*/!complete);
  };
  for (const auto& level : levels) {
    examples::with_policy(level, [&]<amp::Policy P>() {
      // A fresh context per level, so that peak memory is that level's own.
      examples::with_context(gpu, s.threads, [&]<amp::Backend B>(amp::Context<B>& ctx) {
        device = examples::device_label(ctx);
        details = examples::device_details(ctx);
        LevelResult r = run_rank<P>(ctx, train_set, test_set, s);
        if (r.finished) results.push_back(std::move(r));
      });
    });
    if (examples::interrupted()) break;
    if (&level != &levels.back()) write_outputs(false);  // a finished level is kept, whatever happens next
  }
  if (!results.empty() && dist.leader()) print_tables(device + (dist.ranks > 1 ? ", rank 0 of " + std::to_string(dist.ranks) : ""), results);
  if (summary && dist.leader()) print_parameters(results);
  if (examples::interrupted()) {
    if (!results.empty()) write_outputs(false);
    std::printf("interrupted: kept the %zu finished level(s)%s\n", results.size(),
                outputs.wants("--json") ? " (the JSON says \"complete\": false)" : "");
    examples::exit_by_signal();
  }
  write_outputs(true);
  return 0;
} catch (const std::exception& e) {
  if (dist.ranks > 1) std::fprintf(stderr, "fashion_mnist (rank %d of %d): %s\n", dist.rank, dist.ranks, e.what());
  else std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
  dist.abort_job();  // the other ranks stop too, instead of waiting for this one
  return 2;
}
