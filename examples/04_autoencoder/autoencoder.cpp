// 04_autoencoder: a convolutional autoencoder on Fashion-MNIST, as a newcomer
// writes one: data, model, AdamW with a cosine schedule, gradient clipping, a
// checkpoint that a second run resumes from, and a test loss.
//   autoencoder [data_dir] [epochs] [batches_per_epoch (0: all)] [checkpoint]
#include <amp/amp.hpp>
#include <amp/data/loader.hpp>    // amp::data: IDX files and the batch loader
#include <amp/io/checkpoint.hpp>  // amp::io: checkpoints

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

namespace nn = amp::nn;
using P = amp::O2BF16Policy;  // the opt level: amp::O0Policy is plain fp32
using B = amp::host;          // amp::cuda: the same program on a GPU
using AutoEncoder = nn::Sequential<P, B, nn::Conv2d, nn::Conv2d, nn::Flatten, nn::Linear,  // the encoder,
                                   nn::Linear, nn::Unflatten, nn::ConvTranspose2d, nn::ReLU,  // the decoder
                                   nn::ConvTranspose2d>;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 5;
  const std::int64_t subset = argc > 3 ? std::stoll(argv[3]) : 0;
  const std::string checkpoint = argc > 4 ? argv[4] : "autoencoder.ckpt";

  const auto read = [&](const std::string& set) {  // images and their labels (10 classes)
    const std::string path = dir + "/" + set;
    return amp::data::read_idx_pair(path + "-images-idx3-ubyte.gz", path + "-labels-idx1-ubyte.gz", 10);
  };
  const auto train_set = read("train"), test_set = read("t10k");
  amp::Context<B> ctx;
  using Loader = amp::data::Loader<float, B>;  // batches [N, 28, 28, 1] of pixels / 255
  Loader train(ctx, train_set, {.batch_size = 64, .seed = 1, .layout = amp::data::Layout::image});
  Loader test(ctx, test_set, {.batch_size = 256, .shuffle = false, .layout = amp::data::Layout::image});
  const std::int64_t batches = subset > 0 ? std::min(subset, train.batches()) : train.batches();

  const auto relu = amp::activation::relu;
  AutoEncoder model(ctx, {.max_batch = 256, .seed = 1, .inputs = {{amp::Shape{28, 28, 1}}}},
      {.in_channels = 1, .out_channels = 16, .stride = 2, .padding = 1, .act = relu},   // 14 x 14 x 16
      {.in_channels = 16, .out_channels = 32, .stride = 2, .padding = 1, .act = relu},  // 7 x 7 x 32
      {}, {.in_features = 32 * 7 * 7, .out_features = 32},                              // the code: 32 values
      {.in_features = 32, .out_features = 32 * 7 * 7, .act = relu}, {.channels = 32, .height = 7, .width = 7},
      {.in_channels = 32, .out_channels = 16, .stride = 2, .padding = 1, .output_padding = 1}, {},  // 14 x 14
      {.in_channels = 16, .out_channels = 1, .stride = 2, .padding = 1, .output_padding = 1});      // 28 x 28
  amp::optim::AdamW<P, B> opt(model.parameters(), {.lr = 3e-3f});      // weight decay 0.01, as PyTorch's
  opt.set_schedule(amp::optim::CosineLR{.total_steps = epochs * batches});  // from lr to 0 over the run

  int first_epoch = 0;
  if (std::filesystem::exists(checkpoint)) {  // resume: model, optimizer, schedule and the loader's order
    const amp::io::Archive saved = amp::io::load(checkpoint, model, opt);
    first_epoch = static_cast<int>(saved.find("epoch")->values<std::int64_t>()[0]);
    train.set_state({saved.find("order")->values<std::int64_t>(), saved.find("rng")->text()});
    std::printf("resumed at epoch %d from %s\n", first_epoch, checkpoint.c_str());
  }
  for (int epoch = first_epoch; epoch < epochs; ++epoch) {
    model.train();
    train.start_epoch();
    float loss_value = 0, norm = 0;
    for (std::int64_t b = 0; b < batches; ++b) {
      const auto images = train.batch(b).x;
      auto loss = nn::mse_loss(ctx, model.forward(ctx, images), images);  // the input is the target
      opt.zero_grad();
      amp::scale_loss(loss, opt).backward();
      norm = opt.clip_grad_norm(1.0f);  // the gradients' norm before clipping
      opt.step();
      if (b + 1 == batches) loss_value = loss.item();
    }
    model.eval();
    double test_loss = 0;  // the mean over the test set
    for (std::int64_t b = 0; b < test.batches(); ++b) {
      const auto images = test.batch(b).x;
      test_loss += nn::mse_loss(ctx, model.forward(ctx, images), images).item() * images.shape[0];
    }
    std::printf("epoch %d: train loss %.4f  gradient norm %.3f  lr %.2e  test loss %.4f\n", epoch + 1,
                loss_value, norm, opt.lr(), test_loss / test.size());
    amp::io::Archive extra;  // what the resume needs besides model and optimizer
    const Loader::State order = train.state();
    extra.put_int64("epoch", {epoch + 1});
    extra.put_int64("order", order.order);
    extra.put_text("rng", order.rng);
    amp::io::save(checkpoint, model, opt, extra);
  }
}
