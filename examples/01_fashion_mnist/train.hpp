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
#include "01_fashion_mnist/resume.hpp"
#include "common/accuracy.hpp"
#include "common/context.hpp"
#include "common/distributed.hpp"
#include "common/numerics.hpp"
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
Mlp<P, B> make_mlp(amp::Context<B>& ctx, std::int64_t batch, std::uint64_t seed, amp::nn::Shard shard = {},
                   int numerics = 0) {
  using amp::activation;
  return Mlp<P, B>(ctx, {.max_batch = batch, .seed = seed, .shard = shard, .numerics_every = numerics}, {.in_features = 784, .out_features = 256, .act = activation::relu},
                   {.in_features = 256, .out_features = 128, .act = activation::relu},
                   {.in_features = 128, .out_features = classes});
}

// sync: SyncBatchNorm's communicator (nullptr: BatchNorm over this process's batch);
// shard: this rank's ZeRO-1 shard (--zero 1).
template <amp::Policy P, amp::Backend B>
Cnn<P, B> make_cnn(amp::Context<B>& ctx, std::int64_t batch, std::uint64_t seed, amp::Collective<B>* sync = nullptr,
                   amp::nn::Shard shard = {}, int numerics = 0) {
  using amp::activation;
  constexpr auto torch_init = amp::nn::initializer::torch_default;  // the PyTorch recipe starts as PyTorch does
  return Cnn<P, B>(ctx, {.max_batch = batch, .seed = seed, .inputs = {{amp::Shape{28, 28, 1}}}, .shard = shard,
                         .numerics_every = numerics},
                   {.in_channels = 1, .out_channels = 32, .kernel = 3, .padding = 1, .init = torch_init},
                   {.features = 32, .sync = sync}, {}, {.kernel = 2},
                   {.in_channels = 32, .out_channels = 64, .kernel = 3, .padding = 1, .init = torch_init},
                   {.features = 64, .sync = sync}, {}, {.kernel = 2}, {},
                   {.in_features = 3136, .out_features = 128, .act = activation::relu, .init = torch_init},
                   {.in_features = 128, .out_features = classes, .init = torch_init});
}

using examples::StepFigures;

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

// An epoch's step records into the result's logs, its test accuracy, and its line on the console.
template <amp::Backend B, class Model, class Loader>
void close_epoch(amp::Context<B>& ctx, Model& model, Loader& test_data, const Settings& s, int epoch, double secs,
                 std::int64_t samples, const std::vector<StepFigures>& recs, LevelResult& r) {
  double loss_sum = 0;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const long long before = i ? recs[i - 1].skipped : r.skipped;
    r.steps.push_back({epoch, recs[i].loss, recs[i].scale, static_cast<int>(recs[i].skipped - before)});
    loss_sum += recs[i].loss;
  }
  const EpochLog e{epoch, secs, loss_sum / static_cast<double>(recs.size()),
                   examples::accuracy(ctx, model, test_data, &r.predictions), recs.back().skipped - r.skipped,
                   recs.back().skipped, recs.back().scale};
  auto& report = model.parameters().numerics();
  if (report.on()) {
    if (dist.leader())
      examples::log_skips(r.level, report.step() - static_cast<long long>(recs.size()), recs, r.skipped,
                          model.parameters().table());
    const auto rows = report.take();
    r.numerics.insert(r.numerics.end(), rows.begin(), rows.end());
  }
  r.epochs.push_back(e);
  r.skipped = e.skipped_total;
  if (dist.leader())
    std::printf("%s  %-7s %2d/%-2d %6.2f s %7.0f/s loss %.4f acc %.4f skipped %lld (total %lld)%s\n", s.tty ? "\r" : "",
                r.level.c_str(), epoch, s.epochs, secs, samples / secs, e.train_loss, e.test_accuracy, e.skipped,
                e.skipped_total, s.tty ? "   " : "");
  std::fflush(stdout);
}

// The optimizer the flags ask for, on the model's parameters.
template <class Opt, class Model>
Opt make_optimizer(Model& model, const Settings& s) {
  if constexpr (std::is_same_v<Opt, amp::optim::SGD<typename Opt::policy, typename Opt::backend>>)
    return Opt(model.parameters(), {.lr = s.lr, .momentum = s.momentum});
  else
    return Opt(model.parameters(), {.lr = s.lr});
}

template <amp::Policy P, amp::Backend B, class Opt, class Model>
LevelResult train(amp::Context<B>& ctx, Model& model, const amp::data::LabelledImages& train_set,
                  const amp::data::LabelledImages& test_set, const Settings& s, amp::Collective<B>* comm) {
  namespace nn = amp::nn;
  Opt opt = make_optimizer<Opt>(model, s);
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
  auto& report = model.parameters().numerics();
  if (!s.import_from.empty()) amp::io::import_safetensors(s.import_from, model.parameters());
  int done = 0;  // epochs finished before this run (--resume)
  if (!s.resume.empty()) {
    std::vector<std::int64_t> order;
    std::string rng;
    done = restore_run(s, amp::io::load(s.resume, model, opt), r, train_data.size(), order, rng);
    train_data.set_state({order, rng});
    AMP_REQUIRE(done < s.epochs, "--resume '", s.resume, "' has finished ", done, " epochs already; ask for more with --epochs");
    std::printf("  %-7s resumed from %s after epoch %d\n", r.level.c_str(), s.resume.c_str(), done);
    report.set_step(done * train_data.batches());
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
    const long long epoch_first_step = report.step();
    for (std::int64_t b = 0; b < train_data.batches(); ++b) {
      if (examples::interrupted()) return r;  // not finished: the caller keeps only finished levels
      // A run that diverges (an amp::Error) still logs its skipped steps, with their tensors.
      examples::SkipLogOnError skip_log(report.on() && dist.leader(), [&] {
        examples::log_skips(r.level, epoch_first_step, records.download(ctx, static_cast<std::size_t>(b)), r.skipped,
                            model.parameters().table());
      });
      loop.step(ctx, [&] {
        const auto batch = train_data.batch(b);
        auto step = [&, x = batch.x, labels = batch.labels] {
          auto loss = nn::cross_entropy(ctx, model.forward(ctx, x), labels);
          opt.zero_grad();
          amp::scale_loss(loss, opt).backward();
          opt.step();
          records.record(ctx, loss, opt, report.on() ? report.first_nonfinite() : nullptr);
        };
        // --numerics: reported steps run eagerly (a replay records what its capture did).
        if (!s.graph || batch.x.shape[0] != s.batch || report.due()) step();
        else if (graph) graph->replay();
        else graph.emplace(ctx, step);  // this batch's eager step, then the capture
      });
      if (s.tty && dist.leader() && (b % 25 == 0 || b + 1 == train_data.batches()))
        if (const StepFigures* rec = records.newest(ctx))
          progress(s, r.level, epoch, b, train_data.batches(),
                   std::chrono::duration<double>(Clock::now() - start).count(), rec->loss, rec->scale);
    }
    ctx.synchronize();
    epoch_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    close_epoch(ctx, model, test_data, s, epoch, epoch_times.back(), train_data.size(),
                records.download(ctx, static_cast<std::size_t>(train_data.batches())), r);
    if (!s.save.empty() && (dist.leader() || s.zero)) amp::io::save(s.save, model, opt, run_state(s, r, train_data));
  }
  if (!s.export_to.empty() && (dist.leader() || s.zero)) amp::io::export_safetensors(s.export_to, model.parameters());
  examples::report_run(r, loop, graph, ctx, model.parameters());
  r.accuracy = r.epochs.back().test_accuracy;
  std::sort(epoch_times.begin(), epoch_times.end());
  r.epoch_seconds = epoch_times[epoch_times.size() / 2];
  r.step_ms = 1e3 * r.epoch_seconds / static_cast<double>(train_data.batches());
  r.samples_per_second = static_cast<double>(train_data.size()) / r.epoch_seconds;
  r.final_scale = r.epochs.back().scale;
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
    auto model = make_cnn<P>(ctx, s.batch, s.seed, comm, shard, s.numerics);  // SyncBatchNorm when distributed
    return run_model<P>(ctx, model, tr, te, s, comm);
  }
  auto model = make_mlp<P>(ctx, s.batch, s.seed, shard, s.numerics);
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
