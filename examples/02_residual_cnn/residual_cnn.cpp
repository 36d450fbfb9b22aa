// 02_residual_cnn: the composition API. A small residual network written as a
// net struct (a stem, two residual blocks whose input is read twice, global
// average pooling, a classifier), trained on Fashion-MNIST at each opt level.
// It checks itself: every level must learn (accuracy over a bar) and stay
// within a few points of O0.
#include <cstdio>
#include <fstream>

#include <amp/amp.hpp>
#include <amp/data/idx.hpp>
#include <amp/data/loader.hpp>

#include "common/args.hpp"
#include "common/device.hpp"
#include "common/record.hpp"

namespace {

namespace nn = amp::nn;

// conv-BN-relu-conv-BN, plus the input, then relu: y = relu(F(x) + x).
template <class P, class B>
struct ResidualBlock {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> conv1, conv2;
  nn::BatchNorm2d<P, B> bn1, bn2;

  ResidualBlock(nn::Builder<P, B> b, std::int64_t channels)
      : conv1(b.child("conv1"), {.in_channels = channels, .out_channels = channels, .padding = 1, .bias = false}),
        conv2(b.child("conv2"), {.in_channels = channels, .out_channels = channels, .padding = 1, .bias = false}),
        bn1(b.child("bn1"), {.features = channels}),
        bn2(b.child("bn2"), {.features = channels}) {}

  nn::Var<T> operator()(nn::Graph<P, B>& g, nn::Var<T> x) const {
    const nn::Var<T> h = bn2(g, conv2(g, nn::relu(g, bn1(g, conv1(g, x)))));
    return nn::relu(g, nn::add(g, h, x));  // x is read twice: its gradient is the sum of both paths
  }
};

template <class P, class B>
struct ResNet {
  using T = typename P::activation_type;
  nn::Conv2d<P, B> stem;
  nn::MaxPool2d<P, B> pool;
  ResidualBlock<P, B> block1, block2;
  nn::GlobalAvgPool<P, B> gap;
  nn::Linear<P, B> fc;

  explicit ResNet(nn::Builder<P, B> b)
      : stem(b.child("stem"), {.in_channels = 1, .out_channels = 16, .padding = 1, .act = amp::activation::relu}),
        pool(b.child("pool"), {.kernel = 2}),
        block1(b.child("block1"), 16),
        block2(b.child("block2"), 16),
        gap(b.child("gap"), {}),
        fc(b.child("fc"), {.in_features = 16, .out_features = 10}) {}

  std::vector<nn::Input> default_inputs() const { return {{amp::Shape{28, 28, 1}}}; }
  nn::Var<T> forward(nn::Graph<P, B>& g, nn::Var<T> x) {
    return fc(g, gap(g, block2(g, block1(g, pool(g, stem(g, x))))));
  }
};

struct Result {
  std::string level;
  double accuracy = 0;
  long long skipped = 0;
  long long host_work = 0;  // host syncs, allocations and pageable copies after the first step (must be 0)
};

template <amp::Policy P, amp::Backend B>
Result train(amp::Context<B>& ctx, const amp::data::LabelledImages& tr, const amp::data::LabelledImages& te,
             int epochs) {
  nn::Model<P, B, ResNet<P, B>> model(ctx, {.max_batch = 64, .seed = 1});
  amp::optim::SGD<P, B> opt(model.parameters(), {.lr = 0.05f, .momentum = 0.9f});
  const auto [mean, stddev] = amp::data::pixel_statistics(tr);
  const typename amp::data::Loader<float, B>::Options options{.batch_size = 64, .seed = 1, .mean = mean, .stddev = stddev,
                                                     .layout = amp::data::Layout::image};
  amp::data::Loader<float, B> train_data(ctx, tr, options);
  auto test_options = options;
  test_options.shuffle = false;
  amp::data::Loader<float, B> test_data(ctx, te, test_options);
  examples::LoopCounters loop;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    train_data.start_epoch();
    for (std::int64_t b = 0; b < train_data.batches(); ++b)
      loop.step(ctx, [&] {
        const auto batch = train_data.batch(b);
        auto loss = nn::cross_entropy(ctx, model.forward(ctx, batch.x), batch.labels);
        opt.zero_grad();
        {
          auto scaled = amp::scale_loss(loss, opt);
          scaled.backward();
        }
        opt.step();
      });
  }
  model.eval();
  std::int64_t correct = 0;
  for (std::int64_t b = 0; b < test_data.batches(); ++b) {
    const auto batch = test_data.batch(b);
    const auto out = model.forward(ctx, batch.x);
    const auto logits = amp::download(ctx, out.value().span());
    const auto labels = amp::download(ctx, batch.labels);
    for (std::int64_t r = 0; r < out.rows(); ++r) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < 10; ++c)
        if (amp::cast<float>(logits[r * 10 + c]) > amp::cast<float>(logits[r * 10 + best])) best = c;
      correct += best == labels[static_cast<std::size_t>(r)];
    }
  }
  return {std::string(amp::policy_name<P>()), static_cast<double>(correct) / static_cast<double>(test_data.size()),
          opt.scaler().stats().skipped, loop.syncs() + loop.allocations() + loop.pageable_copies()};
}

std::string data_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {dir + "/" + name + ".gz", dir + "/" + name})
    if (std::ifstream(candidate).good()) return candidate;
  amp::fail("data set file '", dir, "/", name, "[.gz]' not found (install Debian's dataset-fashion-mnist)");
}

amp::data::LabelledImages first(amp::data::LabelledImages set, std::int64_t n) {
  if (n == 0 || n >= set.count) return set;
  set.count = n;
  set.pixels.resize(static_cast<std::size_t>(n * set.rows * set.cols));
  set.labels.resize(static_cast<std::size_t>(n));
  return set;
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("residual_cnn", "A residual CNN written with amp's composition API, at each opt level.");
  args.flag("data", "/usr/share/datasets/fashion-mnist", "folder with the Fashion-MNIST IDX files", "DIR")
      .flag("opt-level", "all", "O0|O1|O2|O3|O1-bf16|O2-bf16|O2-fp8|all (O0 always runs: it is the reference)", "LEVEL")
      .flag("device", "auto", "auto|cpu|cuda", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores)", "N")
      .flag("epochs", "2", "training epochs", "N")
      .flag("train-subset", "20000", "train on the first N images (0: all)", "N")
      .flag("test-subset", "2000", "test on the first N images (0: all)", "N")
      .flag("min-accuracy", "0.75", "the bar every level must reach", "X")
      .flag("max-gap", "0.03", "how far below O0's accuracy a level may end", "X");
  if (!args.parse(argc, argv)) return 0;
  auto levels = examples::parse_levels(args.str("opt-level"));
  if (std::find(levels.begin(), levels.end(), "O0") == levels.end()) levels.insert(levels.begin(), "O0");
  const int epochs = static_cast<int>(args.integer("epochs", 1, 1000));
  const double bar = args.real("min-accuracy", 0.0, 1.0), gap = args.real("max-gap", 0.0, 1.0);
  const bool gpu = examples::use_gpu(args.str("device"));
  const std::string dir = args.str("data");
  const auto tr = first(amp::data::read_idx_pair(data_file(dir, "train-images-idx3-ubyte"),
                                                 data_file(dir, "train-labels-idx1-ubyte"), 10),
                        args.integer("train-subset", 0, 1 << 30));
  const auto te = first(amp::data::read_idx_pair(data_file(dir, "t10k-images-idx3-ubyte"),
                                                 data_file(dir, "t10k-labels-idx1-ubyte"), 10),
                        args.integer("test-subset", 0, 1 << 30));
  bool ok = true;
  double reference = 0;
  examples::with_context(gpu, static_cast<int>(args.integer("threads", 0, 4096)), [&]<amp::Backend B>(amp::Context<B>& ctx) {
    std::printf("residual_cnn on %s: %lld train / %lld test images, %d epoch(s)\n", examples::device_label(ctx).c_str(),
                static_cast<long long>(tr.count), static_cast<long long>(te.count), epochs);
    for (const auto& level : levels)
      examples::with_policy(level, [&]<amp::Policy P>() {
        const Result r = train<P>(ctx, tr, te, epochs);
        if (r.level == "O0") reference = r.accuracy;
        const bool good = r.accuracy >= bar && r.accuracy >= reference - gap && r.host_work == 0;
        ok = ok && good;
        std::printf("  %-8s test accuracy %.4f  skipped %lld  host work after the first step %lld  %s\n",
                    r.level.c_str(), r.accuracy, r.skipped, r.host_work,
                    good ? "ok" : "FAILED (under the bar, too far below O0, or host work in the loop)");
        std::fflush(stdout);
      });
  });
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "residual_cnn: %s\n", e.what());
  return 2;
}
