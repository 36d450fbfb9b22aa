// Checkpoint and safetensors cost for the demo's CNN (421k parameters, Adam):
// file size, save and load time (median of 7, to a temporary folder, fsync
// included), at O0 and O2. Built and run by bench/checkpoint_io.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <amp/amp.hpp>
#include <amp/io/checkpoint.hpp>
#include <amp/io/safetensors.hpp>

namespace {
template <amp::Policy P>
using Cnn = amp::nn::Sequential<P, amp::host, amp::nn::Conv2d, amp::nn::BatchNorm2d, amp::nn::ReLU, amp::nn::MaxPool2d,
                                amp::nn::Conv2d, amp::nn::BatchNorm2d, amp::nn::ReLU, amp::nn::MaxPool2d,
                                amp::nn::Flatten, amp::nn::Linear, amp::nn::Linear>;

template <class F>
double median_ms(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[3];
}

template <amp::Policy P>
void measure(const std::string& dir) {
  amp::Context<amp::host> ctx;
  Cnn<P> model(ctx, {.max_batch = 128, .seed = 1, .inputs = {{amp::Shape{28, 28, 1}}}},
               {.in_channels = 1, .out_channels = 32, .kernel = 3, .padding = 1}, {.features = 32}, {}, {.kernel = 2},
               {.in_channels = 32, .out_channels = 64, .kernel = 3, .padding = 1}, {.features = 64}, {}, {.kernel = 2},
               {}, {.in_features = 3136, .out_features = 128, .act = amp::activation::relu},
               {.in_features = 128, .out_features = 10});
  amp::optim::Adam<P, amp::host> opt(model.parameters(), {.lr = 1e-3f});
  const std::string ckpt = dir + "/cnn.ckpt", weights = dir + "/cnn.safetensors";
  const double save = median_ms([&] { amp::io::save(ckpt, model, opt); });
  const double load = median_ms([&] { amp::io::load(ckpt, model, opt); });
  const double exp = median_ms([&] { amp::io::export_safetensors(weights, model.parameters()); });
  const double imp = median_ms([&] { amp::io::import_safetensors(weights, model.parameters()); });
  std::printf("%-8s %10.2f %9.2f %9.2f %14.2f %9.2f %9.2f\n", std::string(amp::policy_name<P>()).c_str(),
              std::filesystem::file_size(ckpt) / 1048576.0, save, load, std::filesystem::file_size(weights) / 1048576.0,
              exp, imp);
}
}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  std::printf("demo CNN with Adam; times are medians of 7 runs in %s\n", dir.c_str());
  std::printf("%-8s %10s %9s %9s %14s %9s %9s\n", "level", "ckpt MiB", "save ms", "load ms", "safetensors MiB",
              "export ms", "import ms");
  measure<amp::O0Policy>(dir);
  measure<amp::O2Policy>(dir);
  measure<amp::O2BF16Policy>(dir);
}
