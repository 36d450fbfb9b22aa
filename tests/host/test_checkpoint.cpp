// Checkpoints (exact resume, policy conversion, bad files, a writer killed
// mid-save) and safetensors export/import.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "amp/amp.hpp"
#include "support/policies.hpp"
#include "amp/io/checkpoint.hpp"
#include "amp/io/safetensors.hpp"
#include "support/files.hpp"
#include "support/reference.hpp"

using namespace amp;
using namespace amp::test;
using amp::host;

namespace {
namespace fs = std::filesystem;

// Weights, a norm with running statistics, dropout (the forward count matters) and Adam's two moments.
template <Policy P>
using Net = nn::Sequential<P, host, nn::Linear, nn::BatchNorm1d, nn::ReLU, nn::Dropout, nn::Linear>;

template <Policy P>
Net<P> make_net(Context<host>& ctx, std::uint64_t seed) {
  return Net<P>(ctx, {.max_batch = 16, .seed = seed}, {.in_features = 6, .out_features = 12}, {.features = 12}, {},
                {.p = 0.25f}, {.in_features = 12, .out_features = 3});
}

template <Policy P>
using Opt = optim::Adam<P, host>;
// A scaler that grows and backs off within a few steps, so its state matters.
constexpr ScalerConfig kScaler{.init_scale = 65536.0f, .growth_interval = 2};

struct Batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};
Batch batch(int step, bool overflow) {
  Batch b{random_values<float>(16 * 6, 100 + static_cast<std::uint32_t>(step), -2.0f, 2.0f), std::vector<std::int32_t>(16)};
  for (int r = 0; r < 16; ++r) b.y[r] = (r + step) % 3;
  if (step == 3 && overflow) b.x[5] = 1e6f;  // inf in fp16: the step is skipped and the scale backs off
  return b;
}

template <Policy P>
void train(Context<host>& ctx, Net<P>& net, Opt<P>& opt, int from, int to) {
  for (int step = from; step < to; ++step) {
    const Batch b = batch(step, P::loss_scaling == scaling::dynamic);
    auto y = net.forward(ctx, matrix<const float>(b.x.data(), 16, 6));
    auto loss = nn::cross_entropy(ctx, y, Span<const std::int32_t>(b.y.data(), b.y.size()));
    opt.zero_grad();
    scale_loss(loss, opt).backward();
    opt.step();
  }
}

// Every bit of the state a resume must restore, as bytes.
template <Policy P>
std::string state_bytes(Context<host>& ctx, Net<P>& net, Opt<P>& opt) {
  std::string out;
  auto add = [&](const auto& v) { out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(v[0])); };
  auto& store = net.parameters();
  auto role = [&](auto& group, auto r) {
    using S = typename std::remove_reference_t<decltype(group)>::stored_type;
    add(download(ctx, Span<const S>(group.values())));
    if constexpr (std::remove_reference_t<decltype(group)>::has_master) add(download(ctx, Span<const float>(group.master())));
    for (int k = 0; k < Opt<P>::state_buffers; ++k)
      add(download(ctx, Span<const float>(opt.template state_buffer<decltype(r)::value>(k))));
  };
  role(store.template arena<nn::role::weight>(), std::integral_constant<nn::role, nn::role::weight>{});
  role(store.template arena<nn::role::norm>(), std::integral_constant<nn::role, nn::role::norm>{});
  for (std::size_t i = 0; i < store.table().size(); ++i)
    if (store.table()[i].kind == nn::role::buffer) add(store.get_values(static_cast<int>(i)));
  const auto st = opt.state();
  const auto sc = opt.scaler().state();
  out += std::to_string(st.t) + " " + std::to_string(st.beta1_pow) + " " + std::to_string(st.beta2_pow) + " " +
         std::to_string(sc.scale) + " " + std::to_string(sc.growth_tracker) + " " + std::to_string(sc.steps) + " " +
         std::to_string(sc.skipped) + " " + std::to_string(opt.steps());
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("checkpoints: k steps, save, load into a fresh model, N-k steps = N steps straight, bit for bit", P,
                   O0Policy, O1Policy, O2Policy, O3Policy, O1BF16Policy, O2BF16Policy, AllFp8Policy, CurrentFp8Policy) {
  const std::string path = temp_path("resume.ckpt");
  Context<host> ctx;
  auto straight = make_net<P>(ctx, 7);
  Opt<P> straight_opt(straight.parameters(), {.lr = 0.01f}, {.scaler = kScaler});
  train<P>(ctx, straight, straight_opt, 0, 8);

  auto first = make_net<P>(ctx, 7);
  Opt<P> first_opt(first.parameters(), {.lr = 0.01f}, {.scaler = kScaler});
  train<P>(ctx, first, first_opt, 0, 5);
  io::Archive extra;
  extra.put_int64("epoch", {4});
  io::save(path, first, first_opt, extra);

  auto resumed = make_net<P>(ctx, 7);  // same seed: dropout masks follow the seed and the forward count
  Opt<P> resumed_opt(resumed.parameters(), {.lr = 0.01f}, {.scaler = kScaler});
  const io::Archive back = io::load(path, resumed, resumed_opt);
  CHECK(back.find("epoch")->values<std::int64_t>() == std::vector<std::int64_t>{4});
  CHECK(state_bytes(ctx, resumed, resumed_opt) == state_bytes(ctx, first, first_opt));
  train<P>(ctx, resumed, resumed_opt, 5, 8);
  CHECK(state_bytes(ctx, resumed, resumed_opt) == state_bytes(ctx, straight, straight_opt));
  if constexpr (P::loss_scaling == scaling::dynamic) CHECK(straight_opt.scaler().stats().skipped >= 1);  // the overflow happened
  std::remove(path.c_str());
}

TEST_CASE("checkpoints: policy conversion O0 -> O2 (masters = values, stored = rounded) and O2 -> O0 (from the masters)") {
  const std::string path = temp_path("convert.ckpt");
  Context<host> ctx;
  auto o0 = make_net<O0Policy>(ctx, 3);
  Opt<O0Policy> o0_opt(o0.parameters(), {.lr = 0.01f});
  train<O0Policy>(ctx, o0, o0_opt, 0, 2);
  io::save(path, o0, o0_opt);

  auto o2 = make_net<O2Policy>(ctx, 9);
  Opt<O2Policy> o2_opt(o2.parameters(), {.lr = 0.01f});
  io::load(path, o2, o2_opt);
  auto& w0 = o0.parameters().arena<nn::role::weight>();
  auto& w2 = o2.parameters().arena<nn::role::weight>();
  const auto values = download(ctx, Span<const float>(w0.values()));
  CHECK(download(ctx, Span<const float>(w2.master())) == values);
  const auto stored = download(ctx, Span<const half>(w2.values()));
  for (std::size_t i = 0; i < values.size(); ++i) REQUIRE(detail::bits(stored[i]) == detail::bits(cast<half>(values[i])));
  CHECK(download(ctx, Span<const float>(o2_opt.state_buffer<nn::role::weight>(1))) ==
        download(ctx, Span<const float>(o0_opt.state_buffer<nn::role::weight>(1))));
  CHECK(o2_opt.applied_steps() == 2);

  train<O2Policy>(ctx, o2, o2_opt, 2, 4);
  io::save(path, o2, o2_opt);
  auto back = make_net<O0Policy>(ctx, 11);
  Opt<O0Policy> back_opt(back.parameters(), {.lr = 0.01f});
  io::load(path, back, back_opt);
  CHECK(download(ctx, Span<const float>(back.parameters().arena<nn::role::weight>().values())) ==
        download(ctx, Span<const float>(w2.master())));
  CHECK(back.parameters().get_values(2) == o2.parameters().get_values(2));  // BatchNorm's weight
  std::remove(path.c_str());
}

TEST_CASE("checkpoints: a bad file gets an error naming it and what is wrong, and changes nothing") {
  const std::string path = temp_path("good.ckpt"), bad = temp_path("bad.ckpt");
  Context<host> ctx;
  auto net = make_net<O2Policy>(ctx, 3);
  Opt<O2Policy> opt(net.parameters(), {.lr = 0.01f});
  train<O2Policy>(ctx, net, opt, 0, 2);
  io::save(path, net, opt);
  const std::string good = read_bytes(path);

  auto target = make_net<O2Policy>(ctx, 5);
  Opt<O2Policy> target_opt(target.parameters(), {.lr = 0.01f});
  const std::string before = state_bytes(ctx, target, target_opt);
  auto refused = [&](const std::string& bytes, const char* message) {
    const std::string wanted = message;
    CAPTURE(wanted);
    write_bytes(bad, bytes);
    const std::string error = error_of([&] { io::load(bad, target, target_opt); });
    CAPTURE(error);
    CHECK(error.find(bad) != std::string::npos);
    CHECK(error.find(message) != std::string::npos);
    CHECK(state_bytes(ctx, target, target_opt) == before);
  };
  refused(good.substr(0, good.size() / 2), "truncated");
  refused(good.substr(0, 12), "truncated");
  std::string flipped = good;
  flipped[1] = 'X';
  refused(flipped, "bad magic");
  flipped = good;
  flipped[8] = 2;
  refused(flipped, "format version 2");
  flipped = good;
  flipped[good.find("param.0.weight") + 14 + 4 + 16 + 8 + 5] ^= 0x10;  // inside its payload
  refused(flipped, "CRC-32 mismatch");
  refused(good + "x", "1 bytes after its last record");

  // Well-formed archives that do not fit this model.
  io::Archive a = io::Archive::parse(good, path);
  io::Archive missing, extra = a, reshaped;
  for (const auto& [name, r] : a.records()) {
    if (name != "param.4.weight") missing.put(name, r.type, r.shape, r.payload.data(), r.payload.size());
    const auto shape = name == "param.0.bias" ? std::vector<std::uint64_t>{3, 4} : r.shape;
    reshaped.put(name, r.type, shape, r.payload.data(), r.payload.size());
  }
  refused(missing.serialize(), "has no tensor 'param.4.weight'");
  extra.put_int64("param.9.weight", {1});
  refused(extra.serialize(), "has tensor 'param.9.weight', which this model does not have");
  refused(reshaped.serialize(), "'param.0.bias' is fp16 of 2 dimensions that do not match the model's [12]");
  auto sgd_net = make_net<O2Policy>(ctx, 5);
  optim::SGD<O2Policy, host> sgd(sgd_net.parameters(), {.lr = 0.1f});
  CHECK_THROWS_WITH_AS(io::load(path, sgd_net, sgd), doctest::Contains("holds Adam optimizer state; this optimizer is SGD"),
                       Error);
  CHECK_THROWS_WITH_AS(io::load(temp_path("absent.ckpt"), target, target_opt), doctest::Contains("cannot open checkpoint"),
                       Error);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("checkpoints: a writer killed mid-save leaves the previous checkpoint whole") {
  const std::string path = temp_path("killed.ckpt"), next_path = temp_path("next.ckpt");
  Context<host> ctx;
  auto net = make_net<O0Policy>(ctx, 3);
  Opt<O0Policy> opt(net.parameters(), {.lr = 0.01f});
  auto extras = [](float fill) {  // ~8 MB, so the kill lands inside a write
    io::Archive a;
    const std::vector<float> filler(2'000'000, fill);
    a.put("filler", io::dtype::fp32, {filler.size()}, filler.data(), filler.size());
    return a;
  };
  io::save(next_path, net, opt, extras(2.5f));
  const std::string next = read_bytes(next_path);
  io::save(path, net, opt, extras(1.5f));
  const std::string original = read_bytes(path);
  const std::string temp_prefix = "." + fs::path(path).filename().string() + ".tmp-";
  int kept = 0, replaced = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // saves the next checkpoint over and over (no threads used after fork)
      const io::Archive a = extras(2.5f);
      for (;;) io::save(path, net, opt, a);
    }
    ::usleep(static_cast<useconds_t>(5'000 + 12'000 * attempt));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    const std::string now = read_bytes(path);
    REQUIRE((now == original || now == next));  // never a torn file
    (now == original ? kept : replaced) += 1;
    write_bytes(path, original);
    for (const auto& entry : fs::directory_iterator(fs::path(path).parent_path()))
      if (entry.path().filename().string().rfind(temp_prefix, 0) == 0) fs::remove(entry.path());  // the killed writer's
  }
  MESSAGE("8 writers killed: ", kept, " left the previous checkpoint, ", replaced, " a later whole one");
  std::remove(path.c_str());
  std::remove(next_path.c_str());
}

TEST_CASE_TEMPLATE("safetensors: export and import with PyTorch's names and layouts, in fp32, fp16 and bf16", P, O0Policy,
                   O2Policy, O1BF16Policy) {
  const std::string path = temp_path("weights.safetensors");
  Context<host> ctx;
  auto net = make_net<P>(ctx, 3);
  Opt<P> opt(net.parameters(), {.lr = 0.01f});
  train<P>(ctx, net, opt, 0, 2);
  const auto& table = net.parameters().table();
  std::vector<std::string> names;
  for (const auto& p : table) names.push_back(p.name + " " + p.shape.str());
  CHECK(names == std::vector<std::string>{"0.weight [12x6]", "0.bias [12]", "1.weight [12]", "1.bias [12]",
                                          "1.running_mean [12]", "1.running_var [12]", "1.num_batches_tracked []",
                                          "4.weight [3x12]", "4.bias [3]"});
  for (const io::dtype as : {io::dtype::fp32, io::dtype::fp16, io::dtype::bf16}) {
    CAPTURE(io::dtype_name(as));
    io::export_safetensors(path, net.parameters(), as);
    const std::string bytes = read_bytes(path);
    std::uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    CHECK(header % 8 == 0);
    CHECK(bytes.find("\"1.num_batches_tracked\": {\"dtype\": \"I64\", \"shape\": []") != std::string::npos);
    auto other = make_net<P>(ctx, 99);
    io::import_safetensors(path, other.parameters());
    for (std::size_t i = 0; i < table.size(); ++i) {
      CAPTURE(table[i].name);
      const auto want = net.parameters().get_values(static_cast<int>(i)), got = other.parameters().get_values(static_cast<int>(i));
      for (std::size_t k = 0; k < want.size(); ++k) {
        const float expected = table[i].kind == nn::role::buffer || as == io::dtype::fp32 ? want[k]
                               : as == io::dtype::fp16                                    ? cast<float>(cast<half>(want[k]))
                                                                                          : cast<float>(cast<bfloat16>(want[k]));
        // Exact for fp32 and the buffers; else one rounding, then the policy's own (the same or coarser).
        if (as == io::dtype::fp32 || table[i].kind == nn::role::buffer) REQUIRE(got[k] == want[k]);
        else REQUIRE(got[k] == doctest::Approx(expected).epsilon(8e-3));
      }
    }
  }
  CHECK(net.parameters().get_values(6) == std::vector<float>{2.0f});  // num_batches_tracked after two steps

  // Bad files: named, and nothing changes.
  auto target = make_net<P>(ctx, 5);
  const auto before = target.parameters().get_values(0);
  io::export_safetensors(path, net.parameters());
  const std::string good = read_bytes(path);
  auto refused = [&](const std::string& bytes, const char* message) {
    const std::string wanted = message;
    CAPTURE(wanted);
    write_bytes(path, bytes);
    const std::string error = error_of([&] { io::import_safetensors(path, target.parameters()); });
    CAPTURE(error);
    CHECK(error.find(path) != std::string::npos);
    CHECK(error.find(message) != std::string::npos);
    CHECK(target.parameters().get_values(0) == before);
  };
  refused(good.substr(0, 4), "truncated");
  refused(good.substr(0, good.size() - 4), "data offsets outside the file");
  std::string renamed = good;
  renamed.replace(renamed.find("\"4.bias\""), 8, "\"9.bias\"");
  refused(renamed, "has no tensor '4.bias'");
  std::string reshaped = good;
  reshaped.replace(reshaped.find("[12, 6]"), 7, "[6, 12]");
  refused(reshaped, "tensor '0.weight' has shape [6x12], the model [12x6]");
  std::string bad_json = good;
  bad_json[10] = '}';
  refused(bad_json, "safetensors file");
  std::remove(path.c_str());
}
