// row_ops: the memory bandwidth amp's row operations reach (backend/rows.hpp),
// on the CPU or the GPU: LayerNorm's forward (statistics and the normalised row
// in one pass) and its input gradient at GPT-2's width, and the fused
// classifier's row (softmax, loss and gradient in place) over GPT-2's
// 50257-wide vocabulary; the bias gradient's column sums (dy's columns over
// every token, added to a gradient: Linear's and LayerNorm's backward) and the
// embedding table's gradient (dy's rows grouped by token id, then summed per
// token into the table's rows; a quarter of the tokens are 8 frequent ids, as
// in text). Each op's figure is the bytes it must move (each input
// read once, each output written once) over its time, beside a copy of as many
// bytes: what the memory gives here. Issue 24's GPU target is LayerNorm's
// forward at width 768 over 16384 rows at >= 70% of the card's bandwidth.
// These are the functors the layers launch, timed alone: no graph, no tape.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <amp/amp.hpp>

#include "common/args.hpp"
#include "common/json.hpp"
#include "common/device.hpp"
#include "common/run.hpp"

namespace {

struct Row {
  std::string op, type, shape;
  double megabytes = 0, ms = 0, gb_per_s = 0, of_copy = 0;
};

template <class T>
struct CopyOp {
  const T* in;
  T* out;
  AMP_HOST_DEVICE void operator()(std::size_t i) const { out[i] = in[i]; }
};

// Seconds per call of f: two calls to warm up, then `repeat` timed between two syncs.
template <amp::Backend B, class F>
double seconds_per_call(amp::Context<B>& ctx, int repeat, F f) {
  f();
  f();
  ctx.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeat; ++i) f();
  ctx.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeat;
}

template <class T, amp::Backend B>
std::vector<Row> measure(amp::Context<B>& ctx, std::int64_t rows, std::int64_t width, std::int64_t vocab_rows,
                         std::int64_t vocab, int repeat) {
  namespace d = amp::nn::detail;
  const std::string type(amp::type_name<T>());
  const auto n = static_cast<std::size_t>(rows * width), t = sizeof(T);
  amp::Buffer<T, B> x(ctx, n, amp::memory_kind::activations), y(ctx, n, amp::memory_kind::activations),
      dy(ctx, n, amp::memory_kind::activations);
  amp::Buffer<float, B> stats(ctx, static_cast<std::size_t>(2 * rows), amp::memory_kind::activations),
      affine(ctx, static_cast<std::size_t>(2 * width), amp::memory_kind::weights);
  const auto values = [&](std::size_t count, std::uint32_t seed) {
    std::vector<T> v(count);
    std::uint32_t s = seed;
    for (auto& e : v) e = amp::cast<T>(static_cast<float>((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f);
    return v;
  };
  amp::upload(ctx, x.span(), values(n, 1));
  amp::upload(ctx, dy.span(), values(n, 2));
  amp::upload(ctx, affine.span(), std::vector<float>(static_cast<std::size_t>(2 * width), 1.0f));
  float* mean = stats.data();
  float* inv_std = stats.data() + rows;
  const float* gamma = affine.data();
  const float* beta = affine.data() + width;

  std::vector<Row> out;
  const std::string shape = std::to_string(rows) + " x " + std::to_string(width);
  const auto add = [&](std::string op, std::string shape_of, double bytes, double seconds) {
    out.push_back({std::move(op), type, std::move(shape_of), bytes / 1e6, seconds * 1e3, bytes / seconds / 1e9, 0});
  };
  const double copy_bytes = 2.0 * static_cast<double>(n * t);
  add("copy (library)", shape, copy_bytes, seconds_per_call(ctx, repeat, [&] { ctx.copy(y.data(), x.data(), n * t); }));
  add("copy (for_each)", shape, copy_bytes,
      seconds_per_call(ctx, repeat, [&] { amp::for_each(ctx, n, CopyOp<T>{x.data(), y.data()}); }));
  const auto r = static_cast<std::size_t>(rows);
  add("layernorm forward", shape, copy_bytes + 8.0 * static_cast<double>(rows + width),
      seconds_per_call(ctx, repeat, [&] {
        amp::for_each_row(ctx, r, width,
                          d::LayerNormForwardOp<float, T, float, true>{x.data(), y.data(), mean, inv_std, gamma, beta,
                                                                       width, 1e-5f});
      }));
  add("layernorm input gradient", shape, 1.5 * copy_bytes + 8.0 * static_cast<double>(rows) + 4.0 * width,
      seconds_per_call(ctx, repeat, [&] {
        amp::for_each_row(ctx, r, width,
                          d::LayerNormGradOp<float, T, float, true>{x.data(), dy.data(), y.data(), mean, inv_std,
                                                                    gamma, width, false});
      }));

  const auto logits_count = static_cast<std::size_t>(vocab_rows * vocab);
  amp::Buffer<T, B> logits(ctx, logits_count, amp::memory_kind::activations);
  amp::Buffer<std::int32_t, B> labels(ctx, static_cast<std::size_t>(vocab_rows), amp::memory_kind::activations);
  amp::Buffer<amp::nn::LossValue, B> losses(ctx, static_cast<std::size_t>(vocab_rows), amp::memory_kind::activations);
  std::vector<std::int32_t> label_values(static_cast<std::size_t>(vocab_rows));
  for (std::size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<std::int32_t>(i * 7919 % vocab);
  amp::upload(ctx, labels.span(), label_values);
  const auto fresh_logits = values(logits_count, 3);
  amp::upload(ctx, logits.span(), fresh_logits);
  add("fused classifier row", std::to_string(vocab_rows) + " x " + std::to_string(vocab),
      2.0 * static_cast<double>(logits_count * t), seconds_per_call(ctx, repeat, [&] {
        amp::for_each_row(ctx, static_cast<std::size_t>(vocab_rows), vocab,
                          d::FusedCrossEntropyOp<false, float, float, T>{logits.data(), labels.data(), vocab, nullptr,
                                                                         1.0f / static_cast<float>(vocab_rows),
                                                                         losses.data()});
      }));

  amp::Buffer<float, B> partial(ctx, amp::column_sum_partials(rows, width), amp::memory_kind::workspace);
  amp::Buffer<T, B> bias_grad(ctx, static_cast<std::size_t>(width), amp::memory_kind::grads);
  amp::fill(ctx, bias_grad.span(), amp::cast<T>(0.0f));
  add("bias gradient (column sums)", shape, static_cast<double>(n * t) + 2.0 * static_cast<double>(width) * t,
      seconds_per_call(ctx, repeat, [&] {
        amp::add_column_sums(ctx, rows, width, amp::detail::ValueAt<T>{dy.data(), width}, partial.data(), bias_grad.data());
      }));

  std::vector<std::int32_t> token_values(r);
  for (std::size_t i = 0; i < r; ++i)
    token_values[i] = static_cast<std::int32_t>(i % 4 == 0 ? i / 4 % 8 : i * 7919 % static_cast<std::size_t>(vocab));
  const std::size_t distinct = [&] {
    auto v = token_values;
    std::sort(v.begin(), v.end());
    return static_cast<std::size_t>(std::unique(v.begin(), v.end()) - v.begin());
  }();
  amp::Buffer<std::int32_t, B> tokens(ctx, r, amp::memory_kind::data), grouped(ctx, 3 * r + 2, amp::memory_kind::workspace);
  amp::upload(ctx, tokens.span(), token_values);
  amp::Buffer<std::byte, B> group_temp(ctx, amp::group_by_key_bytes(ctx, r), amp::memory_kind::workspace);
  const amp::KeyGroups groups{grouped.data(), grouped.data() + r, grouped.data() + 2 * r, grouped.data() + 3 * r + 1};
  amp::Buffer<T, B> table_grad(ctx, static_cast<std::size_t>(vocab * width), amp::memory_kind::grads);
  amp::fill(ctx, table_grad.span(), amp::cast<T>(0.0f));
  add("embedding grad: group ids", std::to_string(rows) + " ids", 4.0 * static_cast<double>(r) * 4,
      seconds_per_call(ctx, repeat, [&] { amp::group_by_key(ctx, tokens.data(), r, groups, group_temp.data()); }));
  add("embedding grad: sum rows", shape + " -> " + std::to_string(distinct),
      static_cast<double>(n * t) + 2.0 * static_cast<double>(distinct) * static_cast<double>(width) * t,
      seconds_per_call(ctx, repeat, [&] {
        d::add_embedding_grad(ctx, groups, dy.data(), r, vocab, width, table_grad.data());
      }));
  const double copy = std::max(out[0].gb_per_s, out[1].gb_per_s);
  for (auto& row : out) row.of_copy = row.gb_per_s / copy;
  return out;
}

std::string to_json(const std::string& device, const std::vector<Row>& rows) {
  examples::Json j;
  j.object().field("program", "row_ops").field("amp_version", AMP_VERSION_STRING).field("device", device);
  j.key("rows").array();
  for (const auto& r : rows)
    j.object()
        .field("op", r.op)
        .field("type", r.type)
        .field("shape", r.shape)
        .field("megabytes", r.megabytes)
        .field("ms", r.ms)
        .field("gb_per_s", r.gb_per_s)
        .field("of_copy", r.of_copy)
        .end();
  j.end().end();
  return j.str();
}

}  // namespace

int main(int argc, char** argv) try {
  examples::Args args("row_ops", "the memory bandwidth of amp's row operations (LayerNorm, the fused classifier, "
                                 "the bias and embedding gradients)");
  args.flag("device", "auto", "auto|cpu|cuda (auto: the GPU when one is present)", "DEVICE")
      .flag("threads", "0", "CPU threads (0: the idle cores)", "N")
      .flag("rows", "16384", "LayerNorm, bias and embedding gradient rows (tokens)", "N")
      .flag("width", "768", "their width (GPT-2 small: 768)", "N")
      .flag("vocab-rows", "256", "classifier rows", "N")
      .flag("vocab", "50257", "classifier width and embedding rows (GPT-2's vocabulary: 50257)", "N")
      .flag("repeat", "20", "timed calls per op", "N")
      .flag("csv", "", "write the table as CSV to FILE", "FILE")
      .flag("json", "", "write the table as JSON to FILE", "FILE");
  if (!args.parse(argc, argv)) return 0;
  const auto rows = args.integer("rows", 1, 1 << 24), width = args.integer("width", 1, 1 << 20);
  const auto vocab_rows = args.integer("vocab-rows", 1, 1 << 20), vocab = args.integer("vocab", 1, 1 << 24);
  const int repeat = static_cast<int>(args.integer("repeat", 1, 100000));
  const int threads = static_cast<int>(args.integer("threads", 0, 4096));
  const bool gpu = examples::use_gpu(args.str("device"));
  examples::Outputs outputs;
  outputs.add("--csv", args.str("csv"));
  outputs.add("--json", args.str("json"));

  std::vector<Row> table;
  std::string device;
  examples::with_context(gpu, threads, [&]<amp::Backend B>(amp::Context<B>& ctx) {
    device = examples::device_label(ctx);
    std::printf("row_ops on %s, %d timed calls each\n", device.c_str(), repeat);
    std::printf("%-28s %-6s %-22s %10s %10s %10s %8s\n", "op", "type", "shape", "MB moved", "ms", "GB/s", "of copy");
    const auto run = [&]<class T>() {
      for (const auto& r : measure<T>(ctx, rows, width, vocab_rows, vocab, repeat)) {
        std::printf("%-28s %-6s %-22s %10.1f %10.4f %10.1f %7.0f%%\n", r.op.c_str(), r.type.c_str(), r.shape.c_str(),
                    r.megabytes, r.ms, r.gb_per_s, 100.0 * r.of_copy);
        std::fflush(stdout);
        table.push_back(r);
      }
    };
    run.template operator()<float>();
    run.template operator()<amp::bfloat16>();
    if constexpr (std::is_same_v<B, amp::cuda>) run.template operator()<amp::half>();
  });
  outputs.write([&](const std::string& flag) {
    if (flag == "--json") return to_json(device, table);
    std::string csv = "device,op,type,shape,megabytes,ms,gb_per_s,of_copy\n";
    for (const auto& r : table)
      csv += device + "," + r.op + "," + r.type + "," + r.shape + "," + std::to_string(r.megabytes) + "," +
             std::to_string(r.ms) + "," + std::to_string(r.gb_per_s) + "," + std::to_string(r.of_copy) + "\n";
    return csv;
  });
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "row_ops: %s\n", e.what());
  return 1;
}
