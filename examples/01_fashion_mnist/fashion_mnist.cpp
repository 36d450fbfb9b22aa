// 01_fashion_mnist: the main job. An MLP 784-256-128-10 (ReLU, softmax
// cross-entropy) trained on the real Fashion-MNIST at each opt level, with test
// accuracy, speed and memory by category side by side, and a JSON summary and a
// per-step CSV that scripts/plot.py draws.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <amp/amp.hpp>
#include <amp/data/idx.hpp>
#include <amp/data/loader.hpp>
#include <amp/io/atomic_file.hpp>

#include "common/args.hpp"
#include "common/levels.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr float kMean = 0.2860f, kStd = 0.3530f;  // Fashion-MNIST pixel statistics

struct Settings {
  std::string optimizer;
  float lr;
  std::int64_t batch;
  int epochs;
  std::uint64_t seed;
  bool tty;
};

struct StepLog {
  int epoch;
  std::int64_t step;
  float loss, scale;
  int skipped;
};

struct LevelResult {
  std::string level;
  double accuracy = 0, epoch_seconds = 0, samples_per_second = 0;
  std::size_t peak[static_cast<int>(amp::memory_kind::count)] = {};
  std::size_t peak_total = 0;
  long long skipped = 0, allocations_in_loop = 0;
  float final_scale = 0;
  std::vector<StepLog> log;
};

// Per-step record kept on the device, downloaded once per epoch.
struct StepRecord {
  float loss, scale;
  long long skipped;
};
struct RecordStepOp {
  StepRecord* out;
  const amp::nn::LossValue* loss;
  const amp::ScalerState* scaler;
  AMP_HOST_DEVICE void operator()(std::size_t) const { *out = {loss->value, scaler->scale, scaler->skipped}; }
};

template <amp::Policy P, amp::Backend B, class Opt>
LevelResult train(amp::Context<B>& ctx, const amp::data::LabelledImages& train_set,
                  const amp::data::LabelledImages& test_set, const Settings& s) {
  using T = typename P::activation_type;
  namespace nn = amp::nn;
  nn::Sequential<P, B, nn::Linear, nn::Linear, nn::Linear> model(
      ctx, {.max_batch = s.batch, .seed = s.seed}, {.in_features = 784, .out_features = 256, .act = amp::activation::relu},
      {.in_features = 256, .out_features = 128, .act = amp::activation::relu}, {.in_features = 128, .out_features = 10});
  Opt opt = [&] {
    if constexpr (std::is_same_v<Opt, amp::optim::SGD<P, B>>)
      return Opt(model.parameters(), {.lr = s.lr, .momentum = 0.9f});
    else
      return Opt(model.parameters(), {.lr = s.lr});
  }();
  amp::data::Loader<T, B> train_data(ctx, train_set, {.batch_size = s.batch, .seed = s.seed, .mean = kMean, .stddev = kStd});
  amp::data::Loader<T, B> test_data(ctx, test_set, {.batch_size = s.batch, .shuffle = false, .mean = kMean, .stddev = kStd});
  amp::Buffer<StepRecord, B> records(ctx, static_cast<std::size_t>(train_data.batches()), amp::memory_kind::workspace);

  LevelResult r;
  r.level = std::string(amp::policy_name<P>());
  std::vector<double> epoch_times;
  std::size_t allocations_after_first_step = 0;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    ctx.synchronize();
    const auto start = Clock::now();
    train_data.start_epoch();
    for (std::int64_t b = 0; b < train_data.batches(); ++b) {
      const auto batch = train_data.batch(b);
      auto loss = nn::cross_entropy(ctx, model.forward(ctx, batch.x), batch.labels);
      opt.zero_grad();
      {
        auto scaled = amp::scale_loss(loss, opt);
        scaled.backward();
      }
      opt.step();
      amp::for_each(ctx, 1, RecordStepOp{records.data() + b, loss.value_ptr(), opt.scaler().state()});
      if (epoch == 0 && b == 0) allocations_after_first_step = ctx.memory().allocations();
      if (s.tty && (b % 25 == 0 || b + 1 == train_data.batches())) {
        const StepRecord rec = amp::download_one(ctx, static_cast<const StepRecord*>(records.data() + b));
        const double secs = std::chrono::duration<double>(Clock::now() - start).count();
        const int filled = static_cast<int>(30 * (b + 1) / train_data.batches());
        std::printf("\r  %-8s epoch %2d/%d [%s%s] %4lld/%lld  %8.0f samples/s  loss %.4f  scale %g   ",
                    r.level.c_str(), epoch + 1, s.epochs, std::string(filled, '#').c_str(),
                    std::string(30 - filled, '.').c_str(), static_cast<long long>(b + 1),
                    static_cast<long long>(train_data.batches()), (b + 1) * s.batch / std::max(secs, 1e-9), rec.loss,
                    rec.scale);
        std::fflush(stdout);
      }
    }
    ctx.synchronize();
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    epoch_times.push_back(secs);
    const auto recs = amp::download(ctx, amp::Span<const StepRecord>(records.span()));
    for (std::size_t i = 0; i < recs.size(); ++i) {
      const long long before = i ? recs[i - 1].skipped : r.skipped;
      r.log.push_back({epoch, static_cast<std::int64_t>(r.log.size()), recs[i].loss, recs[i].scale,
                       static_cast<int>(recs[i].skipped - before)});
    }
    r.skipped = recs.back().skipped;
    double mean_loss = 0;
    for (const auto& rec : recs) mean_loss += rec.loss;
    mean_loss /= static_cast<double>(recs.size());
    if (s.tty) std::printf("\r");
    std::printf("  %-8s epoch %2d/%d  %.2f s  %8.0f samples/s  mean loss %.4f  scale %g  skipped %lld%s\n",
                r.level.c_str(), epoch + 1, s.epochs, secs, train_data.size() / secs, mean_loss, recs.back().scale,
                r.skipped, s.tty ? "                    " : "");
    std::fflush(stdout);
  }
  r.allocations_in_loop = static_cast<long long>(ctx.memory().allocations() - allocations_after_first_step);

  // Test accuracy: argmax of the logits, on the host.
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < test_data.batches(); ++b) {
    const auto batch = test_data.batch(b);
    const auto out = model.forward(ctx, batch.x);
    const auto logits = amp::download(ctx, out.value.span());
    const auto labels = amp::download(ctx, batch.labels);
    for (std::int64_t row = 0; row < out.rows(); ++row) {
      int best = 0;
      for (int c = 1; c < 10; ++c)
        if (amp::cast<float>(logits[row * 10 + c]) > amp::cast<float>(logits[row * 10 + best])) best = c;
      correct += best == labels[static_cast<std::size_t>(row)];
    }
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(test_data.size());
  std::sort(epoch_times.begin(), epoch_times.end());
  r.epoch_seconds = epoch_times[epoch_times.size() / 2];
  r.samples_per_second = static_cast<double>(train_data.size()) / r.epoch_seconds;
  for (int k = 0; k < static_cast<int>(amp::memory_kind::count); ++k)
    r.peak[k] = ctx.memory().peak(static_cast<amp::memory_kind>(k));
  r.peak_total = ctx.memory().peak_total();
  r.final_scale = r.log.back().scale;
  return r;
}

template <amp::Policy P, amp::Backend B>
LevelResult run_level(amp::Context<B>& ctx, const amp::data::LabelledImages& tr, const amp::data::LabelledImages& te,
                      const Settings& s) {
  if (s.optimizer == "sgd") return train<P, B, amp::optim::SGD<P, B>>(ctx, tr, te, s);
  if (s.optimizer == "adam") return train<P, B, amp::optim::Adam<P, B>>(ctx, tr, te, s);
  if (s.optimizer == "adamw") return train<P, B, amp::optim::AdamW<P, B>>(ctx, tr, te, s);
  amp::fail("unknown --optimizer '", s.optimizer, "' (expected sgd|adam|adamw)");
}

std::string data_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::ifstream(candidate).good()) return candidate;
  amp::fail("data set file '", dir, "/", name, "[.gz]' not found (install Debian's dataset-fashion-mnist, "
            "or point --data at a folder with the IDX files)");
}

// The first n samples (n <= 0: all).
amp::data::LabelledImages first(amp::data::LabelledImages set, std::int64_t n) {
  if (n <= 0 || n >= set.count) return set;
  set.count = n;
  set.pixels.resize(static_cast<std::size_t>(n * set.rows * set.cols));
  set.labels.resize(static_cast<std::size_t>(n));
  return set;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / 1048576.0);
  return buf;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("fashion_mnist",
                      "MLP 784-256-128-10 on Fashion-MNIST at each opt level: accuracy, speed and memory side by side.");
  args.flag("data", "/usr/share/datasets/fashion-mnist", "folder with the IDX files (gzip or raw; MNIST works too)")
      .flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|all")
      .flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)")
      .flag("optimizer", "sgd", "sgd (momentum 0.9)|adam|adamw")
      .flag("lr", "0.05", "learning rate")
      .flag("batch-size", "128", "mini-batch size (the last partial batch is kept)")
      .flag("epochs", "10", "training epochs")
      .flag("seed", "1", "seed of the initialisation and the shuffling")
      .flag("train-subset", "0", "train on the first N images only (0: all 60000)")
      .flag("json", "", "write the summary as JSON to this file")
      .flag("csv", "", "write every step (level, epoch, step, loss, loss scale, skipped) to this CSV file");
  if (!args.parse(argc, argv)) return 0;
  const Settings s{args.str("optimizer"), args.real("lr"), args.integer("batch-size"),
                   static_cast<int>(args.integer("epochs")), static_cast<std::uint64_t>(args.integer("seed")),
                   isatty(fileno(stdout)) != 0};
  AMP_REQUIRE(s.epochs > 0 && s.batch > 0 && s.lr > 0, "--epochs, --batch-size and --lr must be positive");
  const auto levels = examples::parse_levels(args.str("opt-level"));
  const std::string dir = args.str("data");
  const auto train_set = first(amp::data::read_idx_pair(data_file(dir, "train-images-idx3-ubyte"),
                                                        data_file(dir, "train-labels-idx1-ubyte"), 10),
                               args.integer("train-subset"));
  const auto test_set = amp::data::read_idx_pair(data_file(dir, "t10k-images-idx3-ubyte"),
                                                 data_file(dir, "t10k-labels-idx1-ubyte"), 10);
  AMP_REQUIRE(train_set.rows * train_set.cols == 784 && test_set.rows * test_set.cols == 784,
              "expected 28x28 images, got ", train_set.rows, "x", train_set.cols);

  const bool gpu = examples::use_gpu(args.str("device"));
  std::string device;
  std::vector<LevelResult> results;
  std::printf("fashion_mnist: %lld train / %lld test images, %s lr %g, batch %lld, %d epochs\n",
              static_cast<long long>(train_set.count), static_cast<long long>(test_set.count), s.optimizer.c_str(),
              s.lr, static_cast<long long>(s.batch), s.epochs);
  for (const auto& level : levels) {
    examples::with_policy(level, [&]<amp::Policy P>() {
      // A fresh context per level, so that peak memory is that level's own.
      examples::with_context(gpu, [&]<amp::Backend B>(amp::Context<B>& ctx) {
        device = examples::device_label(ctx);
        results.push_back(run_level<P>(ctx, train_set, test_set, s));
      });
    });
  }

  using amp::memory_kind;
  auto peak = [](const LevelResult& r, memory_kind k) { return r.peak[static_cast<int>(k)]; };
  std::printf("\nresults on %s (memory: peak MiB by category)\n", device.c_str());
  std::printf("%-8s %9s %9s %10s %8s %8s %8s %8s %8s %9s %8s %8s %12s\n", "level", "test acc", "epoch [s]",
              "samples/s", "weights", "master", "grads", "optim", "activ", "workspace", "total", "skipped", "final scale");
  for (const auto& r : results)
    std::printf("%-8s %9.4f %9.3f %10.0f %8s %8s %8s %8s %8s %9s %8s %8lld %12g\n", r.level.c_str(), r.accuracy,
                r.epoch_seconds, r.samples_per_second, mib(peak(r, memory_kind::weights)).c_str(),
                mib(peak(r, memory_kind::master)).c_str(), mib(peak(r, memory_kind::grads)).c_str(),
                mib(peak(r, memory_kind::optimizer)).c_str(), mib(peak(r, memory_kind::activations)).c_str(),
                mib(peak(r, memory_kind::workspace)).c_str(), mib(r.peak_total).c_str(), r.skipped, r.final_scale);
  const auto o0 = std::find_if(results.begin(), results.end(), [](const auto& r) { return r.level == "O0"; });
  if (o0 != results.end()) {
    std::printf("\nrelative to O0: (weights + activations) ratio, speed-up, accuracy difference\n");
    for (const auto& r : results) {
      const double wa = double(peak(r, memory_kind::weights) + peak(r, memory_kind::activations)) /
                        double(peak(*o0, memory_kind::weights) + peak(*o0, memory_kind::activations));
      std::printf("  %-8s %.3fx memory  %.2fx speed  %+.2f pp\n", r.level.c_str(), wa,
                  o0->epoch_seconds / r.epoch_seconds, 100 * (r.accuracy - o0->accuracy));
    }
  }
  for (const auto& r : results)
    if (r.allocations_in_loop != 0)
      std::printf("warning: %s allocated %lld times inside the training loop\n", r.level.c_str(), r.allocations_in_loop);

  if (!args.str("json").empty()) {
    std::ostringstream j;
    j.precision(9);
    j << "{\"device\": \"" << device << "\", \"levels\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      j << (i ? ", " : "") << "{\"opt_level\": \"" << r.level << "\", \"test_accuracy\": " << r.accuracy
        << ", \"epoch_seconds\": " << r.epoch_seconds << ", \"samples_per_second\": " << r.samples_per_second
        << ", \"peak_bytes\": {";
      for (int k = 0; k < static_cast<int>(memory_kind::count); ++k)
        j << "\"" << amp::memory_kind_names[k] << "\": " << r.peak[k] << ", ";
      j << "\"total\": " << r.peak_total << "}, \"skipped_steps\": " << r.skipped
        << ", \"final_loss_scale\": " << r.final_scale << ", \"allocations_in_loop\": " << r.allocations_in_loop << "}";
    }
    j << "]}\n";
    amp::io::write_file_atomically(args.str("json"), j.str());
    std::printf("wrote %s\n", args.str("json").c_str());
  }
  if (!args.str("csv").empty()) {
    std::ostringstream c;
    c << "level,epoch,step,loss,loss_scale,skipped\n";
    for (const auto& r : results)
      for (const auto& l : r.log) c << r.level << "," << l.epoch << "," << l.step << "," << l.loss << "," << l.scale << "," << l.skipped << "\n";
    amp::io::write_file_atomically(args.str("csv"), c.str());
    std::printf("wrote %s\n", args.str("csv").c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
  return 2;
}
