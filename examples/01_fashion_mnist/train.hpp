#pragma once
// fashion_mnist's training of one opt level: the models, the loop, checkpoints
// and safetensors. Included by the generated translation unit of each level and
// backend, which instantiates Level<P, B> (examples/CMakeLists.txt).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include <amp/amp.hpp>
#include <amp/data/loader.hpp>
#include <amp/io/checkpoint.hpp>
#include <amp/io/safetensors.hpp>

#include "01_fashion_mnist/job.hpp"
#include "common/context.hpp"
#include "common/distributed.hpp"
#include "common/fp8_summary.hpp"
#include "common/record.hpp"
#include "common/run.hpp"

namespace fashion_mnist {

using Clock = std::chrono::steady_clock;
using examples::dist;

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
                   {.in_features = 128, .out_features = classes});
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
                   {.in_features = 128, .out_features = classes, .init = torch_init});
}

// What a resumed run must agree on with the run that saved (the level may differ: a policy conversion).
inline std::string resume_key(const Settings& s, std::int64_t train_images) {
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
inline int restore_run(const Settings& s, const amp::io::Archive& a, LevelResult& r, std::int64_t train_images,
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
      for (std::int64_t c = 1; c < classes; ++c)
        if (amp::cast<float>(logits[row * classes + c]) > amp::cast<float>(logits[row * classes + best])) best = c;
      correct += best == labels[static_cast<std::size_t>(row)];
      if (predictions) predictions->push_back(static_cast<std::int32_t>(best));
    }
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test_data.size());
}

inline void progress(const Settings& s, const std::string& level, int epoch, std::int64_t b, std::int64_t batches,
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

template <amp::Policy P, amp::Backend B>
LevelResult Level<P, B>::run(const Job& job) {
  // A fresh context per level, so that peak memory is that level's own.
  return examples::with_context<B>(job.settings.threads, [&](amp::Context<B>& ctx) {
    LevelResult r = examples::with_collective(
        ctx, [&](amp::Collective<B>* comm) { return run_level<P>(ctx, job.train, job.test, job.settings, comm); });
    r.device = examples::device_label(ctx);
    r.device_details = examples::device_details(ctx);
    return r;
  });
}

}  // namespace fashion_mnist
