// For check_gpt2.py: a GPT2 at one level from weights in transformers'
// layout; writes its logits on a batch, the losses of AdamW steps on that
// batch, its weights exported in the same layout, and the logits after.
// usage: gpt2_tool LEVEL WEIGHTS IDS VOCAB POSITIONS LAYERS HEADS WIDTH BATCH TIME STEPS OUT_DIR
// IDS: int32, BATCH x (TIME + 1): inputs the first TIME columns, targets the last TIME.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <amp/transformer.hpp>
#include <amp/io/safetensors.hpp>

#include "common/levels.hpp"

namespace {
namespace nn = amp::nn;
using amp::host;

struct Job {
  std::string level, weights, ids, out;
  nn::GPT2Config config;
  std::int64_t batch = 0, time = 0, steps = 0;
};

template <class T>
void write_floats(const std::string& path, const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = amp::cast<float>(v[i]);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(4 * f.size()));
}

template <amp::Policy P>
void run(const Job& j) {
  using T = typename P::activation_type;
  amp::Context<host> ctx;
  nn::Model<P, host, nn::GPT2<P, host>> model(
      ctx, {.max_batch = j.batch, .seed = 1, .inputs = {nn::indices(amp::Shape{j.time})}}, j.config);
  const amp::io::TensorLayout hf = amp::io::hf_layout(model.net());
  amp::io::import_safetensors(j.weights, model.parameters(), hf);
  amp::optim::AdamW<P, host> opt(model.parameters(), {.lr = 1e-3f, .weight_decay = 0.1f},
                                 {.groups = {{.select = amp::optim::select::no_decay, .lr = {}, .weight_decay = 0.0f}}});
  std::vector<std::int32_t> all(static_cast<std::size_t>(j.batch * (j.time + 1)));
  std::ifstream(j.ids, std::ios::binary).read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(4 * all.size()));
  std::vector<std::int32_t> x, y;
  for (std::int64_t b = 0; b < j.batch; ++b)
    for (std::int64_t t = 0; t < j.time; ++t) {
      x.push_back(all[static_cast<std::size_t>(b * (j.time + 1) + t)]);
      y.push_back(all[static_cast<std::size_t>(b * (j.time + 1) + t + 1)]);
    }
  const amp::TensorView<const std::int32_t> xv(x.data(), amp::Shape{j.batch, j.time});
  const auto logits = [&](const char* name) {
    model.eval();
    auto out = model.forward(ctx, xv);
    write_floats(j.out + "/" + name, amp::download(ctx, amp::Span<const T>(out.value().data, static_cast<std::size_t>(out.rows() * out.cols()))));
    model.train();
  };
  logits("logits_before.bin");
  std::FILE* losses = std::fopen((j.out + "/losses.txt").c_str(), "w");
  for (std::int64_t s = 0; s < j.steps; ++s) {
    auto out = model.forward(ctx, xv);
    auto loss = nn::cross_entropy(ctx, out, amp::Span<const std::int32_t>(y.data(), y.size()));
    std::fprintf(losses, "%.9g\n", static_cast<double>(loss.item()));
    opt.zero_grad();
    amp::scale_loss(loss, opt).backward();
    opt.step();
  }
  std::fclose(losses);
  amp::io::export_safetensors(j.out + "/export.safetensors", model.parameters(), amp::io::dtype::fp32, hf);
  logits("logits_after.bin");
}
}  // namespace

int main(int argc, char** argv) try {
  AMP_REQUIRE(argc == 13, "usage: gpt2_tool LEVEL WEIGHTS IDS VOCAB POSITIONS LAYERS HEADS WIDTH BATCH TIME STEPS OUT_DIR");
  Job j{argv[1], argv[2], argv[3], argv[12], {}, std::stoll(argv[9]), std::stoll(argv[10]), std::stoll(argv[11])};
  j.config = {.vocab_size = std::stoll(argv[4]), .n_positions = std::stoll(argv[5]), .n_layer = std::stoll(argv[6]),
              .n_head = std::stoll(argv[7]), .n_embd = std::stoll(argv[8])};
  examples::with_policy(j.level, [&]<amp::Policy P>() { run<P>(j); });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gpt2_tool: %s\n", e.what());
  return 2;
}
